"""The run's time-left estimate (report/progress.py) from recorded stage times and a staged copy."""

import io
import json
import os
from datetime import datetime, timedelta, timezone

import pandas as pd

from ondevice.report.progress import PACE_BASIS_S, Progress, cells_done, pace, recorded, seconds_left

# results/default/timings.csv as the default run of 6602817 recorded it, two notebooks' rows
REAL = '''notebook,cell,stage,seconds
autlearn_accuracy,1,"scale = ""default""  # smoke | default | paper",0.019702
autlearn_accuracy,2,"scale = ""default""",0.005971
autlearn_accuracy,3,import time,2.267033
autlearn_accuracy,6,load,2.827589
autlearn_accuracy,8,pretrain,837.666456
autlearn_accuracy,10,choose_rates,105.442809
autlearn_accuracy,12,text_methods,1475.652345
autlearn_accuracy,14,image_methods,2342.640334
autlearn_accuracy,16,on_device,19.638702
autlearn_accuracy,18,users_table,1.08162
autlearn_accuracy,20,"figures[""training""] = report.plot_training(training)",0.433188
autlearn_accuracy,23,conclude,0.230633
autlearn_accuracy,25,"result.tables[""fedavg_ablation""].round(4)",0.105509
autlearn_accuracy,27,"saved = result.save(record.default_out_dir(exp.NAME, out_dir",0.902974
deeptype_online_latency,1,"scale = ""default""  # smoke | default | paper",0.008704
deeptype_online_latency,2,"scale = ""default""",0.003937
deeptype_online_latency,3,import time,1.862184
deeptype_online_latency,5,load_corpus,1.674427
deeptype_online_latency,7,correctness,12.290242
deeptype_online_latency,9,latency,16.494945
deeptype_online_latency,11,work_per_user,0.307608
deeptype_online_latency,13,conclude,0.153213
deeptype_online_latency,15,"result.tables[""cost_readings""].round(3)",0.010145
deeptype_online_latency,17,"saved = result.save(record.default_out_dir(exp.NAME, out_dir",0.298267
'''


def _timings(scale_dir, rows):
    pd.DataFrame(rows, columns=["notebook", "cell", "stage", "seconds"]).to_csv(scale_dir / "timings.csv", index=False)


def _staged(scale_dir, name, statuses, start=None, durations=None, folder=None, sources=None):
    """A half-executed copy as papermill leaves it: one status per cell, `durations` {cell index:
    seconds} of finished ones, `sources` {cell index: source} (`folder`: where, else a staging
    directory)."""
    cells = []
    for index, status in enumerate(statuses):
        meta = {"status": status}
        if status == "running":
            meta["start_time"] = start.isoformat()
        if status == "completed" and index in (durations or {}):
            meta["duration"] = durations[index]
        cells.append({"cell_type": "code", "metadata": {"papermill": meta}, "source": (sources or {}).get(index, "")})
    staging = scale_dir / (folder or f".staging-{name}-123")
    staging.mkdir()
    (staging / f"{name}.ipynb").write_text(json.dumps({"cells": cells}))
    return staging / f"{name}.ipynb"


def test_time_left_counts_unfinished_cells_less_the_running_cells_elapsed_time(tmp_path):
    _timings(tmp_path, [("a", 0, "x", 10.0), ("a", 1, "y", 100.0), ("a", 2, "z", 50.0)])
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    copy = _staged(
        tmp_path,
        "a",
        ["completed", "running", "pending"],
        start=now - timedelta(seconds=30),
        durations={0: 12},
        sources={0: "x", 1: "y", 2: "z"},
    )
    finished, running_for = cells_done(copy, now=now)
    assert finished == {("x", 0): 12.0} and running_for == 30.0
    assert seconds_left(recorded(tmp_path)["a"], (finished, running_for)) == 120.0  # 100 + 50 - 30
    # a running cell past its recorded time leaves no negative estimate
    assert seconds_left({("x", 0): 5.0}, (set(), 60.0)) == 0.0


