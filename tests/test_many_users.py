"""K users trained together (`training.many_users`) against the same users trained one at a time by
the per-user `Trainer`, from the same weights on the same batches: real TensorFlow steps on a tiny
DeepType LSTM, users with unequal data, one stopping early."""

import numpy as np
import pytest

from numerics import float32_deep_tolerance, lstm_terms, update_tolerance
from ondevice.data.typing_samples import Vocabulary, build_samples, sentences
from ondevice.models import lstm_lm
from ondevice.tasks.next_word import NextWordTask
from ondevice.training.fine_tune import FineTune
from ondevice.training.many_users import ManyUsers
from ondevice.training.trainer import Plateau, Trainer, seed_everything

TEXT = (
    "To be, or not to be, that is the question. Whether 'tis nobler in the mind to suffer the slings and "
    "arrows. Or to take arms against a sea of troubles, and by opposing end them. To die, to sleep, no more. "
) * 3
SPANS = ((0, 6), (2, 4), (5, 12))  # sentences per user: 64, 20 and 74 samples (16, 5 and 19 batches of 4)
EPOCHS, BATCH, SEED = 3, 4, 10


@pytest.fixture(scope="module")
def setup():
    seed_everything(0)
    sents = sentences(TEXT)
    vocab = Vocabulary.from_sentences(sents, 30)
    users = [build_samples(sents[a:b], vocab, 3) for a, b in SPANS]
    model = lstm_lm.build(lstm_lm.LSTMConfig(vocab.input_size, vocab.size, 8, 12), seed=3)
    return vocab, users, model, model.get_weights()


def step_terms(vocab, users) -> int:
    """float32 terms summed along one step's chain: the 2 LSTM layers' gate sums over the longest
    sample, the softmax's 12 + 1, the log-sum-exp over the vocabulary, and a weight gradient's sum
    over the batch's positions."""
    longest = max(int(u.lengths.max()) for u in users)
    return lstm_terms(longest, 8, 12) + 13 + vocab.size + BATCH * longest


def one_at_a_time(model, task, start, users, rate, optimizer, hooks=(), **fit):
    """Each user trained alone by the per-user trainer: final weights and histories."""
    trainer, weights, histories = Trainer(model, task, rate, optimizer, hooks, clip_norm=5.0), [], []
    evaluate = fit.get("evaluate")
    for k, data in enumerate(users):
        trainer.reset(start)
        extra = {**fit, "evaluate": (lambda m, k=k: evaluate(k, m))} if evaluate else fit
        histories.append(trainer.fit(data, EPOCHS, BATCH, np.random.default_rng(SEED + k), **extra))
        weights.append(model.get_weights())
    return weights, histories


def together(model, task, start, users, rate, optimizer, train_layers=None, **fit):
    many = ManyUsers(model, task, len(users) + 1, rate, optimizer, clip_norm=5.0, train_layers=train_layers)
    many.reset(start)
    rngs = [np.random.default_rng(SEED + k) for k in range(len(users))]
    histories = many.fit(users, EPOCHS, BATCH, rngs, **fit)
    return [many.user_weights(k) for k in range(len(users))], histories, many


def assert_same_training(got, want, start, histories, terms_per_step):
    for k, (g, w, h) in enumerate(zip(got, want, histories)):
        terms = terms_per_step * sum(row["steps"] for row in h)  # each step's rounding adds to the moves
        for a, b, s in zip(g, w, start):
            atol = update_tolerance(b, s, terms)
            np.testing.assert_allclose(a - s, b - s, rtol=0, atol=atol, err_msg=f"user {k}")


def test_sgd_users_together_match_each_user_alone(setup):
    """DeepType's personal regime (SGD 1.0, clip 5, loss summed per sample); the users' epochs have
    16, 5 and 19 steps, so the small user sits masked for most steps, and a fourth slot idles."""
    vocab, users, model, start = setup
    task = NextWordTask(3, loss_per="sample")
    want, want_h = one_at_a_time(model, task, start, users, 1.0, "sgd")
    got, got_h, many = together(model, task, start, users, 1.0, "sgd")
    steps = [[r["steps"] for r in h] for h in got_h]
    assert steps == [[r["steps"] for r in h] for h in want_h] == [[16] * EPOCHS, [5] * EPOCHS, [19] * EPOCHS]
    for g, w in zip(got_h, want_h):
        np.testing.assert_allclose([r["loss"] for r in g], [r["loss"] for r in w], rtol=1e-4)
    terms = step_terms(vocab, users)
    assert_same_training(got, want, start, want_h, terms)
    for a, b in zip(many.user_weights(len(users)), start):  # the idle slot never moved
        np.testing.assert_array_equal(a, b)
    # control: another learning rate (1% off) moves the weights by more than the tolerance
    other, _ = one_at_a_time(model, task, start, users[:1], 0.99, "sgd")
    atol = [update_tolerance(b, s, terms * sum(steps[0])) for b, s in zip(want[0], start)]
    assert any(np.abs(a - b).max() > t for a, b, t in zip(other[0], want[0], atol))


def test_adam_fine_tune_together_matches_each_user_alone(setup):
    """Adam (each user's own moments and step count) training only the softmax (DeepType's
    fine-tune), loss averaged per position; the frozen layers stay exactly as they started."""
    vocab, users, model, start = setup
    task = NextWordTask(3, loss_per="position")
    want, want_h = one_at_a_time(model, task, start, users, 0.01, "adam", hooks=[FineTune()])
    got, _, _ = together(model, task, start, users, 0.01, "adam", train_layers=["softmax"])
    assert_same_training(got, want, start, want_h, step_terms(vocab, users))
    for user in got:
        for a, b in zip(user[:-2], start[:-2]):
            np.testing.assert_array_equal(a, b)
        assert not np.allclose(user[-2], start[-2])


