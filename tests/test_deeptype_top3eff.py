"""D3/D5: the smoke run's saved results (the notebook's one smoke run, tests/smoke_runs.py) and the
stages' rules on hand-made inputs. That a second run, with its global models from the cache, gives
the same numbers is test_notebooks' re-run; here the on-device diagnostic's part in that."""

import shutil

import numpy as np
import pandas as pd
import pytest

from ondevice.papers.deeptype import planted, planted_condition, user_groups
from ondevice.papers.deeptype.experiments import deeptype_top3eff as exp
from smoke_runs import reading


@pytest.fixture(scope="module", params=reading("deeptype_top3eff"))
def smoke(request, smoke_runs):
    return smoke_runs(request.param)


@pytest.fixture(scope="module")
def result(smoke):
    return smoke.saved()


def test_the_run_trains_its_global_models_and_checks_the_first_users_steps_in_tflite(result):
    """The smoke run starts from an empty model cache; its on-device diagnostic ran (smoke:
    tflite_check_steps > 0) and agrees with TensorFlow, and the trainable model was exported."""
    assert not any(v for m in result.notes["global_models_from_cache"].values() for v in m.values())
    assert result.params["tflite_check_steps"] > 0 and len(result.tables["on_device"])
    assert np.all(result.tables["on_device"].abs_difference < 1e-4)
    assert (result.out / "models" / "deeptype_lstm_trainable.tflite").stat().st_size > 10_000


def test_a_second_run_finds_every_global_model_in_the_cache_and_can_skip_the_diagnostic(
    smoke, speeches, tmp_path, monkeypatch
):
    """With a copy of the smoke run's model cache, the global models of a second run all come from
    it (that they change no printed line or table: test_notebooks' re-run); at tflite_check_steps = 0
    the on-device diagnostic, the notebook's last stage before `conclude`, runs nothing."""
    shutil.copytree(smoke.models, tmp_path / "models")
    monkeypatch.setenv("ONDEVICE_MODEL_CACHE", str(tmp_path / "models"))
    params, quiet = exp.Params.for_scale("smoke", tflite_check_steps=0), lambda _: None
    corpora = exp.load_corpora(params, speeches, log=quiet)
    models = exp.train_globals(params, corpora, log=quiet)
    assert all(v for m in models.values() for v in m.from_cache.values())
    assert exp.on_device(params, corpora, models, log=quiet) == (None, None)


def test_one_row_per_user_condition_and_seed(result):
    users = result.tables["users"]
    split = result.artifacts["split.json"]
    assert set(users.condition) == set(exp.CONDITIONS)
    assert users.groupby(["seed", "user", "condition"]).size().eq(1).all()
    assert sorted(users.seed.unique()) == [0, 1] and set(users.user) == set(split["test"])
    assert set(users.user).isdisjoint(split["validation"])
    assert users.top_k_eff.between(0, 1).all()
    wide = users.pivot_table(index=["seed", "user"], columns="condition", values="steps")
    # the control trains five personal epochs of the median test user: the same steps for all, never 0
    # (the step count itself: test_deeptype_planted)
    control = wide[exp.CONTROL]
    assert control.nunique() == 1 and control.iloc[0] > 0 and control.iloc[0] % result.params["personal_epochs"] == 0
    assert (wide[exp.G_CROWD] == 0).all()
    trained = users[users.condition.isin([exp.P_CROWD, exp.P_FAR, exp.P_ONLY, exp.P_CROWD_DV, exp.P_FAR_DV])]
    assert (trained.steps_run > 0).all() and (trained.steps <= trained.steps_run).all()
    assert trained.kept_epoch.between(0, result.params["personal_epochs"]).all()
    assert ((trained.steps == 0) == (trained.kept_epoch == 0)).all()


