"""Both Colla experiments at smoke scale on real GeoLife devices (the notebooks' one smoke run each,
tests/smoke_runs.py): sane numbers, and saved results that hold aggregate metrics only (GeoLife's
license: no points, places or trajectories)."""

import json
import re

import numpy as np
import pandas as pd
import pytest

from ondevice.papers.colla import protocol
from smoke_runs import reading

COORDINATE_NAME = re.compile(r"lat|lng|lon|coord|geohash|cell|trajector|point", re.I)
# GeoLife's points lie mostly in and around Beijing; a non-integer value in these ranges could
# be a coordinate (our metrics are in [0, 1], counts are integers, seconds are small)
COORDINATE_RANGES = ((18.0, 54.0), (73.0, 136.0))


def coordinate_like(frame: pd.DataFrame) -> list[str]:
    """Columns whose name or values look like coordinates."""
    found = [c for c in frame.columns if COORDINATE_NAME.search(str(c))]
    for c in frame.select_dtypes("number").columns:
        if re.search(r"time|second", str(c), re.I):  # timings, which may be anything
            continue
        v = frame[c].dropna().to_numpy(float)
        fractional = v[np.abs(v - np.round(v)) > 1e-9]
        if any(((fractional >= lo) & (fractional <= hi)).any() for lo, hi in COORDINATE_RANGES):
            found.append(c)
    return found


def test_the_scan_catches_coordinates():
    assert coordinate_like(pd.DataFrame({"device": ["000"], "accuracy": [0.4]})) == []
    assert coordinate_like(pd.DataFrame({"latitude": [1]})) == ["latitude"]
    assert coordinate_like(pd.DataFrame({"x": [39.98412]})) == ["x"]
    assert coordinate_like(pd.DataFrame({"x": [116.3]})) == ["x"]


@pytest.fixture(scope="module", params=reading("colla", "colla_cost"))
def out(request, smoke_runs):
    """The folder of the notebook's one smoke run (tests/smoke_runs.py), as the runner saved it."""
    return smoke_runs(request.param).saved().out


def test_results_hold_aggregate_metrics_only(out):
    tables = sorted((out / "tables").glob("*.csv"))
    assert tables
    for path in tables:
        frame = pd.read_csv(path)
        assert coordinate_like(frame) == [], f"{out.name}/{path.name} has coordinate-like columns"
    run = json.loads((out / "run.json").read_text())
    text = json.dumps({k: run[k] for k in ("data", "notes", "headline", "params")})
    assert not re.search(r"\b(3\d|4\d)\.\d{4,}|\b1[01]\d\.\d{4,}", text), (
        f"{out.name}/run.json has a coordinate-like number"
    )
    assert not any(re.search(r"map|trajector|track", f) for f in run["figures"])


@pytest.mark.parametrize("out", reading("colla"), indirect=True)
def test_colla_numbers_are_sane(out):
    cycles = pd.read_csv(out / "tables" / "cycles.csv", dtype={"device": str})
    assert set(cycles.method) == {*protocol.METHODS, *protocol.BASELINES}
    assert cycles[["accuracy", "precision", "recall"]].stack().between(0, 1).all()
    np.testing.assert_allclose(cycles.recall, cycles.accuracy)  # weighted recall is accuracy
    summary = pd.read_csv(out / "tables" / "summary.csv")
    shares = summary.set_index("method")["best share"].dropna()
    assert shares.sum() == pytest.approx(1.0)
    groups = pd.read_csv(out / "tables" / "groups.csv")
    assert groups.groupby(["seed", "cycle"]).chosen.sum().le(1).all()
    run = json.loads((out / "run.json").read_text())
    assert run["notes"]["uploads"] == run["notes"]["devices"] * run["params"]["cycles"] * len(run["notes"]["seeds"])


@pytest.mark.parametrize("out", reading("colla_cost"), indirect=True)
def test_colla_cost_numbers_are_sane(out):
    costs = pd.read_csv(out / "tables" / "costs.csv")
    assert (costs["upload Customization"] < costs["upload Same-FC"]).all()
    assert (costs["upload Same-FC"] < costs["upload Same-Whole"]).all()
    assert (costs["flops Customization"] < costs["flops Same"]).all()
    on_device = pd.read_csv(out / "tables" / "on_device.csv")
    assert on_device.abs_difference.max() < 1e-4
    assert (out / "models" / "colla_client_update_trainable.tflite").stat().st_size > 10_000
    times = pd.read_csv(out / "tables" / "training_time.csv")
    assert (times.train_time_seconds > 0).all() and times.groupby("device").steps.nunique().eq(1).all()
