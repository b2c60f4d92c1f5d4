"""The time breakdown reads papermill's per-cell durations and names each cell by its stage."""

import json
import os

import nbformat
import pandas as pd

from ondevice.report import timings


def executed(path, cells):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src) for src, _ in cells])
    for cell, (_, seconds) in zip(nb.cells, cells):
        cell.metadata["papermill"] = {"duration": seconds}
    path.parent.mkdir(parents=True)
    nbformat.write(nb, path)


def test_stage_is_the_first_experiment_call_of_a_cell():
    assert timings.stage_of("models = exp.train_globals(params, corpora)\nx = 1") == "train_globals"
    assert timings.stage_of("rows = exp.personalize(p)\nrows += exp.control(p, rows)") == "personalize"
    assert timings.stage_of("card = common.model_card(typing_protocol.build_model(p))") == "model_card"
    assert timings.stage_of("# Parameters\nscale = 'smoke'") == "scale = 'smoke'"
    assert timings.stage_of("%matplotlib inline\nimport time") == "%matplotlib inline"


def test_breakdown_per_notebook_and_stage_is_written_and_printed(tmp_path):
    executed(tmp_path / "a" / "a.ipynb", [("import time", 2.0), ("m = exp.train(p)", 30.0), ("exp.report(m)", 1.5)])
    executed(tmp_path / "b" / "b.ipynb", [("x = common.load(p)", 4.0)])
    (tmp_path / "c.failed").mkdir()  # a failed run's folder has no <name>/<name>.ipynb: not counted
    run = {"notebook": {"at_once": {"notebooks": 2, "threads": 1}}}
    (tmp_path / "a" / "run.json").write_text(json.dumps(run))  # as the runner records it
    lines = []
    times = timings.report(tmp_path, log=lines.append)
    stored = pd.read_csv(tmp_path / "timings.csv")
    assert list(stored.stage) == ["import time", "train", "report", "load"]
    assert stored.seconds.sum() == 37.5 and set(stored.notebook) == {"a", "b"}
    assert len(times) == 4 and any("a " in line and "0.6 min  (2 at once, 1 thread)" in line for line in lines)
    assert any(line.strip().startswith("[timings]   b") and line.endswith("min") for line in lines)  # no run.json
    assert f"{os.cpu_count()} cores" in lines[0]
