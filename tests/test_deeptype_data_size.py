"""D2 data size and epochs: nested training sets, one cached model per size whose stored
per-epoch scores are the trained model's, and the convergence rule."""

import dataclasses

import numpy as np
import pandas as pd
import pytest

from ondevice.data import per_user_text
from ondevice.papers.deeptype import size_convergence as conv
from ondevice.papers.deeptype.experiments import deeptype_data_size as exp
from ondevice.papers.deeptype.plateau_decay import PlateauDecay
from ondevice.params import ParameterError
from ondevice.report import claims
from ondevice.tasks import typing_protocol
from ondevice.tasks.next_word import NextWordTask
from ondevice.training import model_cache
from ondevice.training.trainer import Trainer


@pytest.fixture(scope="module")
def setup(speeches):
    params = exp.Params.for_scale("smoke", crowd_max_words=3000, size_max_words=1200, size_epochs=30, eval_max_words=40)
    corpus = per_user_text.load_corpus(params, speeches, lambda _: None)
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
    params = dataclasses.replace(params, size_epochs=2)  # the cap: a short fit is enough for the cache
    monkeypatch.setenv("ONDEVICE_MODEL_CACHE", str(tmp_path))
    quiet = lambda _: None
    words = list(sets.sets)[0]
    first = exp.size_model(params, corpus, sets, words, params.seed, quiet)
    epochs = first.info["epochs"]
    assert not first.hit and [e["epoch"] for e in epochs] == list(range(1, len(epochs) + 1))
    assert 1 <= first.info["kept_epoch"] <= len(epochs) <= params.size_epochs
    assert all(np.isfinite(e["holdout_loss"]) and e["steps"] > 0 for e in epochs)
    # the stored scores of the kept epoch are those of the stored weights
    model = typing_protocol.build_model(params, corpus, params.seed)
    model.set_weights(first.weights)
    task, kept = NextWordTask(params.k), epochs[first.info["kept_epoch"] - 1]
    for user, samples in sets.evaluation.items():
        assert kept["users"][user]["top_k_eff"] == task.evaluate(model, samples)["top_k_eff"]
    again = exp.size_model(params, corpus, sets, words, params.seed, quiet)
    assert again.hit and again.key == first.key and again.info["epochs"] == first.info["epochs"]
    other = exp.size_model(params, corpus, sets, list(sets.sets)[1], params.seed, quiet)
    assert not other.hit and other.key != first.key
    assert len(list(model_cache.cache_root().glob("deeptype_data_size-*"))) == 2
    stops = conv.stopping({(params.seed, words): first})
    assert stops.kept_epoch.tolist() == [first.info["kept_epoch"]] and stops.epochs.tolist() == [len(epochs)]


def test_each_size_trains_to_its_plateau_with_the_rate_decayed_there(setup, tmp_path, monkeypatch):
    """The stored curve replayed through the rule: the rate halves after (only) every epoch that
    misses the 1% improvement, training ends on `size_patience` of them in a row before the cap,
    and the kept epoch is the lowest held-out loss."""
    params, corpus, sets = setup
    monkeypatch.setenv("ONDEVICE_MODEL_CACHE", str(tmp_path))
    entry = exp.size_model(params, corpus, sets, list(sets.sets)[0], params.seed, lambda _: None)
    epochs, info = entry.info["epochs"], entry.info
    loss, rate = [e["holdout_loss"] for e in epochs], [e["learning_rate"] for e in epochs]
    assert info["plateau"] and len(epochs) < params.size_epochs  # the plateau, not the cap, ended it
    assert info["kept_epoch"] == int(np.argmin(loss)) + 1
    best, expected, misses = np.inf, params.global_learning_rate, []
    for i, value in enumerate(loss):
        assert rate[i] == pytest.approx(expected)
        missed = value >= best * (1 - params.global_min_improvement)
        best, expected = min(best, value), expected * (params.global_lr_decay if missed else 1)
        misses.append(missed)
    assert misses[-params.size_patience :] == [True] * params.size_patience
    assert len(misses) == params.size_patience or not misses[-params.size_patience - 1]  # it stopped at once
    # the control: an LSTM below its own 2-gram on the held-out text is reported as not converged
    points, words = exp.curve({(params.seed, entry.info["fields"]["training_words"]): entry}), list(sets.sets)[0]
    base = pd.DataFrame({"training_words": [words], "top_k_eff": [0.5]})
    kept = epochs[info["kept_epoch"] - 1]["holdout_top_k_eff"]
    for ngram, below in ((kept + 0.01, True), (kept - 0.01, False)):
        table = conv.control({(params.seed, words): entry}, {words: ngram}, base, points)
        assert table.below_ngram.tolist() == [below] and table.converged.tolist() == [not below]
        assert table.lstm_holdout_top_k_eff.tolist() == [kept] and table.ngram_test_median.tolist() == [0.5]