def test_a_cell_added_since_the_recorded_run_shifts_no_other_cells_time(tmp_path):
    # recorded: load, train (x2), conclude; this run has a new `check` cell and a markdown cell first
    _timings(
        tmp_path, [("a", 1, "load", 5.0), ("a", 2, "train", 100.0), ("a", 3, "train", 50.0), ("a", 4, "conclude", 1.0)]
    )
    copy = _staged(
        tmp_path,
        "a",
        ["completed", "completed", "completed", "completed", "pending", "pending"],
        durations={0: 0.0, 1: 6.0, 2: 30.0, 3: 110.0},
        sources={0: "", 1: "load", 2: "check", 3: "train"},
    )
    finished, _ = cells_done(copy)
    assert finished[("load", 0)] == 6.0 and finished[("train", 0)] == 110.0 and ("check", 0) in finished
    assert seconds_left(recorded(tmp_path)["a"], (finished, 0.0)) == 51.0  # the second train + conclude


def test_overall_estimate_divides_notebooks_run_together_by_the_lanes(tmp_path):
    _timings(tmp_path, [("a", 0, "x", 600.0), ("b", 0, "x", 600.0), ("t", 0, "x", 120.0)])
    progress = Progress(tmp_path, ["a", "b", "new"], ["t"], at_once=2)
    line = progress.line()
    assert "0/4 notebooks done" in line and "about 12.0 min left" in line  # (600 + 600) / 2 + 120
    assert "not counting 1 with no recorded time" in line
    progress.finished("a")
    assert "1/4 notebooks done" in progress.line() and "about 7.0 min left" in progress.line()


def test_half_written_copy_and_missing_timings_give_no_estimate_rather_than_an_error(tmp_path):
    (tmp_path / "x.ipynb").write_text('{"cells": [')
    assert cells_done(tmp_path / "x.ipynb") is None
    assert recorded(tmp_path) == {}
    (tmp_path / "timings.csv").write_text("not,a\ntimings,file\n")
    assert recorded(tmp_path) == {}
    assert seconds_left(None, None) is None
    assert "no estimate" in Progress(tmp_path, [], ["x"], at_once=1).line()


def test_plan_lists_each_notebooks_recorded_time_from_a_real_timings_table(tmp_path):
    (tmp_path / "timings.csv").write_text(REAL)
    progress = Progress(tmp_path, ["autlearn_accuracy", "colla"], ["deeptype_online_latency"], at_once=2)
    plan = progress.plan()
    assert "autlearn_accuracy" in plan[0] and "79.8 min recorded (2 at a time)" in plan[0]  # 4,788.9 s
    assert "colla" in plan[1] and "no record" in plan[1]
    assert "0.6 min recorded (alone, afterwards)" in plan[2]  # 33.1 s
    # 4788.9 / 2 lanes + 33.1 s = 40.5 min; colla has no estimate and is said so
    assert "about 40.5 min in all" in plan[3] and "not counting 1 with no recorded time" in plan[3]
    alone = Progress(tmp_path, [], ["deeptype_online_latency", "colla"], at_once=1).plan()
    assert "0.6 min recorded (alone)" in alone[0] and "about 0.6 min in all" in alone[2]
    unknown = Progress(tmp_path, [], ["colla"], at_once=1).plan()
    assert unknown[1] == f"[progress] plan: no estimate: no recorded time in {tmp_path.name}/timings.csv"


def test_the_runs_pace_scales_what_is_left_once_enough_recorded_time_is_finished(tmp_path):
    """autlearn_accuracy ran in this run at twice its recorded cell times; the line then counts
    deeptype_online_latency's recorded 33.1 s as 66.2 s. Before enough recorded time is finished
    (a few set-up cells), the recorded times stand."""
    (tmp_path / "timings.csv").write_text(REAL)
    cells = recorded(tmp_path)
    ticks = iter([0.0, 600.0, 660.0])
    progress = Progress(tmp_path, [], ["autlearn_accuracy", "deeptype_online_latency"], 1, clock=lambda: next(ticks))
    first = progress.line()
    assert "0/2 notebooks done, 10.0 min elapsed" in first and "about 80.4 min left" in first  # 4788.9 + 33.1 s
    real = pd.read_csv(io.StringIO(REAL))
    ran = real[real.notebook == "autlearn_accuracy"]
    doubled = {c: 2 * s for c, s in zip(ran.cell, ran.seconds)}  # cells between them: markdown, no duration
    sources = dict(zip(ran.cell, ran.stage))  # each stage as its cell's source: stage_of gives it back
    _staged(
        tmp_path,
        "autlearn_accuracy",
        ["completed"] * 28,
        durations=doubled,
        folder="autlearn_accuracy",
        sources=sources,
    )
    progress.finished("autlearn_accuracy", ran=True)
    line = progress.line()
    assert "1/2 notebooks done, 11.0 min elapsed" in line and "about 1.1 min left" in line  # 2 x 33.1 s
    assert "recorded times x2.00, this run's pace over 14 finished cells" in line
    # the set-up cells alone (under PACE_BASIS_S of recorded time) set no pace
    setup = dict(list(cells["deeptype_online_latency"].items())[:4])  # its first four code cells
    assert sum(setup.values()) < PACE_BASIS_S
    assert pace(cells, {"deeptype_online_latency": {c: 10 * s for c, s in setup.items()}}) == (None, 4)
    # a cell papermill gave no duration (NaN) counts for neither side
    nan_and_one = {("pretrain", 0): float("nan"), ("text_methods", 0): 2951.3}
    assert pace(cells, {"autlearn_accuracy": nan_and_one})[0] == 2951.3 / 1475.652345


