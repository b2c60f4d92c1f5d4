"""The run's time-left estimate (report/progress.py) from recorded stage times and a staged copy."""

import json
from datetime import datetime, timedelta, timezone

import pandas as pd

from ondevice.report.progress import Progress, cells_done, recorded, seconds_left


def _timings(scale_dir, rows):
    pd.DataFrame(rows, columns=["notebook", "cell", "stage", "seconds"]).to_csv(scale_dir / "timings.csv", index=False)


def _staged(scale_dir, name, statuses, start=None):
    """A half-executed copy as papermill leaves it: one status per code cell."""
    cells = []
    for status in statuses:
        meta = {"status": status}
        if status == "running":
            meta["start_time"] = start.isoformat()
        cells.append({"cell_type": "code", "metadata": {"papermill": meta}, "source": ""})
    staging = scale_dir / f".staging-{name}-123"
    staging.mkdir()
    (staging / f"{name}.ipynb").write_text(json.dumps({"cells": cells}))
    return staging / f"{name}.ipynb"


def test_time_left_counts_unfinished_cells_less_the_running_cells_elapsed_time(tmp_path):
    _timings(tmp_path, [("a", 0, "x", 10.0), ("a", 1, "y", 100.0), ("a", 2, "z", 50.0)])
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    copy = _staged(tmp_path, "a", ["completed", "running", "pending"], start=now - timedelta(seconds=30))
    finished, running_for = cells_done(copy, now=now)
    assert finished == {0} and running_for == 30.0
    assert seconds_left(recorded(tmp_path)["a"], (finished, running_for)) == 120.0  # 100 + 50 - 30
    # a running cell past its recorded time leaves no negative estimate
    assert seconds_left({0: 5.0}, (set(), 60.0)) == 0.0


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
