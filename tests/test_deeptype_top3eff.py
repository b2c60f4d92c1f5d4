"""D3 at smoke scale, run twice in one process: the second run finds its global models in the
model cache, runs no TFLite diagnostic, and must still give exactly the same results."""
import numpy as np
import pandas as pd
import pytest

from ondevice.experiments import deeptype_top3eff as exp


@pytest.fixture(scope="module")
def two_runs(speeches, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ONDEVICE_MODEL_CACHE", str(tmp_path_factory.mktemp("models")))
        quiet = lambda _: None
        first = exp.run(exp.Params.for_scale("smoke"), speeches=speeches, log=quiet)
        second = exp.run(exp.Params.for_scale("smoke", tflite_check_steps=0), speeches=speeches, log=quiet)
    return first, second


def test_cached_global_models_and_no_diagnostics_change_no_result(two_runs):
    first, second = two_runs
    assert not any(first.notes["global_models_from_cache"].values())
    assert all(second.notes["global_models_from_cache"].values())
    assert "on_device" in first.tables and "on_device" not in second.tables
    timing = [c for c in first.tables["users"] if c.endswith("seconds")]
    pd.testing.assert_frame_equal(first.tables["users"].drop(columns=timing),
                                  second.tables["users"].drop(columns=timing), check_exact=True)
    pd.testing.assert_frame_equal(first.tables["effects"], second.tables["effects"], check_exact=True)


def test_results_carry_seeds_split_interval_verdict_and_tolerances(two_runs):
    result, _ = two_runs
    users = result.tables["users"]
    assert sorted(users.seed.unique()) == [0, 1] and users.groupby("seed").user.nunique().eq(2).all()
    assert set(users.user) == set(result.artifacts["split.json"]["test"])
    assert set(users.user).isdisjoint(result.artifacts["split.json"]["validation"])
    effect = result.tables["effects"].iloc[0]
    assert effect["verdict"] in ("holds", "does not hold", "within noise")
    assert effect["ci low"] <= effect["our change"] <= effect["ci high"] and effect["seeds"] == 2
    assert all(len(h["per_seed"]) == 2 and h["tolerance"] is not None for h in result.headline.values())
    selection = result.tables["selection"]
    assert selection.chosen.sum() == 1 and result.notes["personal_learning_rate"] in selection.learning_rate.values
    on_device = result.tables["on_device"]
    assert np.all(on_device.abs_difference < 1e-4)
