import json

import pandas as pd
import pytest

from ondevice.report import record


def test_save_writes_everything_and_leaves_no_temporary_files(tmp_path):
    result = record.Result(
        "x",
        {"scale": "smoke", "seed": 0},
        {"t": pd.DataFrame({"a": [1]})},
        [],
        None,
        1.0,
        models={"m.tflite": b"\x00\x01"},
        artifacts={"split.json": {"test": ["u1"]}},
        headline={"h": {"value": 1.0, "per_seed": [1.0], "tolerance": None, "resolution": 0.0}},
    )
    out = result.save(tmp_path / "out")
    assert (out / "tables" / "t.csv").read_text().strip() == "a\n1"
    assert (out / "models" / "m.tflite").read_bytes() == b"\x00\x01"
    assert json.loads((out / "split.json").read_text()) == {"test": ["u1"]}
    run = json.loads((out / "run.json").read_text())
    assert run["headline"]["h"]["value"] == 1.0 and run["artifacts"] == ["split.json"]
    assert (out / "run.json").stat().st_mode & 0o044  # readable by others: results are published
    assert not list(out.rglob(".*.tmp"))


def test_atomic_write_keeps_the_old_file_when_writing_fails(tmp_path):
    target = tmp_path / "run.json"
    target.write_text("old")

    def fail(path):
        path.write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError):
        record.atomic_write(target, fail)
    assert target.read_text() == "old" and list(tmp_path.iterdir()) == [target]