def test_plateau_decay_halves_the_rate_on_stalls_and_stops_on_a_plateau(setup):
    """Real TF training (`Trainer.fit`) with a scripted held-out curve: 1% stalls at epochs 3, 5, 6, 7."""
    params, corpus, sets = setup
    model = typing_protocol.build_model(params, corpus, 0)
    data = sets.evaluation[next(iter(sets.evaluation))]
    curve = iter([5.0, 4.0, 3.99, 3.0, 2.995, 3.2, 2.99, 1.0])
    seen = []
    evaluate = lambda m: (seen.append(m.get_weights()[0].copy()), {"holdout_loss": next(curve)})[1]  # noqa: E731
    rule = PlateauDecay(1.0, 0.5, patience=3, min_delta=0.01)
    trainer = Trainer(model, NextWordTask(3), 1.0, "sgd")
    history = trainer.fit(data, 20, 16, np.random.default_rng(0), None, "", evaluate, rule, schedule=rule)
    assert [h["learning_rate"] for h in history] == [1.0, 1.0, 1.0, 0.5, 0.5, 0.25, 0.125]
    assert len(history) == 7 and history.plateau  # epoch 8 (which would improve) never runs
    assert history.best_epoch == 7  # 2.99 is the lowest, kept although it missed the 1% improvement
    np.testing.assert_array_equal(model.get_weights()[0], seen[6])
    assert rule(1) == 0.0625 and rule.watch() and rule(1) == 1.0  # a new fit starts at the first rate again
    with pytest.raises(ValueError, match="decay"):
        PlateauDecay(1.0, 1.0, 3, 0.01)


def test_the_ngram_baseline_is_counted_on_each_size(setup):
    params, corpus, sets = setup
    table = exp.baselines(params, corpus, sets, lambda _: None)
    assert len(table) == len(sets.sets) * len(sets.evaluation) and set(table.model) == {conv.BASELINE}
    assert table.top_k_eff.between(0, 1).all()
    per_size = table.groupby("training_words").top_k_eff.apply(tuple)
    assert per_size.nunique() == len(sets.sets)  # different counts, different suggestions


def _points():
    """Two seeds x three sizes x three users; seed 0 keeps epoch 3 of 5, seed 1 epoch 5 of 5."""
    rows = []
    for seed, curve, kept in ((0, [0.30, 0.40, 0.45, 0.452, 0.451], 3), (1, [0.30, 0.35, 0.38, 0.40, 0.46], 5)):
        for epoch, v in enumerate(curve, 1):
            rows += [
                {
                    "seed": seed,
                    "training_words": 100,
                    "epoch": epoch,
                    "kept": epoch == kept,
                    "user": u,
                    "top_k_eff": v + d,
                }
                for u, d in (("a", 0.0), ("b", 0.01), ("c", -0.01))
            ]
    points = pd.DataFrame(rows)
    return pd.concat(
        [
            points.assign(training_words=w, top_k_eff=points.top_k_eff * f)
            for w, f in ((10, 0.8), (50, 0.95), (100, 1.0))
        ]
    )