def test_personal_training_keeps_the_epoch_of_the_lowest_holdout_loss(result):
    users, curves = result.tables["users"], result.tables["personal_curves"]
    keys = ["seed", "user", "condition"]
    personalized = {exp.P_CROWD, exp.P_FAR, exp.P_ONLY, exp.P_CROWD_DV, exp.P_FAR_DV}
    assert set(curves.condition) == personalized & set(users.condition)
    for key, curve in curves.groupby(keys):
        curve = curve.sort_values("epoch")
        assert list(curve.epoch) == list(range(len(curve)))  # epoch 0 (the start), then each epoch run
        kept = users.set_index(keys).loc[key, "kept_epoch"]
        assert kept == curve.epoch.iloc[int(np.argmin(curve.holdout_loss.to_numpy()))]
    kept = result.tables["kept_epochs"]
    assert kept.filter(like="epoch_").to_numpy().sum() == len(users.dropna(subset=["kept_epoch"]))
    overlap = result.tables["crowd_overlap"].set_index("global_text")
    assert overlap.loc["crowd", "global_users_in_a_test_users_group"] == 0  # the clean crowd
    assert overlap.share_found.between(0, 1).all()
    # one global model per corpus (global_seeds = 1): both seeds score the same global model
    g = users[users.condition.isin([exp.G_CROWD, exp.G_FAR])].pivot_table(
        index=["user", "condition"], columns="seed", values="top_k_eff"
    )
    assert (g[0] == g[1]).all()
    assert len(result.tables["global_model_cache"]) == 2
    # the far corpus has its own vocabulary, hence its own out-of-vocabulary rate on the same test words
    oov = users.pivot_table(index=["seed", "user"], columns="condition", values="test_oov_rate")
    assert (oov[exp.G_FAR] != oov[exp.G_CROWD]).all()


def test_effects_paper_numbers_and_groups(result):
    effects = result.tables["effects"]
    assert set(effects.effect) == {e.claim for e in exp.PAPER.effects}  # smoke: 1 user per D5 group, not judged
    assert effects.verdict.isin(["holds", "does not hold", "within noise"]).all()
    assert ((effects["ci low"] <= effects["our change"]) & (effects["our change"] <= effects["ci high"])).all()
    numbers = result.tables["paper_vs_ours"]
    assert len(numbers) == len(exp.PAPER.numbers) + len(exp.PAPER_GROUPS.numbers) and np.isfinite(numbers.ours).all()
    assert all(len(h["per_seed"]) == 2 and h["tolerance"] is not None for h in result.headline.values())
    groups = result.tables["groups"]
    assert groups.set_index(["group", "model"]).users.to_dict()[("light", "global")] == 1


@pytest.mark.parametrize("n, sizes", [(2, (1, 0, 1)), (4, (1, 2, 1)), (20, (5, 10, 5)), (7, (2, 3, 2))])
def test_user_groups_are_quartiles_by_training_words(n, sizes):
    users = pd.DataFrame({"user": [f"u{i}" for i in range(n)], "train_words": np.arange(n)[::-1] * 10})
    groups = user_groups.user_groups(users)
    assert tuple((groups == g).sum() for g in user_groups.GROUPS) == sizes
    assert groups["u0"] == "heavy" and groups[f"u{n - 1}"] == "light"


