"""D4 at smoke scale. The notebook's one smoke run (tests/smoke_runs.py), read back from its files:
the rows of every condition, the nested personal data, the public (Sent140) start beside the shared
crowd model, and the planted control's tables at both sizes. Then, in this process with a spy on
`protocol.personalize`, the personalization stage (one seed, the first test user of each start) and
the planted control (one seed) again from the run's global models (a copy of its model cache: no
global model trains here): personal training with and without the dynamic vocabulary starts from the
same global weights and sees the same batches, and the control trains only its planted doses."""

import shutil

import numpy as np
import pandas as pd
import pytest

from ondevice.data import per_user_text
from ondevice.papers.deeptype import common, personal_sizes, planted, protocol, starts
from ondevice.papers.deeptype.experiments import deeptype_personal_data as exp
from ondevice.papers.deeptype.techniques import dynamic_vocab
from ondevice.params import ParameterError
from ondevice.tasks import typing_protocol
from smoke_runs import reading


class Shared(typing_protocol.DeepTypeParams):
    """Only the fields every DeepType notebook shares, at their shared presets."""

    PRESETS = typing_protocol.PRESETS


@pytest.fixture(scope="module", params=reading("deeptype_personal_data"))
def smoke(request, smoke_runs):
    return smoke_runs(request.param)


@pytest.fixture(scope="module")
def result(smoke):
    return smoke.saved()


@pytest.fixture(scope="module")
def run(smoke, result, speeches, tmp_path_factory):
    """The stages again with the spy, from the smoke run's global models; returns the calls of the
    personalization stage and of the planted control apart."""
    calls = []
    real = protocol.personalize

    def spy(trainer, weights, data, params, rng, *args, **kwargs):
        calls.append({"weights": weights, "data": data, "rng": rng.bit_generator.state, "params": params} | kwargs)
        return real(trainer, weights, data, params, rng, *args, **kwargs)

    cache, quiet = tmp_path_factory.mktemp("models") / "cache", lambda _: None
    shutil.copytree(smoke.models, cache)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ONDEVICE_MODEL_CACHE", str(cache))
        params = exp.Params.for_scale("smoke", seeds=1)
        corpora = starts.load(params, speeches, quiet)
        models = starts.train(params, corpora, quiet)
        assert all(v for m in models.values() for v in m.from_cache.values())
        # the shared fields alone find the very same global model in the cache
        plain = Shared.for_scale("smoke", seeds=1)
        corpus = per_user_text.load_corpus(plain, speeches, log=quiet)
        shared = common.train_global(plain, corpus, log=quiet)
        public = per_user_text.load_corpus(plain, speeches, log=quiet, global_text="sent140")
        public_models = common.train_global(plain, public, log=quiet)
        mp.setattr(protocol, "personalize", spy)
        first_user = lambda p, c, m, log: exp._Personal(p, c, m).user(c.split.test[0], p.seed)  # noqa: E731
        starts.each(params, corpora, models, first_user, quiet)
        personal, calls[:] = list(calls), []
        users = result.tables["users"]  # the main rows the control's dose 0 is, of the run's first seed
        swaps, swap = [], dynamic_vocab.swap
        mp.setattr(dynamic_vocab, "swap", lambda *a: swaps.append(a) or swap(*a))
        personal_sizes.planted_control(
            params, starts.main(corpora), starts.main(models), users[users.seed == params.seed], quiet
        )
    return params, personal, list(calls), shared, corpus, (public, public_models), swaps


def test_one_row_per_user_and_condition_with_nested_personal_data(result, run):
    _, _, _, _, corpus, _, _ = run
    params, users = result.params_as(exp.Params), result.tables["users"]
    expected = {"G-M"} | {exp.condition(f, d) for f in params.data_fractions for d in (True, False)}
    assert set(users.condition) == expected | {f"P-M {f}{exp.ALSO}" for f in ("50%", "100%")}
    assert len(exp.paper_conditions(users).condition.unique()) == len(expected)
    assert users.groupby(["seed", "user", "condition"]).size().eq(1).all()
    assert set(users.user) == set(corpus.split.test) and users.seed.nunique() == params.seeds
    for (_, user), rows in users.groupby(["seed", "user"]):
        words = rows.set_index("condition").train_words
        assert 0 < words["P-M 25%"] < words["P-M 50%"] < words["P-M 100%"]
        # the training lines less the held-out ones (the same for every size), as top3eff splits them
        assert words["P-M 100%"] == words["P-M* 100%"] == len(corpus.personal_parts(user, params)[0])
        assert rows.test_words.nunique() == 1
    assert users.top_k_eff.between(0, 1).all()