def test_a_notebook_skipped_or_failed_sets_no_pace(tmp_path):
    (tmp_path / "timings.csv").write_text(REAL)
    progress = Progress(tmp_path, ["autlearn_accuracy", "deeptype_online_latency"], [], at_once=1)
    progress.finished("autlearn_accuracy")  # skipped: its copy (were it there) is an earlier run's
    assert progress.ran == {} and "about 0.6 min left overall (recorded times," in progress.line()


def test_a_cold_run_counts_the_training_of_missing_global_models_once_and_a_warm_run_does_not(tmp_path):
    """a trained entry e (600 s) in its `train` cell, b reused it; the estimate adds e's training
    only while e is missing from the cache, once (a's cell: the first to use it), whichever run
    the record comes from."""
    rows = [("a", 1, "train", 700.0, 600.0, "e=600"), ("a", 2, "report", 5.0, 0.0, "")]
    rows += [("b", 1, "load", 50.0, 0.0, "e=600 f=30"), ("b", 2, "fit", 100.0, 0.0, "")]
    columns = ["notebook", "cell", "stage", "seconds", "trained_s", "models"]
    pd.DataFrame(rows, columns=columns).to_csv(tmp_path / "timings.csv", index=False)
    assert recorded(tmp_path)["a"] == {("train", 0): 100.0, ("report", 0): 5.0}  # the warm part
    for cache, total in (({"e", "f"}, 255.0), ({"f"}, 855.0), (set(), 885.0)):
        progress = Progress(tmp_path, [], ["a", "b"], at_once=1)
        progress.cached = lambda entry, cache=cache: entry in cache
        plan = progress.plan()
        assert f"about {total / 60:.1f} min in all" in plan[-1]
        assert ("training global models not in the cache" in plan[0]) == ("e" not in cache)
    # a finished cell of this run that trained a model counts for the pace without that training
    trained = "[model cache] toy: trained in 600s, stored in /cache/e\n"
    staged = _staged(tmp_path, "a", ["completed", "running"], datetime.now(timezone.utc), {0: 700.0})
    nb = json.loads(staged.read_text())
    nb["cells"][0]["source"], nb["cells"][0]["outputs"] = (
        "exp.train(p)",
        [{"output_type": "stream", "name": "stdout", "text": trained}],
    )
    staged.write_text(json.dumps(nb))
    assert cells_done(staged)[0] == {("train", 0): 100.0}


def test_a_cell_that_read_its_results_back_from_a_stage_file_sets_no_pace(tmp_path):
    """A resumed run reads finished stages back in a second (engine.stage): against their recorded
    105 s and 1,476 s that would read as a pace of x0.01 and shrink every estimate."""
    (tmp_path / "timings.csv").write_text(REAL)
    path = _staged(
        tmp_path,
        "autlearn_accuracy",
        ["completed", "completed", "running"],
        start=datetime.now(timezone.utc),
        durations={0: 1.0, 1: 1.5},
        sources={0: "choose_rates", 1: "text_methods", 2: "image_methods"},
    )
    nb = json.loads(path.read_text())
    back = "[stage] choose_rates: read back from /x/stage-choose_rates.pkl (this run's inputs and code)\n"
    nb["cells"][0]["outputs"] = [{"output_type": "stream", "name": "stdout", "text": [back]}]
    nb["cells"][1]["outputs"] = [{"output_type": "stream", "name": "stdout", "text": ["LSTM: FedAvg round 1\n"]}]
    path.write_text(json.dumps(nb))
    finished, _ = cells_done(path)
    assert finished[("choose_rates", 0)] != finished[("choose_rates", 0)]  # NaN: read back
    assert finished[("text_methods", 0)] == 1.5
    assert pace(recorded(tmp_path), {"autlearn_accuracy": finished}) == (1.5 / 1475.652345, 1)