def test_step_size_readings_and_the_planted_control_in_the_rows_condition(result):
    steps = result.tables["step_size"]
    assert len(steps) == 2 and steps.chosen.sum() == 1 and (steps.dose == 0).all()  # the users' own lines only
    assert steps.kept_epoch_0.between(0, 1).all()
    users = result.tables["users"]
    for prefix, doses, (before, after) in (
        ("planted", "planted_doses", (exp.G_CROWD, exp.P_CROWD_DV)),
        ("planted_far", "planted_far_doses", (exp.G_FAR, exp.P_FAR_DV)),
    ):
        curve = result.tables[f"{prefix}_curve"].set_index("dose")
        assert list(curve.index) == list(result.params[doses]) and (curve.users == 2).all()
        # dose 0 is the rows the control vouches for: the same global and personalized (dynamic vocabulary) scores
        main = users[users.condition.isin([before, after])].groupby(["condition", "seed"]).top_k_eff.median()
        assert np.isclose(curve.loc[0.0, "top_k_eff_global"], main[before].mean())
        assert np.isclose(curve.loc[0.0, "top_k_eff_personal"], main[after].mean())
        assert (curve["ci low"] <= curve.gain).all() and (curve.gain <= curve["ci high"]).all()
        assert result.tables[f"{prefix}_verdict"].text.iloc[0].startswith("**Planted-signal control")
        # every planted personal model stopped on its held-out lines, as the rows' did
        planted_rows = result.tables[prefix]
        assert planted_rows[planted_rows.dose > 0].kept_epoch.notna().all()
        assert set(planted_rows.condition) == {after}  # the table names the condition it ran in


@pytest.mark.parametrize(
    "gains, tie, chosen",
    [
        ({"continued": 0.01, "restarted": 0.0}, 1e-3, "continued"),
        ({"continued": 0.0, "restarted": 0.01}, 1e-3, "restarted"),
        ({"continued": 0.0, "restarted": 0.0005}, 1e-3, "continued"),  # a tie: the reading fixed in advance
    ],
)
def test_the_step_size_rule_breaks_a_tie_by_the_fixed_reading_never_by_the_planted_control(gains, tie, chosen):
    from ondevice.papers.deeptype import reading_choice

    assert reading_choice.choose(gains, tie) == chosen


def test_bad_parameters_name_the_field():
    from ondevice.params import ParameterError

    with pytest.raises(ParameterError, match="personal_optimizer"):
        exp.Params.for_scale("smoke", personal_optimizer="rmsprop")
    with pytest.raises(ParameterError, match="personal_epochs"):
        exp.Params.for_scale("smoke", personal_epochs=0)
    with pytest.raises(ParameterError, match="planted_far_doses"):
        exp.Params.for_scale("smoke", planted_far_doses=(0.0, 0.25))  # without the fixed dose


def test_a_flagged_personalization_effect_is_diagnosed_with_its_kept_epochs():
    """The audit flags the crowd row (other sign) and not the far row (interval holds the paper's
    change): only the flagged row gets the measured line, under Table 1's section; the switched-back
    protocols are deeptype_top3eff_sensitivity's, read beside the row at publish."""
    row = lambda effect, paper, ours, low, high: {
        "effect": effect, "paper change": paper, "our change": ours, "ci low": low, "ci high": high,
        "diagnosis": "", "section": "",
    }  # fmt: skip
    effects = pd.DataFrame(
        [
            row("personalization raises top-k-eff (same-corpus crowd global model)", 0.099, -0.05, -0.08, -0.02),
            row("personalization raises top-k-eff (far-corpus global model)", 0.05, 0.04, 0.0, 0.09),
        ]
    )
    users = pd.DataFrame(
        {
            "seed": 0,
            "user": ["a", "b", "c", "d"] * 2,
            "condition": [exp.P_CROWD_DV] * 3 + [exp.P_FAR_DV] + [exp.G_CROWD] * 3 + [exp.G_FAR],
            "kept_epoch": [0, 0, 2, 1] + [np.nan] * 4,
            "top_k_eff": [0.5, 0.5, 0.45, 0.3, 0.5, 0.5, 0.5, 0.3],
        }
    )
    out = planted_condition.diagnose(effects, users, {})
    assert out.diagnosis[0] == (
        "in 2 of 3 user runs no personal epoch lowered the held-out loss; "
        "the 1 that trained changed top-k-eff by -10.0% (median)"
    )
    assert out.section[0] == planted_condition.KEPT_SECTION and out.diagnosis[1] == "" and effects.diagnosis[0] == ""


