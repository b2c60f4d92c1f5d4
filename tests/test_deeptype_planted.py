"""The planted-signal control (`planted`), the personal step-size readings (`step_size`) and the
control's step count (`more_training`): the planting touches only the planted users' lines, at the
stated share, never the global text; and on a strongly planted user, personalization does what it
must, raise that user's top-3-eff (the known answer)."""

import dataclasses

import numpy as np
import pytest

from ondevice import streams
from ondevice.data import per_user_text
from ondevice.data.typing_samples import Vocabulary
from ondevice.papers.deeptype import common, more_training, planted, protocol, step_size
from ondevice.papers.deeptype.experiments import deeptype_top3eff as exp
from ondevice.params import ParameterError

QUIET = lambda _: None  # noqa: E731


def _lines(n: int, seed: int = 0) -> list[list[str]]:
    words = [f"w{i}" for i in range(60)]
    rng = np.random.default_rng(seed)
    return [list(rng.choice(words, 8, p=np.r_[np.full(10, 0.06), np.full(50, 0.008)])) for _ in range(n)]


def test_planting_changes_the_stated_share_of_lines_by_the_users_own_habit():
    sents = _lines(4000)
    vocab = Vocabulary.from_sentences(sents, 62)
    swap = planted.habit(vocab, "alice", 0, 5)
    assert set(swap) == set(vocab.words[2:7]) and len(set(swap.values())) == 5
    assert set(swap.values()).isdisjoint(vocab.words[2:12])  # targets from the rarer part of the vocabulary
    assert swap != planted.habit(vocab, "bob", 0, 5)  # each user has its own habit
    changed = {}
    for dose in (0.0, 0.25, 0.5, 1.0):
        out = planted.plant_user(sents, swap, dose, "alice", 0)
        assert [len(s) for s in out] == [len(s) for s in sents]
        diff = {i for i, (a, b) in enumerate(zip(sents, out)) if a != b}
        has_source = {i for i, s in enumerate(sents) if set(s) & set(swap)}
        assert diff <= has_source
        assert abs(len(diff) / len(has_source) - dose) < 0.03  # the stated share of the lines
        for i in diff:  # a planted line: every source word swapped, every other word kept
            assert out[i] == [swap.get(w, w) for w in sents[i]]
        changed[dose] = diff
    assert changed[0.0] == set() and changed[0.25] <= changed[0.5] <= changed[1.0]  # nested doses
    with pytest.raises(ValueError, match="dose"):
        planted.plant_user(sents, swap, 1.5, "alice", 0)


def test_a_planted_corpus_changes_only_test_and_validation_users(speeches):
    params = exp.Params.for_scale("smoke")
    corpus = per_user_text.load_corpus(params, speeches, log=QUIET)
    crowd_digest = corpus.crowd_samples.digest()
    plant = planted.planted(corpus, 0.5, params.seed, params.planted_words)
    who = set(corpus.split.test) | set(corpus.split.validation)
    assert all(plant.users[u] != corpus.users[u] for u in who)
    assert all(plant.users[u] == corpus.users[u] for u in corpus.users if u not in who)  # the crowd and the rest
    assert plant.crowd is corpus.crowd and plant.vocab is corpus.vocab and plant.split is corpus.split
    assert plant.crowd_samples.digest() == crowd_digest and plant.holdout_samples is corpus.holdout_samples
    # planting draws from its own streams: the corpus it started from is untouched
    assert per_user_text.load_corpus(params, speeches, log=QUIET).users == corpus.users


def test_the_control_rule_needs_the_interval_above_zero_and_no_fall_with_the_dose():
    import pandas as pd

    t = lambda rows: pd.DataFrame(rows, columns=["dose", "gain", "ci low", "ci high"])
    ok = t([(0, 0.0, -0.01, 0.01), (0.5, 0.05, 0.02, 0.08), (1, 0.12, 0.08, 0.15)])
    assert planted.verdict(ok, 0.5)[0]
    assert not planted.verdict(t([(0, 0.0, -0.01, 0.01), (0.5, 0.02, -0.01, 0.05), (1, 0.1, 0.05, 0.2)]), 0.5)[0]
    falls = t([(0, 0.0, -0.01, 0.01), (0.5, 0.10, 0.05, 0.15), (1, 0.02, 0.01, 0.04)])
    passed, text = planted.verdict(falls, 0.5)
    assert not passed and "falls" in text
    with pytest.raises(ParameterError, match="planted_dose_star"):
        exp.Params.for_scale("smoke", planted_dose_star=0.3)