def test_oov_shares_before_and_after_the_swap(result):
    users = result.tables["users"]
    off, on = users[~users.dynamic_vocab], users[users.dynamic_vocab]
    assert (off.test_oov == off.test_oov_global_vocab).all() and (off.added_words == 0).all()
    assert (on.added_words > 0).any() and (on.test_share_new_words > 0).any()
    # added words leave the out-of-vocabulary share; replaced words the user never typed may join it
    assert np.all(on.test_oov >= on.test_oov_global_vocab - on.test_share_new_words - 1e-12)
    assert (on.test_oov < on.test_oov_global_vocab).any()
    # without the swap the new words are <unk>: never suggested, nothing saved
    assert (off[off.data_fraction > 0].top_k_eff_on_new_words.dropna() == 0).all()
    assert on.top_k_eff_on_new_words.dropna().between(0, 1).all()
    reach = result.tables["vocabulary_reach"]
    assert reach.used.sum() == len(result.params["data_fractions"])


def test_the_public_start_is_main_and_the_crowd_start_is_the_shared_model(result, run):
    _, _, _, shared, _, (_, public_models), _ = run
    assert all(shared.from_cache.values()) and all(public_models.from_cache.values())
    cache = result.tables["global_model_cache"].set_index("global_text").key
    assert cache["crowd"] == shared.entries[0].key[:16] and cache["sent140"] == public_models.entries[0].key[:16]
    assert result.tables["starts"].global_text.tolist() == ["sent140", "crowd"]
    gains = result.tables["start_gains"]
    assert set(gains.global_text) == {"sent140", "crowd"} and len(gains) == 2 * len(exp.PAPER.effects)
    every = result.tables["users_every_start"]
    main = every[every.global_text == "sent140"].drop(columns="global_text").reset_index(drop=True)
    assert main.top_k_eff.tolist() == result.tables["users"].top_k_eff.tolist()  # the main rows are the public start's
    crowd = every[every.global_text == "crowd"]
    assert not crowd.condition.str.endswith(exp.ALSO).any()  # the validation choice from the main start only


def _same(weights, model_weights) -> bool:
    return all(np.array_equal(a, b) for a, b in zip(weights, model_weights))


def test_training_starts_from_the_global_weights_with_the_same_batches(run):
    params, personal, planted_calls, shared, _, (_, public_models), _ = run
    n = 2 * len(params.data_fractions)  # of the one user
    paper = [c for c in personal if c["params"] is params]  # the main start's, the validation choice's left out
    crowd = [c for c in personal if c["params"].also_optimizer == ""]
    assert len(paper) == len(crowd) == n and all(_same(c["weights"], shared.weights[0]) for c in crowd)
    others = [c for c in personal + planted_calls if all(c is not k for k in crowd)]
    assert others and all(_same(c["weights"], public_models.weights[0]) for c in others)
    for without, with_ in zip(paper[::2], paper[1::2]):  # P-M* then P-M of one user and data size
        assert without["rng"] == with_["rng"]
        assert np.array_equal(without["data"].offsets, with_["data"].offsets)
        changed = without["data"].target != with_["data"].target
        assert changed.any() and (without["data"].target[changed] == 1).all()


def test_every_personal_model_stops_on_held_out_lines_as_top3eff_and_the_control_runs_as_its_rows(run, result):
    """One protocol across DeepType's experiments (issue 74): each personal model of the main rows and
    of the planted control is trained with a hold-out at the step-size reading's rates, the control
    with the dynamic vocabulary of the P-M rows it vouches for (its batches hold the user's own ids);
    the validation choice keeps its constant rate."""
    params, personal, planted_calls, *_, swaps = run
    assert params.personal_holdout_fraction > 0 and params.step_reading == "continued"
    paper = [c for c in personal if c["params"].personal_optimizer == params.personal_optimizer]
    also = [c for c in personal if c["params"].personal_optimizer != params.personal_optimizer]
    assert paper and also and planted_calls
    for c in paper + also + planted_calls:
        assert c["held"] is not None and len(c["held"]) > 0
    rates = [c["schedule"](1) for c in paper + planted_calls]
    assert all(r == rates[0] for r in rates) and rates[0] <= params.personal_learning_rate
    assert all(c["schedule"] is None for c in also)
    assert len(swaps) == len(planted_calls)  # each of the control's personal models on the user's own vocabulary
    users = result.tables["users"]
    trained = users[users.condition != "G-M"]
    assert (
        trained.kept_epoch.between(0, params.personal_epochs).all()
        and users[users.condition == "G-M"].kept_epoch.isna().all()
    )


def test_effects_and_paper_table(result):
    effects = result.tables["effects"]
    assert len(effects) == 3 and set(effects.verdict) <= {"holds", "does not hold", "within noise"}
    assert ((effects["ci low"] <= effects["our change"]) & (effects["our change"] <= effects["ci high"])).all()
    numbers = result.tables["paper_vs_ours"]
    assert list(numbers.paper) == [0.513, 0.595, 0.616, 0.577] and numbers.ours.between(0, 1).all()
    assert len(result.tables["contrasts"]) == 3 * 2 + 3 + 6


