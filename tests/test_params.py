import dataclasses

import pytest

from ondevice.data import per_user_text
from ondevice.papers.deeptype.experiments import deeptype_top3eff_sensitivity as exp
from ondevice.params import ParameterError, Params


def test_presets_exist_for_every_scale_and_validate():
    for scale in ("smoke", "default", "paper"):
        p = exp.Params.for_scale(scale)
        assert p.scale == scale and p.k == 3
    assert exp.Params.for_scale("paper").vocab_size == 20000  # the paper's vocabulary
    assert exp.Params.for_scale("paper").personal_epochs == 5  # and its protocol
    assert exp.Params.for_scale("paper").seeds >= 3


@pytest.mark.parametrize(
    "kwargs,names",
    [
        (dict(vocab_sise=10), "vocab_sise"),
        (dict(k=0), "'k'"),
        (dict(test_users=0), "'test_users'"),
        (dict(personal_train_fraction=1.0), "'personal_train_fraction'"),
        (dict(k="3"), "'k' must be int"),
        (dict(global_learning_rate=-1), "'global_learning_rate'"),
        (dict(sgd_lr_grid=[1e-3, -1]), "'sgd_lr_grid'"),
        (dict(sgd_lr_grid=0.1), "'sgd_lr_grid' must be a list"),
        (dict(optimizer="rmsprop"), "'optimizer'"),
        (dict(validation_users=0), "'validation_users'"),  # a grid needs validation users
    ],
)
def test_bad_parameters_name_the_parameter(kwargs, names):
    with pytest.raises(ParameterError, match=names):
        exp.Params.for_scale("smoke", **kwargs)


def test_unknown_scale():
    with pytest.raises(ParameterError, match="'scale'"):
        exp.Params.for_scale("huge")


def test_int_is_accepted_for_float_fields_and_lists_for_grids():
    assert exp.Params.for_scale("smoke", global_learning_rate=1).global_learning_rate == 1.0
    assert exp.Params.for_scale("smoke", sgd_lr_grid=[1, 0.5]).sgd_lr_grid == (1.0, 0.5)


def test_from_notebook_takes_direct_fields_and_overrides_and_rejects_unknown_names():
    ns = {
        "scale": "smoke",
        "seed": 3,
        "k": 5,
        "overrides": {"vocab_size": 900},
        "out_dir": "",
        "exp": exp,
        "In": [],
        "_i1": "",
    }
    p = exp.Params.from_notebook(ns)
    assert (p.seed, p.k, p.vocab_size) == (3, 5, 900)
    assert p.seed_list == [3, 4]
    with pytest.raises(ParameterError, match="hidden_unitz"):
        exp.Params.from_notebook({**ns, "hidden_unitz": 4})
    with pytest.raises(ParameterError, match="both directly"):
        exp.Params.from_notebook({**ns, "vocab_size": 800})


def test_impossible_user_split_is_a_parameter_error(speeches):
    p = exp.Params.for_scale("smoke", test_users=500, test_min_words=3000)
    with pytest.raises(ParameterError, match="test_users"):
        per_user_text.load_corpus(p, speeches=speeches, log=lambda _: None)


# ---- groups: a field that is itself a frozen dataclass ----------------------------------------


@dataclasses.dataclass(frozen=True)
class Habits:
    bedtime: float = 23.5
    wake: float = 7.5
    phones: tuple[str, ...] = ("a", "b")


@dataclasses.dataclass(frozen=True)
class Grouped(Params):
    days: int = 7
    habits: Habits = Habits()
    PRESETS = {"smoke": dict(days=2, habits=dict(bedtime=22.0)), "default": {}}

    def check(self) -> None:
        self.require(self.habits.wake < 12, "habits.wake", "must be a morning hour")


def test_a_group_takes_its_preset_and_overrides_name_by_name():
    p = Grouped.for_scale("smoke", habits={"wake": 8})  # an int for a float field, as JSON gives it
    assert p.habits == Habits(bedtime=22.0, wake=8.0) and isinstance(p.habits.wake, float)
    assert Grouped.for_scale("default").habits == Habits()
    assert Grouped.for_scale("smoke", habits=Habits(wake=6.0)).habits == Habits(wake=6.0)  # an instance replaces
    assert Grouped.for_scale("smoke").to_dict()["habits"] == {"bedtime": 22.0, "wake": 7.5, "phones": ("a", "b")}
    assert Grouped.for_scale("smoke", habits={"phones": ["x"]}).habits.phones == ("x",)


@pytest.mark.parametrize(
    "override,message",
    [
        ({"habits": {"bedtme": 22.0}}, r"unknown parameter\(s\) \['bedtme'\] in 'habits' \(Habits\); known: "),
        ({"habits_bedtime": 22.0}, r"unknown parameter\(s\) \['habits_bedtime'\]"),
        ({"habits": {"wake": "early"}}, r"'habits\.wake' must be float"),
        ({"habits": 22.0}, r"'habits' must be a dict of Habits fields"),
        ({"habits": {"wake": 13.0}}, r"'habits\.wake' must be a morning hour, got 13\.0"),
    ],
)
def test_a_bad_group_parameter_names_the_group_and_the_field(override, message):
    with pytest.raises(ParameterError, match=message):
        Grouped.for_scale("smoke", **override)