def test_a_passing_planted_control_names_the_data_and_a_failing_one_leaves_the_row_open():
    """The known answer decides who owns a flagged personalization effect: with the planted control
    of the row's own global model passed, the crowd row's cause is the data (the control's gain at
    the fixed dose, the words per user) and the far row's the words it adapts with; a control that
    failed, or ran on the other model only, leaves its row open."""
    row = lambda effect, paper, ours, low, high: {
        "effect": effect, "paper change": paper, "our change": ours, "ci low": low, "ci high": high,
        "diagnosis": "", "section": "",
    }  # fmt: skip
    effects = pd.DataFrame(
        [
            row("personalization raises top-k-eff (same-corpus crowd global model)", 0.099, 0.0, -0.01, 0.01),
            row("personalization raises top-k-eff (far-corpus global model)", 0.563, 0.08, 0.06, 0.13),
        ]
    )
    users = pd.DataFrame(
        {
            "seed": 0,
            "user": ["a", "b", "a", "b", "a", "b", "a", "b"],
            "condition": [exp.P_CROWD_DV] * 2 + [exp.P_FAR_DV] * 2 + [exp.G_CROWD] * 2 + [exp.G_FAR] * 2,
            "kept_epoch": [0, 1, 2, 1] + [np.nan] * 4,
            "top_k_eff": [0.5, 0.5, 0.4, 0.4, 0.5, 0.5, 0.3, 0.4],
            "train_words": [3000, 5000] * 4,
        }
    )
    curve = pd.DataFrame({"dose": [0.0, 0.5, 1.0], "gain": [0.0, 0.08, 0.2], "ci low": [0, 0.07, 0.18]})
    curve["ci high"] = curve.gain + 0.01
    passing = {"planted_curve": curve, "planted_verdict": pd.DataFrame([{"passes": True, "text": "x"}])}
    crowd_only = planted_condition.diagnose(effects, users, passing, 0.5)
    assert list(crowd_only["diagnosis kind"]) == ["data", "open"]  # the far row's model had no control
    passing |= {"planted_far_curve": curve, "planted_far_verdict": passing["planted_verdict"]}
    out = planted_condition.diagnose(effects, users, passing, 0.5)
    assert out.loc[0, "diagnosis kind"] == out.loc[1, "diagnosis kind"] == "data"
    assert out.diagnosis[0].startswith("the planted-signal control passes: personalization gains +0.080 [+0.070")
    assert (
        "median 4,000 personal training words" in out.diagnosis[0]
        and "in 1 of 2 user runs no personal epoch lowered" in out.diagnosis[0]
    )
    assert out.diagnosis[1].startswith("the far-corpus model adapts to a user's language from a median 4,000")
    assert "the planted-signal control on the far model passes (+0.080 [+0.070, +0.090] top-k-eff" in out.diagnosis[1]
    assert out.section[0] == out.section[1] == planted.SECTION
    failed = pd.DataFrame([{"passes": False, "text": "x"}])
    failing = passing | {"planted_verdict": failed, "planted_far_verdict": failed}
    out = planted_condition.diagnose(effects, users, failing, 0.5)
    assert out.loc[0, "diagnosis kind"] == out.loc[1, "diagnosis kind"] == "open"
    assert (
        out.diagnosis[0] == "in 1 of 2 user runs no personal epoch lowered the held-out loss; "
        "the 1 that trained changed top-k-eff by +0.0% (median)"
    )


