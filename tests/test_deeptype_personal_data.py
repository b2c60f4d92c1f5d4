"""D4 at smoke scale (one seed): the rows of every condition, the nested personal data, the
shared global model, and that personal training with and without the dynamic vocabulary starts
from the same global weights and sees the same batches."""

import numpy as np
import pytest

from ondevice.data import per_user_text
from ondevice.papers.deeptype import common, protocol
from ondevice.papers.deeptype.experiments import deeptype_personal_data as exp
from ondevice.params import ParameterError
from ondevice.tasks import typing_protocol


class Shared(typing_protocol.DeepTypeParams):
    """Only the fields every DeepType notebook shares, at their shared presets."""

    PRESETS = typing_protocol.PRESETS


@pytest.fixture(scope="module")
def run(speeches, tmp_path_factory):
    calls = []
    real = protocol.personalize

    def spy(trainer, weights, data, params, rng, *args, **kwargs):
        calls.append({"weights": weights, "data": data, "rng": rng.bit_generator.state, "params": params})
        return real(trainer, weights, data, params, rng, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ONDEVICE_MODEL_CACHE", str(tmp_path_factory.mktemp("models")))
        mp.setattr(protocol, "personalize", spy)
        params = exp.Params.for_scale("smoke", seeds=1)
        result = exp.run(params, speeches=speeches, log=lambda _: None)
        # the shared fields alone find the very same global model in the cache
        plain = Shared.for_scale("smoke", seeds=1)
        corpus = per_user_text.load_corpus(plain, speeches, log=lambda _: None)
        shared = common.train_global(plain, corpus, log=lambda _: None)
    return params, result, calls, shared, corpus


def test_one_row_per_user_and_condition_with_nested_personal_data(run):
    params, result, _, _, corpus = run
    users = result.tables["users"]
    expected = {"G-M"} | {exp.condition(f, d) for f in params.data_fractions for d in (True, False)}
    assert set(users.condition) == expected | {f"P-M {f}{exp.ALSO}" for f in ("50%", "100%")}
    assert len(exp.paper_conditions(users).condition.unique()) == len(expected)
    assert users.groupby(["seed", "user", "condition"]).size().eq(1).all()
    assert set(users.user) == set(corpus.split.test)
    for user, rows in users.groupby("user"):
        words = rows.set_index("condition").train_words
        assert 0 < words["P-M 25%"] < words["P-M 50%"] < words["P-M 100%"]
        assert words["P-M 100%"] == words["P-M* 100%"] == len(corpus.personal(user, params.personal_train_fraction)[0])
        assert rows.test_words.nunique() == 1
    assert users.top_k_eff.between(0, 1).all()


def test_oov_shares_before_and_after_the_swap(run):
    _, result, _, _, _ = run
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


def test_global_model_is_the_shared_one(run):
    _, result, _, shared, _ = run
    assert all(shared.from_cache.values())
    entry = shared.entries[0]
    assert result.tables["global_model_cache"].key.iloc[0] == entry.key[:16]


def test_training_starts_from_the_global_weights_with_the_same_batches(run):
    params, _, calls, shared, _ = run
    paper = [c for c in calls if c["params"] is params]  # the protocol's epochs and batch size are the personal fields
    assert len(paper) == 2 * len(params.data_fractions) * params.test_users
    for call in calls:
        assert all(np.array_equal(a, b) for a, b in zip(call["weights"], shared.weights[0]))
    for without, with_ in zip(paper[::2], paper[1::2]):  # P-M* then P-M of one user and data size
        assert without["rng"] == with_["rng"]
        assert np.array_equal(without["data"].offsets, with_["data"].offsets)
        changed = without["data"].target != with_["data"].target
        assert changed.any() and (without["data"].target[changed] == 1).all()


def test_effects_and_paper_table(run):
    _, result, _, _, _ = run
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


def test_the_validation_choice_is_trained_with_its_own_optimizer_and_diagnoses_its_effects(run):
    params, result, calls, _, _ = run
    also = [c["params"] for c in calls if c["params"].personal_optimizer == params.also_optimizer]
    assert len(also) == 2 * len(result.tables["users"].user.unique())  # P-M 50% and 100% of every user, again
    assert {c.personal_learning_rate for c in also} == {params.also_learning_rate}
    notes = exp.also_diagnoses(params, result.tables["users"])
    # the two effects whose personal models were retrained; the dynamic vocabulary's P-M* was not
    assert set(notes) == {e.claim for e in exp.PAPER.effects if "dynamic" not in e.claim}
    assert all(n.text.startswith("with the validation users' choice (adam 0.0003): ") for n in notes.values())
    assert {n.section for n in notes.values()} == {exp.SECTION}