def test_effects_compare_the_kept_epochs():
    table = exp.effects(exp.Params.for_scale("smoke"), _points())
    np.testing.assert_allclose(table["our change"], [0.95 / 0.8 - 1, 1 / 0.95 - 1])
    assert table.words.tolist() == ["10 -> 50", "50 -> 100"] and set(table.verdict) == {"holds"}
    np.testing.assert_allclose(exp._final(_points(), 100)[0], [0.45, 0.46, 0.44])  # seed 0: epoch 3, not 5


def test_a_flagged_size_effect_is_diagnosed_with_kept_epochs_and_the_baseline():
    stops = pd.DataFrame(
        [(0, 10, 13, 13, False), (0, 50, 9, 7, True), (0, 100, 8, 6, True)],
        columns=["seed", "training_words", "epochs", "kept_epoch", "plateau"],
    )
    base = pd.DataFrame({"training_words": [10, 10, 50, 50, 100, 100], "top_k_eff": [0.2, 0.2, 0.3, 0.3, 0.31, 0.31]})
    table = exp.effects(exp.Params.for_scale("smoke"), _points(), stops.assign(below_ngram=[True, False, False]), base)
    # +18.8% against the paper's +9.2%: within 3x, no diagnosis; +5.3% against +0.8%: flagged
    assert table.diagnosis[0] == "" and table.section[0] == ""
    assert table.diagnosis[1] == (
        "50 words kept epoch 7 of 9 (plateau); 100 words kept epoch 6 of 8 (plateau); "
        f"{conv.BASELINE} on the same words 0.300 -> 0.310 (+3.3%); the LSTM on 50 words 0.432 against the "
        f"{conv.BASELINE}'s 0.300"
    )
    assert table.section[1] == conv.SECTION and table["diagnosis kind"].tolist() == ["", "open"]
    assert (
        "10 words kept epoch 13 of 13 (epoch cap; below its 2-gram on held-out text)"
        in conv.diagnosis(
            {"paper change": 0.092, "our change": 1.0, "ci low": 0.9, "ci high": 1.1},
            stops.assign(below_ngram=[True, False, False]),
            base,
            _points(),
            10,
            50,
        ).text
    )


def test_bad_sizes_are_named():
    with pytest.raises(ParameterError, match="size_fractions"):
        exp.Params.for_scale("smoke", size_fractions=[0.5, 0.25, 1.0])
    with pytest.raises(ParameterError, match="size_fractions"):
        exp.Params.for_scale("smoke", size_fractions=[0.5, 1.0])


def _entry(losses, kept, **fields):
    """A stand-in model-cache entry: held-out loss and top-k-eff per epoch, the kept epoch."""
    from types import SimpleNamespace

    epochs = [{"epoch": i, "holdout_loss": v, "holdout_top_k_eff": 1 / v} for i, v in enumerate(losses, 1)]
    return SimpleNamespace(info={"epochs": epochs, "kept_epoch": kept, "fields": fields})


