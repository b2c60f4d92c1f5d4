"""D2 data size and epochs: nested training sets, one cached model per size whose stored
per-epoch scores are the trained model's, and the convergence rule."""

import numpy as np
import pandas as pd
import pytest

from ondevice.papers.deeptype.experiments import deeptype_data_size as exp
from ondevice.params import ParameterError
from ondevice.tasks.next_word import NextWordTask
from ondevice.training import model_cache


@pytest.fixture(scope="module")
def setup(speeches):
    params = exp.Params.for_scale("smoke", crowd_max_words=3000, size_max_words=1200, size_epochs=2, eval_max_words=40)
    corpus = exp.load_corpus(params, speeches, lambda _: None)
    return params, corpus, exp.training_sets(params, corpus, lambda _: None)


def test_training_sets_are_nested_shares(setup):
    params, corpus, sets = setup
    sizes = list(sets.sets)
    assert sizes == sorted(sizes) and len(sizes) == len(params.size_fractions)
    for (_, a), (_, b) in zip(list(sets.sets.items()), list(sets.sets.items())[1:]):
        assert b[: len(a)] == a  # the smaller set is the start of the larger one
    for f, (words, sents) in zip(params.size_fractions, sets.sets.items()):
        assert words == sum(map(len, sents)) >= f * params.size_max_words
        assert words - len(sents[-1]) < f * params.size_max_words  # cut at the first sentence reaching the share
    assert set(sets.evaluation) == set(corpus.split.test)
    assert all(len(s) == params.eval_max_words for s in sets.evaluation.values())
    with pytest.raises(ParameterError, match="size_max_words"):
        exp.training_sets(
            exp.Params.for_scale("smoke", crowd_max_words=3000, size_max_words=10**7), corpus, lambda _: None
        )


def test_each_size_is_one_cache_entry_with_its_models_scores(setup, tmp_path, monkeypatch):
    params, corpus, sets = setup
    monkeypatch.setenv("ONDEVICE_MODEL_CACHE", str(tmp_path))
    quiet = lambda _: None
    words = list(sets.sets)[0]
    first = exp.size_model(params, corpus, sets, words, params.seed, quiet)
    assert not first.hit and [e["epoch"] for e in first.info["epochs"]] == [1, 2]
    # the stored last-epoch scores are those of the stored weights
    model = exp.common.build_model(params, corpus, params.seed)
    model.set_weights(first.weights)
    task = NextWordTask(params.k)
    for user, samples in sets.evaluation.items():
        assert first.info["epochs"][-1]["users"][user]["top_k_eff"] == task.evaluate(model, samples)["top_k_eff"]
    again = exp.size_model(params, corpus, sets, words, params.seed, quiet)
    assert again.hit and again.key == first.key and again.info["epochs"] == first.info["epochs"]
    other = exp.size_model(params, corpus, sets, list(sets.sets)[1], params.seed, quiet)
    assert not other.hit and other.key != first.key
    assert len(list(model_cache.cache_root().glob("deeptype_data_size-*"))) == 2


def test_epochs_to_converge_and_effects():
    rows = []
    for seed, curve in ((0, [0.30, 0.40, 0.45, 0.452, 0.451]), (1, [0.30, 0.35, 0.38, 0.40, 0.46])):
        for epoch, v in enumerate(curve, 1):
            rows += [
                {"seed": seed, "training_words": 100, "epoch": epoch, "user": u, "top_k_eff": v + d}
                for u, d in (("a", 0.0), ("b", 0.01), ("c", -0.01))
            ]
    points = pd.DataFrame(rows)
    assert exp.epochs_to_converge(points, 100) == [3, 5]
    sized = pd.concat(
        [
            points.assign(training_words=w, top_k_eff=points.top_k_eff * f)
            for w, f in ((10, 0.8), (50, 0.95), (100, 1.0))
        ]
    )
    table = exp.effects(exp.Params.for_scale("smoke"), sized)
    np.testing.assert_allclose(table["our change"], [0.95 / 0.8 - 1, 1 / 0.95 - 1])
    assert table.words.tolist() == ["10 -> 50", "50 -> 100"] and set(table.verdict) == {"holds"}


def test_bad_sizes_are_named():
    with pytest.raises(ParameterError, match="size_fractions"):
        exp.Params.for_scale("smoke", size_fractions=[0.5, 0.25, 1.0])
    with pytest.raises(ParameterError, match="size_fractions"):
        exp.Params.for_scale("smoke", size_fractions=[0.5, 1.0])