def test_bad_parameters_fail_clearly():
    with pytest.raises(ParameterError, match="data_fractions"):
        exp.Params.for_scale("smoke", data_fractions=(0.25, 1.0))
    with pytest.raises(ParameterError, match="dynamic_vocab_min_count"):
        exp.Params.for_scale("smoke", dynamic_vocab_min_count=0)


def test_the_validation_choice_is_trained_with_its_own_optimizer_and_diagnoses_its_effects(result, run):
    params, personal, _, _, _, _, _ = run
    also = [c["params"] for c in personal if c["params"].personal_optimizer == params.also_optimizer]
    assert len(also) == 2  # P-M 50% and 100% of the user, again
    assert {c.personal_learning_rate for c in also} == {params.also_learning_rate}
    params = result.params_as(exp.Params)
    notes = exp.also_diagnoses(params, result.tables["users"])
    # the two effects whose personal models were retrained; the dynamic vocabulary's P-M* was not
    assert set(notes) == {e.claim for e in exp.PAPER.effects if "dynamic" not in e.claim}
    assert all(n.text.startswith("with the validation users' choice (adam 0.0003): ") for n in notes.values())
    assert {n.section for n in notes.values()} == {exp.SECTION}


def test_a_passing_planted_control_names_the_data_of_personalization_at_its_size(result):
    """Personalization against the global model at 50%: once the planted control passed, the data is
    the cause, read on the 50% curve with that size's words per user, the validation line after it;
    a failing control adds nothing (the validation line stays open)."""
    params, users, tables = result.params_as(exp.Params), result.tables["users"], dict(result.tables)
    also = exp.also_diagnoses(params, users)
    tables["planted_verdict"] = pd.DataFrame([{"passes": True, "text": "x"}])
    known = exp.known_diagnoses(params, users, tables, also)
    claim = "personalization raises top-k-eff (50% of the data)"
    assert set(known) == {claim} and known[claim].kind == "data" and known[claim].section == exp.PLANTED_SECTION
    by_size = tables["planted_curve_by_size"]
    star = by_size[(by_size.data_fraction == 0.5) & (by_size.dose == params.planted_dose_star)].iloc[0]
    assert known[claim].text.startswith(f"the planted-signal control passes: personalization gains {star.gain:+.3f}")
    words = users[users.condition == "P-M 50%"].drop_duplicates("user").train_words.median()
    assert f"a median {words:,.0f} personal training words" in known[claim].text
    assert known[claim].text.endswith(also[claim].text)
    tables["planted_verdict"] = pd.DataFrame([{"passes": False, "text": "x"}])
    assert exp.known_diagnoses(params, users, tables, also) == {}


def test_planted_control_at_both_sizes(result, run):
    """Dose 0 is the main rows; each planted dose personalizes every test user at 50% and 100% (the
    spied run: one seed), and the rule is judged on the 100% curve; the planted rows at dose 0 would
    be the main rows themselves."""
    one_seed, _, planted_calls, _, _, (public, public_models), _ = run
    params = result.params_as(exp.Params)
    per_user, curve = result.tables["planted"], result.tables["planted_curve"]
    positive = [d for d in params.planted_doses if d > 0]
    assert len(planted_calls) == len(positive) * len(personal_sizes.PLANTED_SIZES) * params.test_users
    assert all(c["params"] is one_seed for c in planted_calls)
    assert curve.dose.tolist() == sorted(params.planted_doses) and (curve.users == params.test_users).all()
    assert (
        len(per_user)
        == len(params.planted_doses) * len(personal_sizes.PLANTED_SIZES) * params.test_users * params.seeds
    )
    by_size = result.tables["planted_curve_by_size"]
    assert sorted(set(by_size.data_fraction)) == [0.5, 1.0] and len(by_size) == 2 * len(params.planted_doses)
    assert by_size[by_size.data_fraction == 1.0].gain.tolist() == curve.gain.tolist()
    assert (curve["ci low"] <= curve.gain).all() and (curve.gain <= curve["ci high"]).all()
    verdict = result.tables["planted_verdict"].iloc[0]
    assert verdict.passes == planted.verdict(curve, params.planted_dose_star)[0] and "dose 0.5" in verdict.text
    users = result.tables["users"]
    main = per_user[per_user.dose == 0].set_index(["seed", "data_fraction", "user"]).top_k_eff
    for f in personal_sizes.PLANTED_SIZES:  # dose 0 is P-M of the main rows (their condition: issue 74)
        ours = users[users.condition == exp.condition(f, True)].set_index(["seed", "user"]).top_k_eff
        assert np.allclose(main.xs(f, level="data_fraction").sort_index(), ours.sort_index())
    again = personal_sizes._planted_rows(one_seed, public_models, public, 0.0, lambda _: None)  # the same protocol
    got = {(r["seed"], r["data_fraction"], r["user"]): r["top_k_eff"] for r in again}
    first = main[main.index.get_level_values("seed") == one_seed.seed]
    assert len(got) == len(first) and np.allclose([got[k] for k in first.index], first.to_numpy(), atol=1e-6)