def test_each_user_stops_at_its_own_plateau_and_keeps_its_best_epoch(setup):
    """Users 0 and 2 stop on their held-out loss (their own lines); user 1's monitored value rises
    after its first epoch by construction, so it stops after epoch 2 and keeps epoch 1's weights."""
    vocab, users, model, start = setup
    task = NextWordTask(3, loss_per="sample")
    calls = [0]

    def evaluate(k, m):
        if k == 1:
            calls[0] += 1
            return {"holdout_loss": float(calls[0])}
        return {"holdout_loss": float(np.log(task.evaluate(m, users[k])["perplexity"]))}

    want, want_h = one_at_a_time(model, task, start, users, 1.0, "sgd", evaluate=evaluate, stop=Plateau(1))
    calls[0] = 0
    got, got_h, _ = together(model, task, start, users, 1.0, "sgd", evaluate=evaluate, stop=Plateau(1))
    assert got_h[1].best_epoch == 1 and len(got_h[1]) == 2 and got_h[1].plateau
    assert [(h.best_epoch, len(h)) for h in got_h] == [(h.best_epoch, len(h)) for h in want_h]
    assert_same_training(got, want, start, want_h, step_terms(vocab, users))
    assert any(len(h) == EPOCHS for h in got_h)  # a user that did not stop trained on beside the stopped one


def test_bad_input_is_a_clear_error(setup):
    vocab, users, model, _ = setup
    task = NextWordTask(3)
    many = ManyUsers(model, task, 2, 0.1)
    with pytest.raises(ValueError, match="generator"):
        many.fit(users[:2], 1, BATCH, [np.random.default_rng(0)])
    with pytest.raises(ValueError, match="1..2 users"):
        many.fit(users, 1, BATCH, [np.random.default_rng(k) for k in range(3)])
    with pytest.raises(ValueError, match="train_layers"):
        ManyUsers(model, task, 2, 0.1, train_layers=["nope"])
    dropout = lstm_lm.build(lstm_lm.LSTMConfig(vocab.input_size, vocab.size, 8, 12, dropout=0.5), seed=3)
    with pytest.raises(ValueError, match="not supported"):
        ManyUsers(dropout, task, 2, 0.1)


@pytest.mark.slow(reason="the smoke split's users personalized twice (alone and together), about 50 s")
def test_deeptype_personalization_together_gives_each_users_metrics(speeches):
    """`protocol.Personal.train_together` against `Personal.train` one user at a time, on the smoke
    split's test users with the smoke model's shape (its own real text, a hold-out stopping each):
    the same kept epoch and steps, the test perplexity and hold-out curve within the rounding of
    the training chain, and top-k-eff within one word's characters (a rank tie that rounding flips)."""
    from ondevice.data import per_user_text
    from ondevice.papers.deeptype import protocol
    from ondevice.papers.deeptype.experiments import deeptype_top3eff as top3
    from ondevice.tasks import typing_protocol

    params = top3.Params.for_scale("smoke", seeds=1, personal_epochs=2)
    corpus = per_user_text.load_corpus(params, speeches, log=lambda _: None)
    config = typing_protocol.model_config(params, corpus)
    model = lstm_lm.build(config, seed=1)
    start, personal = model.get_weights(), protocol.Personal(params, model)
    parts = [corpus.personal_parts(u, params) for u in corpus.split.test]
    alone = [
        personal.train((f, t), start, params, np.random.default_rng(k), held=h)[0] for k, (f, h, t) in enumerate(parts)
    ]
    rngs = [np.random.default_rng(k) for k in range(len(parts))]
    together = personal.train_together([(f, t) for f, _, t in parts], start, params, rngs, [h for _, h, _ in parts])
    assert len(together) == len(parts) >= 2
    for (fit, _, test), a, [b] in zip(parts, alone, together):
        assert (a["kept_epoch"], a["steps"], a["steps_run"]) == (b["kept_epoch"], b["steps"], b["steps_run"])
        longest = int(max(fit.lengths.max(), test.lengths.max()))
        step = lstm_terms(longest, config.embedding_dim, config.hidden_units) + config.hidden_units + 1
        terms = a["steps_run"] * (step + config.output_vocab + params.personal_batch_size * longest)
        curve = np.asarray(a["_curve"])
        moved = np.abs(curve - curve[0]).max()
        np.testing.assert_allclose(b["_curve"], curve, rtol=0, atol=float32_deep_tolerance(terms, moved))
        change = abs(np.log(a["perplexity"]) - np.log(personal.score_weights(start, test)["perplexity"]))
        assert abs(np.log(b["perplexity"]) - np.log(a["perplexity"])) <= float32_deep_tolerance(terms, change)
        assert abs(b["top_k_eff"] - a["top_k_eff"]) <= test.word_len.max() / test.word_len.sum()


def test_user_groups_keep_the_one_user_job_keys_and_cover_every_user_in_order():
    """`users_together` 1 leaves the personalization jobs (keys, users) as they were, so runs resume."""
    from ondevice.papers.deeptype import protocol

    users = ["a/A", "b/B", "c/C"]
    one = protocol.group_jobs([0, 1], users, 1, len, lambda u: u.lower())
    assert [j.key for j in one] == [f"seed={s}/user={u}" for s in (0, 1) for u in users]
    assert [j.kwargs for j in one][:2] == [
        dict(seed=0, users=["a/A"], data=["a/a"]),
        dict(seed=0, users=["b/B"], data=["b/b"]),
    ]
    two = protocol.group_jobs([0], users, 2, len, lambda u: u)
    assert [j.key for j in two] == ["seed=0/users=a/A+b/B", "seed=0/users=c/C"]
    assert [u for j in two for u in j.kwargs["users"]] == users