def test_each_size_keeps_its_lowest_held_out_loss_and_a_size_below_after_every_remedy_is_the_datas():
    main = {(0, 10): _entry([5.0, 4.5, 4.6], 2), (0, 50): _entry([3.5, 3.2], 2)}
    tried = {(0, 10): {"patient rule": _entry([5.0, 4.4], 2), "dropout": _entry([4.4, 4.1, 4.3], 1)}}
    chosen, names = conv.choose(main, tried)
    # the patient rule and the dropout run tie at 4.4 (their kept epochs): the one tried first is kept
    assert names == {(0, 10): "patient rule", (0, 50): conv.MAIN} and chosen[(0, 50)] is main[(0, 50)]
    assert conv.choose({(0, 10): _entry([4.0], 1)}, {(0, 10): {"x": _entry([4.0], 1)}})[1] == {(0, 10): conv.MAIN}
    table = conv.remedies_table(main, tried, names, {10: 0.5, 50: 0.2})
    assert table.model.tolist() == [conv.MAIN, "patient rule", "dropout", conv.MAIN]
    assert table.chosen.tolist() == [False, True, False, True]
    assert table.below_ngram.tolist() == [True, True, True, False]  # 1/4.5, 1/4.4, 1/4.4 < 0.5 < 1/3.2
    stops = pd.DataFrame(
        [(0, 10, 3, 2, True, True), (0, 50, 2, 2, True, False), (0, 100, 2, 2, True, False)],
        columns=["seed", "training_words", "epochs", "kept_epoch", "plateau", "below_ngram"],
    )
    base = pd.DataFrame({"training_words": [10, 50, 100], "top_k_eff": [0.2, 0.3, 0.31]})
    row = {"paper change": 0.092, "our change": 1.0, "ci low": 0.9, "ci high": 1.1}
    why = conv.diagnosis(row, stops, base, _points(), 10, 50, table)
    assert why.kind == claims.Kind.DATA and why.text.startswith("too little text for this LSTM: on 10 words")
    assert "main rule 0.222, patient rule 0.227, dropout 0.227; 2-gram+char 0.500" in why.text
    assert conv.diagnosis(row, stops, base, _points(), 10, 50).kind == claims.Kind.OPEN  # no remedy tried
    reached = table.assign(below_ngram=[True, False, True, False])  # a remedy reached the 2-gram
    assert conv.diagnosis(row, stops, base, _points(), 10, 50, reached).kind == claims.Kind.OPEN


@pytest.mark.slow(reason="trains two sizes and two remedies for two epochs each (real TF)")
def test_remedies_train_only_the_sizes_below_their_ngram_under_the_fixed_rules(setup, tmp_path, monkeypatch):
    params, corpus, sets = setup
    params = dataclasses.replace(params, size_epochs=2)
    monkeypatch.setenv("ONDEVICE_MODEL_CACHE", str(tmp_path))
    quiet, (small, *_, large) = (lambda _: None), sorted(sets.sets)
    entries = {(params.seed, w): exp.size_model(params, corpus, sets, w, params.seed, quiet) for w in (small, large)}
    checks = pd.DataFrame({"seed": [params.seed] * 2, "training_words": [small, large], "below_ngram": [True, False]})
    tried = exp.remedies(params, corpus, sets, checks, quiet)
    assert list(tried) == [(params.seed, small)]
    fields = [e.info["fields"] for e in tried[(params.seed, small)].values()]
    assert [(f["global_min_improvement"], f["dropout"]) for f in fields] == [(0.001, 0.0), (0.001, 0.5)]
    assert all(f["training_words"] == small for f in fields)
    for entry in tried[(params.seed, small)].values():  # a remedy's users are scored at its kept epoch only
        assert [e["epoch"] for e in entry.info["epochs"] if "users" in e] == [entry.info["kept_epoch"]]
    patient = tried[(params.seed, small)]["patient rule"]
    model = typing_protocol.build_model(params, corpus, params.seed)
    model.set_weights(patient.weights)
    user, samples = next(iter(sets.evaluation.items()))
    kept = next(e for e in patient.info["epochs"] if e["epoch"] == patient.info["kept_epoch"])
    assert kept["users"][user]["top_k_eff"] == NextWordTask(params.k).evaluate(model, samples)["top_k_eff"]
    base = exp.baselines(params, corpus, sets, quiet)
    chosen, control, table = exp.choose(params, corpus, sets, entries, tried, base, quiet)
    assert set(control.model) <= {conv.MAIN, *tried[(params.seed, small)]} and len(table) == 4
    best = min(
        conv.kept_holdout_loss(e) for e in [entries[(params.seed, small)], *tried[(params.seed, small)].values()]
    )
    assert conv.kept_holdout_loss(chosen[(params.seed, small)]) == best
