"""D3's personalization effect with the crowd or the global regime switched back: the smoke run's
saved results (the notebook's one smoke run, tests/smoke_runs.py) and the conclusion on a hand-made table."""

import pandas as pd
import pytest

from ondevice.papers.deeptype import sensitivity
from ondevice.papers.deeptype.experiments import deeptype_top3eff_global_sensitivity as exp
from ondevice.params import ParameterError
from smoke_runs import reading


@pytest.fixture(scope="module", params=reading("deeptype_top3eff_global_sensitivity"))
def result(request, smoke_runs):
    return smoke_runs(request.param).saved()


def test_each_switch_trains_a_global_model_of_its_own_and_personalizes_every_test_user_from_it(result):
    table, cost = result.tables["sensitivity"], result.tables["sensitivity_cost"].set_index("switched back")
    labels = [sensitivity.SWITCHES[s][0] for s in exp.GLOBAL_SWITCHES]
    assert result.params["sensitivity"] == list(exp.GLOBAL_SWITCHES) == ["leaky_crowd", "adam_global"]
    assert list(table.protocol) == labels
    assert table["ci low"].le(table["our change"]).all() and table["our change"].le(table["ci high"]).all()
    assert not cost.from_cache.any()  # the run's model cache started empty: both global models trained here
    clean = result.tables["data"].set_index("role").loc["crowd", "users"]
    assert cost.loc[labels[0], "crowd_users"] > clean  # the leaky crowd has the set-apart roles again
    assert cost.loc[labels[1], "crowd_users"] == clean  # the Adam regime trains on the clean crowd
    users, split = result.tables["users"], result.artifacts["split.json"]
    assert users.groupby(["protocol", "seed", "user"]).size().eq(1).all()
    assert users.groupby("protocol").user.nunique().eq(len(split["test"])).all()
    # each switch scores its users from its own global model: the two starts differ
    start = users.pivot_table(index=["seed", "user"], columns="protocol", values="top_k_eff_global")
    assert (start[labels[0]] != start[labels[1]]).any()
    assert {f"top-k-eff, {w}, {p}" for p in labels for w in ("global", "personalized")} <= set(result.headline)


def test_the_step_size_is_chosen_as_top3effs_on_the_validation_users_own_lines(result):
    steps = result.tables["step_size"]
    assert len(steps) == 2 and steps.chosen.sum() == 1 and (steps.dose == 0).all()


def test_bad_parameters_name_the_field():
    for bad in ((), ("leaky_crowd", "no_such_switch")):
        with pytest.raises(ParameterError, match="sensitivity"):
            exp.Params.for_scale("smoke", sensitivity=bad)


def test_the_conclusion_gives_each_switchs_effect_from_the_table():
    table = pd.DataFrame(
        {
            "protocol": ["leaky crowd", "Adam global"],
            "our change": [0.012, -0.05],
            "ci low": [-0.002, -0.07],
            "ci high": [0.02, -0.03],
            "verdict": ["within noise", "does not hold"],
            "median_kept_epoch": [0.0, 2.0],
        }
    )
    text = exp.conclusion(table)
    assert text.startswith("**leaky crowd**: personalization is within noise (+1.2% [-0.2%, +2.0%]), median kept")
    assert "**Adam global**: personalization lowers top-k-eff (-5.0% [-7.0%, -3.0%]), median kept epoch 2." in text