def test_the_two_step_size_readings_and_the_rule():
    params = exp.Params.for_scale("default")  # PTB: 1.0, halved every epoch after the 4th
    continued, restarted = (step_size.schedule(params, r, 6) for r in step_size.READINGS)
    assert [continued(e) for e in range(1, 6)] == [0.25, 0.125, 0.0625, 0.03125, 0.015625]
    assert [restarted(e) for e in range(1, 6)] == [1.0, 1.0, 1.0, 1.0, 0.5]
    assert (
        step_size.choose({"continued": 0.01, "restarted": 0.0}, {"continued": 0, "restarted": 1}, 1e-3) == "continued"
    )
    assert step_size.choose({"continued": 0.0, "restarted": 0.0}, {"continued": 0, "restarted": 1}, 1e-3) == "restarted"
    assert step_size.choose({"continued": 0.0, "restarted": 0.0}, {"continued": 0, "restarted": 0}, 1e-3) == "continued"
    with pytest.raises(ValueError, match="reading"):
        step_size.schedule(params, "constant", 6)


@pytest.fixture(scope="module")
def trained(speeches):
    """A smoke crowd model, its corpus and the test user with the most training lines."""
    params = exp.Params.for_scale("smoke", seeds=1, global_epochs=2, personal_epochs=3)
    corpus = per_user_text.load_corpus(params, speeches, log=QUIET)
    models = common.train_global(params, corpus, log=QUIET)
    user = max(corpus.split.test, key=lambda u: len(corpus.users[u]))
    return params, corpus, models, user


def test_personalization_raises_a_strongly_planted_users_top3eff(trained):
    """The known answer: a user who swaps 20 common words for its own in every line gains, and gains
    more than the same user unplanted (the same protocol, seed and lines)."""
    params, corpus, models, user = trained
    personal, start = protocol.Personal(params, models.model), models.weights[params.seed]
    rates = step_size.schedule(params, "restarted", step_size.kept_epoch(models, params.seed))
    gain = {}
    for dose in (0.0, 1.0):
        fit, held, test = planted.planted(corpus, dose, params.seed, params.planted_words).personal_parts(user, params)
        before = personal.score_weights(start, test)["top_k_eff"]
        after = personal.train((fit, test), start, params, streams.rng(0, "test"), held=held, schedule=rates)[0]
        gain[dose] = after["top_k_eff"] - before
    assert after["kept_epoch"] >= 1  # the planted held-out lines asked for personal epochs
    assert gain[1.0] > 0.05 and gain[1.0] > gain[0.0] + 0.05, gain  # at least 5 points of top-3-eff


def test_the_control_trains_five_epochs_of_the_median_user_on_crowd_text(trained):
    params, corpus, models, _ = trained
    per_epoch = more_training.epoch_steps(params, corpus)
    assert per_epoch > 1
    p = dataclasses.replace(params, personal_epochs=2)
    row = lambda seed, user, condition, parts, score, steps: {"user": user, "steps": steps, **score}
    rates = step_size.schedules(p, models, "continued")
    rows = more_training.run(p, corpus, models, rates, row, "control", log=QUIET)
    assert [r["steps"] for r in rows] == [2 * per_epoch] * len(corpus.split.test)
    scores = [
        protocol.Personal(p, models.model).score_weights(models.weights[0], corpus.personal_parts(u, p)[2])
        for u in corpus.split.test
    ]
    assert all(r["top_k_eff"] != s["top_k_eff"] for r, s in zip(rows, scores))  # never the global model itself


def test_personal_jobs_give_the_rows_of_the_in_process_loop_they_replace(trained):
    """top3eff's planted and switched-back runs as engine jobs (`personal_jobs`, each job building its
    own model) against `planted.gains`, the loop over one shared model that they replaced: the same
    start and personalized scores, kept epoch and steps, for every test user."""
    from ondevice.papers.deeptype import personal_jobs
    from ondevice.tasks import typing_protocol

    params, corpus, models, _ = trained
    plant = planted.planted(corpus, 0.5, params.seed, params.planted_words)
    schedule = step_size.schedules(params, models, "continued")
    loop = planted.gains(params, plant, models, schedule, 0.5, plant.split.test, log=QUIET)
    config = typing_protocol.model_config(params, plant)
    data = lambda user: {"parts": plant.personal_parts(user, params)}  # noqa: E731
    jobs = personal_jobs.run(params, models, config, "continued", plant.split.test, data, "test", QUIET)
    assert [(r["seed"], r["user"]) for r in jobs] == [(r["seed"], r["user"]) for r in loop]
    for a, b in zip(jobs, loop):
        assert (a["kept_epoch"], a["steps"], a["steps_run"]) == (b["kept_epoch"], b["steps"], b["steps_run"])
        for key in ("top_k_eff_global", "top_k_eff", "perplexity"):
            assert a[key] == pytest.approx(b[key], rel=1e-6), key
