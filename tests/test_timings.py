"""The time breakdown reads papermill's per-cell durations and names each cell by its stage."""

import json
import os

import nbformat
import numpy as np
import pandas as pd

from ondevice.report import timings
from ondevice.training import model_cache


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
    run = {"notebook": {"at_once": {"notebooks": 2, "threads": 1}, "load_average": {"mean": 2.2, "max": 3.5}}}
    (tmp_path / "a" / "run.json").write_text(json.dumps(run))  # as the runner records it
    lines = []
    times = timings.report(tmp_path, log=lines.append)
    stored = pd.read_csv(tmp_path / "timings.csv")
    assert list(stored.stage) == ["import time", "train", "report", "load"]
    assert stored.seconds.sum() == 37.5 and set(stored.notebook) == {"a", "b"}
    assert len(times) == 4 and any(
        "a " in line and "0.6 min (cold 0.6)  (2 at once, 1 thread, load 2.2" in line for line in lines
    )
    assert list(stored.kind) == ["other", "other", "other", "other"]
    assert timings.kind_of("planted_control") == "control or sensitivity" and timings.kind_of("choose_rates") == (
        "screen or choice"
    )
    assert timings.kind_of("personalize") == "per-user training" and timings.kind_of("train_globals") == "global model"
    assert any(line.strip().startswith("[timings]   b") and line.endswith("min") for line in lines)  # no run.json
    assert f"{os.cpu_count()} cores" in lines[0]


def test_a_cells_model_cache_lines_give_the_training_it_did_and_the_entries_it_used(tmp_path, monkeypatch, capsys):
    """The lines the real model cache prints when it trains an entry and when it reuses one."""
    monkeypatch.setenv("ONDEVICE_MODEL_CACHE", str(tmp_path))
    clock = iter([10.0, 135.0])  # the training took 125 s
    monkeypatch.setattr(model_cache.time, "perf_counter", lambda: next(clock))
    train = lambda: ([np.zeros(2)], {})  # noqa: E731
    entry = model_cache.load_or_train("toy", {"a": 1}, [], "code", train).path.name
    trained = capsys.readouterr().out
    model_cache.load_or_train("toy", {"a": 1}, [], "code", train)
    reused = capsys.readouterr().out
    cell = lambda text: {"outputs": [{"output_type": "stream", "name": "stdout", "text": text}]}  # noqa: E731
    assert timings.cell_models(cell(trained)) == (125.0, {entry: 125.0})
    assert timings.cell_models(cell(reused)) == (0.0, {entry: 125.0})  # used, trained by an earlier run
    assert timings.cell_models(cell("[model cache] toy: trained in soon")) == (0.0, {})
    # waited while another process trained it (the line the cache prints on a held lock), then reused
    waited = f"[model cache] toy: another process is training {entry}; waiting for it\n" + reused
    assert timings.cell_models(cell(waited)) == (125.0, {entry: 125.0})
    executed(tmp_path / "w" / "w.ipynb", [("m = exp.train(p)", 100.0)])  # waited 100 s of the 125
    nb = nbformat.read(tmp_path / "w" / "w.ipynb", as_version=4)
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text=waited)]
    nbformat.write(nb, tmp_path / "w" / "w.ipynb")
    assert [r["trained_s"] for r in timings.notebook_stages(tmp_path / "w" / "w.ipynb")] == [100.0]  # capped
    (tmp_path / "w" / "w.ipynb").unlink()
    executed(tmp_path / "a" / "a.ipynb", [("m = exp.train(p)", 130.0), ("exp.report(m)", 1.5)])
    nb = nbformat.read(tmp_path / "a" / "a.ipynb", as_version=4)
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text=trained)]
    nbformat.write(nb, tmp_path / "a" / "a.ipynb")
    stored = timings.report(tmp_path, log=lambda _: None)
    assert list(stored.trained_s) == [125.0, 0.0] and list(stored.models) == [f"{entry}=125", ""]
    lines = []
    timings.report(tmp_path, log=lines.append)
    assert "95% training global models" in lines[0] and "a" in lines[1] and "95% training global models" in lines[1]
    assert "(cold 2.2)" in lines[1] and lines[2].strip() == "[timings]     by kind: global model 2.1 min, other 0.1 min"
    # a warm run's record: the same cell reused the entry; a cold run would have trained it again
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text=reused)]
    nbformat.write(nb, tmp_path / "a" / "a.ipynb")
    warm = timings.table(tmp_path)
    assert warm.trained_s.sum() == 0 and timings.cold_seconds(warm) == 131.5 + 125.0
