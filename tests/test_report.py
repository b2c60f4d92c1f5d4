import pandas as pd
import pytest

from ondevice.results import claims as report, record

PAPER = report.Paper("someone 2018", (report.PaperNumber("before", 0.5, "T1"), report.PaperNumber("after", 0.6, "T1")),
                     (report.Effect("training helps", "after", "before"),))


def test_paper_numbers_stand_beside_ours_and_effects_are_checked_not_assumed():
    numbers, effects = report.paper_vs_ours(PAPER, {"before": 0.40, "after": 0.38})
    assert list(numbers.paper) == [0.5, 0.6] and list(numbers.ours) == [0.40, 0.38]
    assert numbers["ours / paper"].tolist() == pytest.approx([0.8, 0.38 / 0.6])
    row = effects.iloc[0]
    assert bool(row["holds in paper"]) and not bool(row["holds in ours"])
    assert row["our change"] == pytest.approx(-0.05) and row["paper change"] == pytest.approx(0.2)
    with pytest.raises(KeyError, match="after"):
        report.paper_vs_ours(PAPER, {"before": 0.4})


def test_verdict_says_whether_the_effect_holds_by_how_much_and_names_stand_in_data():
    numbers, effects = report.paper_vs_ours(PAPER, {"before": 0.40, "after": 0.38})
    result = record.Result("x", {}, {"paper_vs_ours": numbers, "effects": effects}, [], "private logs.", 0.0)
    text = report.verdict(result)
    assert "does not hold" in text and "unlike the paper" in text and "-5.0%" in text and "+20.0%" in text
    assert "stand-in data" in text and "private logs." in text


def test_save_writes_everything_and_leaves_no_temporary_files(tmp_path):
    result = record.Result("x", {"scale": "smoke", "seed": 0}, {"t": pd.DataFrame({"a": [1]})}, [], None, 1.0,
                           models={"m.tflite": b"\x00\x01"})
    out = result.save(tmp_path / "out")
    assert (out / "tables" / "t.csv").read_text().strip() == "a\n1"
    assert (out / "models" / "m.tflite").read_bytes() == b"\x00\x01"
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