def test_the_plan_names_the_cells_a_notebook_has_now_that_its_record_lacks(tmp_path):
    """REAL was recorded before autlearn_accuracy gained its FedAvg, CloudTrain and CloudCustomize choices, its
    resolution curve and its IID control's figure: the plan says it does not count those five cells, and nothing
    for a notebook whose
    cells all have a record; and that the record is of other code when the stored result's
    fingerprint is not the notebook's now."""
    from pathlib import Path

    from ondevice.report.provenance import fingerprint

    (tmp_path / "timings.csv").write_text(REAL)
    notebook = Path(__file__).parents[1] / "notebooks" / "autlearn" / "autlearn_accuracy.ipynb"
    progress = Progress(tmp_path, [], ["autlearn_accuracy"], 1, sources={"autlearn_accuracy": notebook})
    new = progress.new["autlearn_accuracy"]
    assert [n for _, n in new] == [0, 0, 0, 0, 0] and "fedavg_baseline.choose_all(" in new[0][0]
    assert "cloud_choice.choose_all(" in new[1][0] and "choose_customize" in new[2][0]
    assert "feature_resolution.curve(" in new[3][0] and "plot_control(" in new[4][0]
    assert "; not counting 5 cell(s) added since the record (fedavg, fedavg_rates = " in progress.plan()[0]
    assert "(on code changed since)" not in progress.plan()[0]  # no stored result to compare with
    stored = tmp_path / "autlearn_accuracy" / "run.json"
    stored.parent.mkdir()
    for code, changed in ((fingerprint(notebook), False), ("0" * 64, True)):
        stored.write_text(json.dumps({"notebook": {"key": {"fingerprint": code}}}))
        again = Progress(tmp_path, [], ["autlearn_accuracy"], 1, sources={"autlearn_accuracy": notebook})
        assert ("79.8 min recorded (on code changed since)" in again.plan()[0]) == changed
    copy = tmp_path / "copy.ipynb"
    nb = json.loads(notebook.read_text())
    nb["cells"] = [c for c in nb["cells"] if "choose_all" not in "".join(c["source"])]
    nb["cells"] = [c for c in nb["cells"] if "choose_customize" not in "".join(c["source"])]
    nb["cells"] = [c for c in nb["cells"] if "plot_control" not in "".join(c["source"])]
    nb["cells"] = [c for c in nb["cells"] if "feature_resolution.curve" not in "".join(c["source"])]
    copy.write_text(json.dumps(nb))
    assert Progress(tmp_path, [], ["autlearn_accuracy"], 1, sources={"autlearn_accuracy": copy}).new == {
        "autlearn_accuracy": []
    }
    assert "not counting" not in Progress(tmp_path, [], ["autlearn_accuracy"], 1, sources={}).plan()[0]


def test_a_notebook_this_run_left_failed_is_counted_as_failed_not_done(tmp_path):
    """The runner marks a failure by results/<scale>/<name>.failed/; one left by an earlier run
    (older than this run) does not make a skipped notebook failed."""
    (tmp_path / "timings.csv").write_text(REAL)
    progress = Progress(tmp_path, [], ["autlearn_accuracy", "deeptype_online_latency"], at_once=1)
    for name, when in (("autlearn_accuracy", progress.began_at + 5), ("deeptype_online_latency", 0)):
        (tmp_path / f"{name}.failed").mkdir()
        (tmp_path / f"{name}.failed" / "run.json").write_text("{}")
        os.utime(tmp_path / f"{name}.failed" / "run.json", (when, when))
    progress.finished("autlearn_accuracy")
    assert "[progress] 0/2 notebooks done, 1 failed, " in progress.line()
    progress.finished("deeptype_online_latency")  # skipped, beside an earlier run's failure
    assert "[progress] 1/2 notebooks done, 1 failed, " in progress.line()
