"""D3's personalization effect under our other protocols: the smoke run's saved results (the notebook's
one smoke run, tests/smoke_runs.py) and the conclusion's rule on a hand-made table."""

import numpy as np
import pandas as pd
import pytest

from ondevice.papers.deeptype import sensitivity
from ondevice.papers.deeptype.experiments import deeptype_top3eff_sensitivity as exp
from smoke_runs import reading


@pytest.fixture(scope="module", params=reading("deeptype_top3eff_sensitivity"))
def result(request, smoke_runs):
    return smoke_runs(request.param).saved()


def test_every_protocol_runs_on_every_test_user_and_switches_each_personal_choice_back_once(result):
    table, cost = result.tables["sensitivity"], result.tables["sensitivity_cost"].set_index("switched back")
    # the switches on the crowd model; the two that train a global model are deeptype_top3eff_global_sensitivity's
    assert result.params["sensitivity"] == ["fixed_epochs", "mean_loss_personal"]
    labels = [sensitivity.SWITCHES[s][0] for s in result.params["sensitivity"]]
    # smoke: the validation users' choice (Adam) is not the paper's configuration, so it runs
    assert list(table.protocol) == [sensitivity.MAIN, sensitivity.OTHER_READING, sensitivity.VALIDATION_CHOICE, *labels]
    assert table["ci low"].le(table["our change"]).all() and table["our change"].le(table["ci high"]).all()
    fixed = table.set_index("protocol").loc["fixed personal epochs, no per-user hold-out"]
    assert fixed.median_kept_epoch == result.params["personal_epochs"]  # no hold-out: every epoch is kept
    assert cost.from_cache.all()  # no switch here trains a global model
    users, split = result.tables["users"], result.artifacts["split.json"]
    assert users.groupby(["protocol", "seed", "user"]).size().eq(1).all()
    assert users.groupby("protocol").user.nunique().eq(len(split["test"])).all()
    # one crowd model scores every protocol
    start = users.pivot_table(index=["seed", "user"], columns="protocol", values="top_k_eff_global")
    assert (start[list(table.protocol)].nunique(axis=1) == 1).all()
    headline = result.headline
    assert {f"top-k-eff, personalized, {p}" for p in table.protocol} <= set(headline)


def test_the_step_size_is_chosen_as_top3effs_on_the_validation_users_own_lines(result):
    steps = result.tables["step_size"]
    assert len(steps) == 2 and steps.chosen.sum() == 1 and (steps.dose == 0).all()


def test_selection_on_validation_users_and_what_adam_moves(result):
    sel = result.tables["selection"]
    assert sel.chosen.sum() == 1 and sel.paper_config.sum() == 1
    tuned = result.notes["tuned_config"]
    assert sel[sel.chosen].iloc[0][["optimizer", "learning_rate", "epochs"]].tolist() == [
        tuned["optimizer"],
        tuned["learning_rate"],
        tuned["epochs"],
    ]
    # a fresh Adam state moves the softmax rows of words the user never typed, relative to the
    # rows of words they did type, far more than plain SGD does
    ratio = sel.assign(r=sel.unseen_row_shift / sel.seen_row_shift).groupby("optimizer").r.median()
    assert ratio["adam"] > 2 * ratio["sgd"]


def test_bad_parameters_name_the_field():
    from ondevice.params import ParameterError

    with pytest.raises(ParameterError, match="sensitivity"):
        exp.Params.for_scale("smoke", sensitivity=["fixed_epochs", "no_such_switch"])
    with pytest.raises(ParameterError, match="sgd_lr_grid"):
        exp.Params.for_scale("smoke", sgd_lr_grid=(0.0,))


def test_sensitivity_conclusion_names_the_protocols_that_change_the_verdict():
    table = pd.DataFrame(
        {
            "protocol": ["this protocol", "leaky crowd", "fixed personal epochs, no per-user hold-out"],
            "our change": [0.0, 0.001, -0.324],
            "ci low": [0.0, -0.002, -0.358],
            "ci high": [0.0, 0.004, -0.303],
            "verdict": ["within noise", "within noise", "does not hold"],
            "median_kept_epoch": [0.0, 0.0, 5.0],
        }
    )
    text = sensitivity.conclusion(table)
    assert text.startswith("**Under this protocol personalization is within noise** (+0.0% [+0.0%, +0.0%]);")
    assert "for the median user no personal epoch lowers the held-out loss" in text
    assert "**Changes the verdict:** fixed personal epochs, no per-user hold-out: -32.4% [-35.8%, -30.3%]" in text
    assert "Leave the verdict as it is: leaky crowd: +0.1% [-0.2%, +0.4%], within noise." in text
    assert np.isfinite(table["our change"]).all()