def test_dynamic_vocabulary_rows_use_each_users_vocabulary(result):
    """The paper's personalized rows (with the user's vocabulary) beside the rows without it: the same
    lines, fewer test words <unk> with the user's vocabulary, exactly the counting table's rates."""
    users, oov = result.tables["users"], result.tables["dynamic_vocabulary"]
    assert {e.better for e in exp.PAPER.effects if "personal" in e.better} <= {
        f"top-k-eff, {c}" for c in (exp.P_CROWD_DV, exp.P_FAR_DV)
    }  # the paper's numbers are with the dynamic vocabulary (Sec. 4, Fig. 7)
    rate = users.pivot_table(index=["seed", "user"], columns="condition", values="test_oov_rate")
    words = users.pivot_table(index=["seed", "user"], columns="condition", values="train_words")
    for g, plain, dynamic, text in (
        (exp.G_CROWD, exp.P_CROWD, exp.P_CROWD_DV, "crowd"),
        (exp.G_FAR, exp.P_FAR, exp.P_FAR_DV, "bible"),
    ):
        assert (rate[plain] == rate[g]).all() and (rate[dynamic] <= rate[g]).all()
        assert (words[dynamic] == words[plain]).all()
        counted = oov[oov.global_text == text].set_index("user")
        for (_, user), r in rate.iterrows():
            assert np.isclose(r[g], counted.loc[user, "test_oov_global_vocab"])
            assert np.isclose(r[dynamic], counted.loc[user, "test_oov_user_vocab"])
    assert (oov.added_words > 0).all() and (oov.test_oov_user_vocab < oov.test_oov_global_vocab).any()
    assert (oov.min_count == result.params["dynamic_vocab_min_count"]).all()
    table = exp.paper_table(result.tables["summary"]).set_index("personalization")
    assert np.isfinite(table.loc[table.index.str.startswith("yes, with the dynamic"), "paper"]).all()


def test_a_word_the_swap_adds_is_suggested_with_the_users_vocabulary_and_unk_without(speeches):
    """A known answer, no training: a model whose softmax always ranks one reused id first saves the
    characters of the user's word at that id with the user's vocabulary, and none without it (<unk>
    is never suggested). The swap counts the personal training lines only, never the test lines."""
    from collections import Counter

    from ondevice.data.per_user_text import load_corpus
    from ondevice.data.typing_samples import UNK_ID
    from ondevice.metrics import top_k_eff
    from ondevice.models import lstm_lm
    from ondevice.papers.deeptype import own_vocab, protocol
    from ondevice.tasks import typing_protocol

    params = exp.Params.for_scale("smoke")
    corpus = load_corpus(params, speeches, log=lambda _: None)
    user = corpus.split.test[0]
    swap, (train, test) = own_vocab.user_swap(corpus, user, params), own_vocab.lines(corpus, user, params)
    typed, later = Counter(w for s in train for w in s), Counter(w for s in test for w in s)
    assert all(typed[w] >= params.dynamic_vocab_min_count for w in swap.added)
    only_later = [w for w, n in later.items() if n >= 2 and typed[w] < 2 and corpus.vocab.word_id(w) == UNK_ID]
    assert only_later and not set(only_later) & set(swap.added)  # frequent in the test lines alone: not added
    word = next(w for w in swap.added if later[w])
    slot = swap.ids[swap.added.index(word)]
    parts = own_vocab.parts({"crowd": corpus}, user, params)
    plain, dynamic = parts["crowd"][2], parts["crowd" + own_vocab.DYNAMIC][2]
    at = np.array([w == word for s in test for w in s])
    assert (plain.target[at] == UNK_ID).all() and (dynamic.target[at] == slot).all()
    flat, changed = [w for s in test for w in s], np.flatnonzero(plain.target != dynamic.target)
    assert all(flat[i] in swap.added or flat[i] in swap.replaced for i in changed)  # ids differ there only
    model = lstm_lm.build(typing_protocol.model_config(params, corpus), seed=1)
    softmax = model.get_layer("softmax")
    bias = softmax.bias.numpy()
    bias[slot] = 50.0
    softmax.bias.assign(bias)
    personal = protocol.Personal(params, model)
    saved = {
        n: top_k_eff(s.word_len[at], personal.score(model, s)["_chars"][at])
        for n, s in (("plain", plain), ("dynamic", dynamic))
    }
    assert saved["plain"] == 0.0 and saved["dynamic"] > 0.5
