"""AutLearn A1/A2: FedAvg against the pooled gradient step, and the experiment's parameters."""

import numpy as np
import pandas as pd
import pytest
import tensorflow as tf
import tf_keras as keras

from numerics import assert_same_update, float32_sum_tolerance, lstm_terms, update_tolerance
from ondevice.data.typing_samples import Vocabulary, build_samples, sentences
from ondevice.models import lstm_lm
from ondevice.papers.autlearn import cloud_baselines, cloud_choice, common, customize_choice, fedavg_baseline, protocol
from ondevice.papers.autlearn.experiments import autlearn_accuracy as exp
from ondevice.papers.autlearn.techniques.fedavg import average, clients_alone, clients_together, fedavg
from ondevice.params import ParameterError
from ondevice.tasks import Signature, Task
from ondevice.tasks.classification import ClassificationTask
from ondevice.tasks.next_word import NextWordTask
from ondevice.training.bucketing import equal_length_batches
from ondevice.training.trainer import Plateau, Trainer


def _model():
    inputs = keras.Input((5,))
    hidden = keras.layers.Dense(6, activation="tanh", kernel_initializer=keras.initializers.GlorotUniform(seed=1))(
        inputs
    )
    return keras.Model(
        inputs, keras.layers.Dense(3, kernel_initializer=keras.initializers.GlorotUniform(seed=2))(hidden)
    )


def _clients(sizes):
    rng = np.random.default_rng(0)
    return {
        f"c{i}": (rng.normal(size=(n, 5)).astype(np.float32), rng.integers(0, 3, n).astype(np.int32))
        for i, n in enumerate(sizes)
    }


def _fedavg_and_pooled(sizes, local_epochs=1, batch_size=None):
    clients = _clients(sizes)
    task = ClassificationTask((5,), 3)
    model = _model()
    start = model.get_weights()
    trainer = Trainer(model, task, 0.5, "sgd")
    fed, history = fedavg(
        trainer,
        start,
        clients,
        rounds=1,
        clients_per_round=len(clients),
        local_epochs=local_epochs,
        batch_size=batch_size or max(sizes),
        seed=0,
    )
    assert history[0]["clients"] == len(clients) and history[0]["examples"] == sum(sizes)
    x = np.concatenate([c[0] for c in clients.values()])
    y = np.concatenate([c[1] for c in clients.values()])
    trainer.reset(start)
    trainer.step(x, y)  # one full-batch gradient step on the pooled data
    return fed, model.get_weights(), start


def test_fedavg_with_all_clients_and_one_full_batch_step_is_one_pooled_gradient_step():
    fed, pooled, start = _fedavg_and_pooled([8, 8, 8, 8])
    assert not all(np.allclose(a, b) for a, b in zip(fed, start))  # it did train
    # per-client gradients averaged vs one batch of 32: the forward sums of 5 + 1 and 6 + 1 terms, the
    # backward one of 3, the gradient's sum over the batch (8 or 32) and the average of 4 clients'
    # weights. A client left out or counted twice moves the result by ~25% of the step.
    for a, b, s in zip(fed, pooled, start):
        assert_same_update(a, b, s, terms=6 + 7 + 3 + 32 + 4)


def test_fedavg_differs_from_the_pooled_step_with_several_local_steps():
    fed, pooled, _ = _fedavg_and_pooled([8, 8, 8, 8], local_epochs=3)
    assert max(float(np.abs(a - b).max()) for a, b in zip(fed, pooled)) > 1e-3


def test_fedavg_weights_clients_by_their_examples():
    a, b = [np.array([0.0, 2.0])], [np.array([4.0, 6.0])]
    np.testing.assert_allclose(average([a, b], [3, 1])[0], [1.0, 3.0])
    with pytest.raises(ValueError, match="clients_per_round"):
        model = _model()
        fedavg(
            Trainer(model, ClassificationTask((5,), 3), 0.1, "sgd"),
            model.get_weights(),
            _clients([4, 4]),
            rounds=1,
            clients_per_round=3,
            local_epochs=1,
            batch_size=4,
            seed=0,
        )


def test_the_warm_up_ramps_the_client_rate_from_cloudtrains_step_to_k_times_it_round_by_round():
    ramp = fedavg_baseline.warmed(0.5, 4, 3)
    assert [ramp(r) for r in (0, 1, 2, 3, 9)] == pytest.approx([0.5, 1.0, 1.5, 2.0, 2.0])
    params = exp.Params.for_scale("default")
    assert params.fedavg_warmup_epochs == 1.0
    assert fedavg_baseline.warmup_rounds(params, 12, 1, 4) == 3  # an epoch of 12 clients' data, 4 a round
    assert fedavg_baseline.warmup_rounds(params, 12, 3, 4) == 1
    assert fedavg_baseline.warmup_rounds(exp.Params.for_scale("default", fedavg_warmup_epochs=0.0), 12, 1, 4) == 0
    with pytest.raises(ParameterError, match="fedavg_warmup_epochs"):
        exp.Params.for_scale("smoke", fedavg_warmup_epochs=-1.0)
    # the round's rate replaces the trainer's: a trainer at 9.0 with client_rate 0.1 is a trainer at 0.1
    clients, task, model = _clients([6, 6]), ClassificationTask((5,), 3), _model()
    start, trainer = model.get_weights(), Trainer(model, task, 9.0, "sgd")
    _, rows = fedavg(trainer, start, clients, 2, 2, 1, 3, seed=0, client_rate=lambda r: 0.1 * r)
    assert [row["client_rate"] for row in rows] == pytest.approx([0.1, 0.2])
    at_01, _ = fedavg(Trainer(model, task, 0.1, "sgd"), start, clients, 1, 2, 1, 3, seed=0)
    ramped, _ = fedavg(trainer, start, clients, 1, 2, 1, 3, seed=0, client_rate=lambda r: 0.1)
    at_9, _ = fedavg(Trainer(model, task, 9.0, "sgd"), start, clients, 1, 2, 1, 3, seed=0)
    for a, b in zip(at_01, ramped):
        np.testing.assert_array_equal(a, b)
    assert any(np.abs(a - b).max() > 1e-3 for a, b in zip(at_9, ramped))


LINES = (
    "To be, or not to be, that is the question. Whether 'tis nobler in the mind to suffer the slings and "
    "arrows. Or to take arms against a sea of troubles, and by opposing end them. To die, to sleep, no more. "
) * 3
LOCAL, BATCH = 1, 4


def test_lstm_clients_of_a_fedavg_round_together_match_the_clients_one_at_a_time():
    """AutLearn's LSTM clients (every layer, SGD, equal-length buckets, loss per position) of unequal
    sizes (20, 9 and 23 equal-length batches an epoch): each client's weights and the round's average with the
    clients in one `ManyUsers` (`fedavg_together`) against the per-client
    trainer, within the float32 rounding of the steps' chained sums (`numerics.update_tolerance`);
    a 1% other client rate lies outside it."""
    sents = sentences(LINES)
    vocab = Vocabulary.from_sentences(sents, 30)
    clients = {f"c{i}": build_samples(sents[a:b], vocab, 3) for i, (a, b) in enumerate(((0, 6), (2, 4), (5, 12)))}
    model = lstm_lm.build(lstm_lm.LSTMConfig(vocab.input_size, vocab.size, 8, 12), seed=3)
    start, params, picked = model.get_weights(), exp.Params.for_scale("smoke", fedavg_together=True), sorted(clients)
    assert fedavg_baseline.clients_together(params, "image", model, 0.1, 3) is None  # the MobileNet: one at a time
    assert fedavg_baseline.clients_together(exp.Params.for_scale("smoke"), "text", model, 0.1, 3) is None
    trainer = fedavg_baseline.client_trainer(params, "text", model, 1.0)
    many = fedavg_baseline.clients_together(params, "text", model, 1.0, len(clients))
    rngs = lambda: [np.random.default_rng(k) for k in range(len(picked))]  # noqa: E731
    alone, alone_loss = clients_alone(trainer, start, clients, picked, LOCAL, BATCH, rngs())
    got, got_loss = clients_together(many, start, clients, picked, LOCAL, BATCH, rngs())
    longest = max(int(c.lengths.max()) for c in clients.values())
    per_step = lstm_terms(longest, 8, 12) + 13 + vocab.size + BATCH * longest  # as tests/test_many_users.py
    steps = [LOCAL * len(equal_length_batches(clients[c].lengths, BATCH, None)) for c in picked]
    assert steps == [20, 9, 23]
    tolerances = [[update_tolerance(w, s, per_step * n) for w, s in zip(ws, start)] for ws, n in zip(alone, steps)]
    for k, (g, w, atol) in enumerate(zip(got, alone, tolerances)):
        for a, b, s, t in zip(g, w, start, atol):
            np.testing.assert_allclose(a - s, b - s, rtol=0, atol=t, err_msg=f"client {k}")
    np.testing.assert_allclose(got_loss, alone_loss, rtol=1e-4)
    # the round: the example-weighted average errs by at most its clients' largest error (+1 ulp for the cast)
    fed = [fedavg(trainer, start, clients, 1, 3, LOCAL, BATCH, seed=0, together=t)[0] for t in (None, many)]
    for i, (a, b) in enumerate(zip(*fed)):
        atol = max(t[i] for t in tolerances) + np.finfo(np.float32).eps * float(np.abs(b).max())
        np.testing.assert_allclose(a, b, rtol=0, atol=atol)
    # control: another client rate (1% off) moves a client's weights by more than the tolerance
    other, _ = clients_alone(
        fedavg_baseline.client_trainer(params, "text", model, 0.99), start, clients, picked, LOCAL, BATCH, rngs()
    )
    assert any(np.abs(a - b).max() > t for ws, os_, ts in zip(alone, other, tolerances) for a, b, t in zip(ws, os_, ts))


def test_paper_claims_follow_the_papers_direction():
    changes = {e.claim: e for e in exp.PAPER.effects}
    values = {n.quantity: n.value for n in exp.PAPER.numbers}
    for claim, effect in changes.items():
        assert values[effect.better] > values[effect.worse], claim  # every paper change is positive
    assert {c for c, *_ in exp.ORDERINGS} == {
        f"CloudCustomize beats {m} ({k})" for m in (exp.AUT, exp.CLOUD, exp.FED) for k in ("LSTM", "MobileNet")
    }


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("fedavg_clients", 0, "at least 1"),
        ("cloud_init", "imagenet", "'public' or 'scratch'"),
        ("mobilenet_alpha", 0.5, "declared ImageNet weights"),
        ("text_top_fraction", 0.0, r"\(0, 1\]"),
        ("image_size", 16, "at least 32"),
        ("text_personal_optimizer", "rmsprop", "'sgd' or 'adam'"),
    ],
)
def test_bad_parameters_fail_naming_the_parameter(name, value, message):
    with pytest.raises(ParameterError, match=f"'{name}' .*{message}"):
        exp.Params.for_scale("smoke", **{name: value})


def test_fedavg_rounds_and_clients_per_kind():
    p = exp.Params.for_scale("default")
    assert fedavg_baseline.rounds_and_clients(p, "text") == (p.fedavg_rounds, p.fedavg_clients)
    assert fedavg_baseline.rounds_and_clients(p, "image") == (p.image_fedavg_rounds, p.image_fedavg_clients)
    with pytest.raises(ParameterError, match="'text_fedavg_rate_candidates' .*positive"):
        exp.Params.for_scale("smoke", text_fedavg_rate_candidates=(0.1, -1.0))
    with pytest.raises(ParameterError, match="'fedavg_epoch_candidates' .*epochs >= 1"):
        exp.Params.for_scale("smoke", fedavg_epoch_candidates=())


def test_cloudtrain_and_fedavg_share_one_patience_per_kind():
    p = exp.Params.for_scale("smoke", cloud_patience=2, image_cloud_patience=6)
    assert p.plateau("image").patience == 6 and p.plateau("text").patience == 2
    shared = exp.Params.for_scale("smoke", cloud_patience=3, image_cloud_patience=0)  # 0: the shared field
    assert shared.plateau("image").patience == shared.plateau("text").patience == 3
    with pytest.raises(ParameterError, match="'image_cloud_patience'"):
        exp.Params.for_scale("smoke", image_cloud_patience=-1)


# ---- IID FedAvg reaches the centralized loss: a planted least-squares problem -------------------------


class LeastSquares(Task):
    """Half the mean squared error of a linear model's single output: a quadratic with a closed form."""

    signature = Signature(tf.TensorSpec([None, 3], tf.float32), tf.TensorSpec([None], tf.float32))

    def batches(self, data, batch_size, rng):
        order = rng.permutation(len(data[1])) if rng is not None else np.arange(len(data[1]))
        for s in range(0, len(order), batch_size):
            yield data[0][order[s : s + batch_size]], data[1][order[s : s + batch_size]]

    def loss(self, labels, outputs):
        return 0.5 * tf.reduce_mean(tf.square(outputs[:, 0] - labels))

    def size(self, data):
        return len(data[1])


def test_iid_fedavg_with_sgd_reaches_the_pooled_least_squares_loss_within_the_derived_tolerance():
    # y = x.w* + noise, IID clients of unequal sizes. Each round every client takes E full-batch gradient
    # steps of rate lr: w -> A_c w + (I - A_c) w_c, A_c = (I - lr H_c)^E, H_c = X_c'X_c / n_c, w_c the client's
    # least-squares solution. The example-weighted average has the fixed point w_f = (I - sum p_c A_c)^-1
    # sum p_c (I - A_c) w_c and contracts towards it by rho = ||sum p_c A_c|| (symmetric) per round; with
    # H the pooled X'X / n and w_hat the pooled solution, L(w) - L* = (w - w_hat)' H (w - w_hat) / 2. So after
    # R rounds from w_0: L(w_R) - L* <= lambda_max(H) / 2 (|w_f - w_hat| + rho^R |w_0 - w_f| + float32)^2,
    # float32: a round's E steps round sums of at most n_c terms each, and every round's error is contracted by rho.
    rng, sizes, lr, local, rounds = np.random.default_rng(3), [10, 30, 60, 200], 0.3, 3, 60
    w_star = np.array([1.0, -2.0, 0.5])
    x = rng.normal(size=(sum(sizes), 3))
    y = x @ w_star + 0.5 * rng.normal(size=len(x))
    bounds = np.cumsum([0, *sizes])
    clients = {
        f"c{i}": (x[a:b].astype(np.float32), y[a:b].astype(np.float32))
        for i, (a, b) in enumerate(zip(bounds, bounds[1:]))
    }
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")])
    trainer = Trainer(model, LeastSquares(), lr, "sgd")
    w_fed = fedavg(trainer, model.get_weights(), clients, rounds, len(clients), local, max(sizes), seed=0)[0][0][:, 0]

    p = np.array(sizes) / sum(sizes)
    hessians = [xc.T @ xc / len(xc) for xc in np.split(x, bounds[1:-1])]
    solutions = [
        np.linalg.lstsq(xc, yc, rcond=None)[0] for xc, yc in zip(np.split(x, bounds[1:-1]), np.split(y, bounds[1:-1]))
    ]
    a = [np.linalg.matrix_power(np.eye(3) - lr * h, local) for h in hessians]
    mean_a = sum(pc * ac for pc, ac in zip(p, a))
    w_fixed = np.linalg.solve(
        np.eye(3) - mean_a, sum(pc * (np.eye(3) - ac) @ wc for pc, ac, wc in zip(p, a, solutions))
    )
    h, w_hat = x.T @ x / len(x), np.linalg.lstsq(x, y, rcond=None)[0]
    rho = float(np.linalg.norm(mean_a, 2))
    loss = lambda w: 0.5 * float(np.mean((x @ w - y) ** 2))  # noqa: E731
    rounding = float32_sum_tolerance(max(sizes) * local, float(np.abs(w_fixed).sum())) / (1 - rho)
    distance = np.linalg.norm(w_fixed - w_hat) + rho**rounds * np.linalg.norm(w_fixed) + rounding
    tolerance = 0.5 * float(np.linalg.eigvalsh(h).max()) * distance**2
    assert rho < 0.9 and tolerance < 1e-3 * loss(w_hat)  # IID: the fixed point is the pooled optimum to 0.1%
    assert loss(w_hat) <= loss(w_fed) <= loss(w_hat) + tolerance
    # the bound is tight enough to fail on a bug: unweighted averaging (client sizes ignored) would end far outside
    unweighted = np.linalg.solve(
        np.eye(3) - np.mean(a, axis=0), np.mean([(np.eye(3) - ac) @ wc for ac, wc in zip(a, solutions)], axis=0)
    )
    assert loss(unweighted) > loss(w_hat) + 3 * tolerance


# ---- FedAvg and CloudTrain to convergence -----------------------------------------------------------


class Scripted:
    """An `evaluate` that returns the given held-out losses in turn and remembers the weights it scored."""

    def __init__(self, losses):
        self.losses, self.scored = list(losses), []

    def __call__(self, model):
        self.scored.append(model.get_weights())
        return {"holdout_loss": self.losses[len(self.scored) - 1]}


def _federation(rounds, losses, patience, evaluate_every=1):
    model = _model()
    trainer = Trainer(model, ClassificationTask((5,), 3), 0.5, "sgd")
    evaluate, stop = Scripted(losses), Plateau(patience, 0.0)
    rule = dict(evaluate=evaluate, stop=stop, evaluate_every=evaluate_every)
    weights, history = fedavg(trainer, model.get_weights(), _clients([6, 6, 6, 6]), rounds, 2, 1, 3, seed=0, **rule)
    return model, weights, history, evaluate


def test_fedavg_stops_at_the_plateau_and_keeps_the_best_rounds_weights():
    # rounds 1, 2 improve; 3 and 4 do not: patience 2 ends round 4 of at most 10, round 2 is kept
    model, weights, history, evaluate = _federation(10, [1.0, 0.8, 0.9, 0.85], patience=2)
    assert [r["round"] for r in history] == [1, 2, 3, 4]
    assert [r["holdout_loss"] for r in history] == [1.0, 0.8, 0.9, 0.85]
    assert history.best_round == 2 and history.plateau
    for kept, returned, left in zip(evaluate.scored[1], weights, model.get_weights()):
        np.testing.assert_array_equal(returned, kept)
        np.testing.assert_array_equal(left, kept)
    assert any(not np.array_equal(k, last) for k, last in zip(evaluate.scored[1], evaluate.scored[3]))


def test_fedavg_counts_patience_in_evaluations_and_scores_the_last_round():
    # scored after rounds 2, 4, 6 and 7 (the cap); patience 2 is reached at round 7 only
    _, _, history, evaluate = _federation(7, [1.0, 0.9, 0.95, 0.92], patience=2, evaluate_every=2)
    assert [r["round"] for r in history if "holdout_loss" in r] == [2, 4, 6, 7]
    assert len(history) == 7 and history.best_round == 4 and history.plateau
    # still improving at the cap: the cap ends it, the last round is kept
    _, _, capped, _ = _federation(3, [1.0, 0.9, 0.8], patience=2)
    assert len(capped) == 3 and capped.best_round == 3 and not capped.plateau


def test_fedavg_stop_needs_evaluate():
    model = _model()
    trainer = Trainer(model, ClassificationTask((5,), 3), 0.5, "sgd")
    with pytest.raises(ValueError, match="stop needs evaluate"):
        fedavg(trainer, model.get_weights(), _clients([4, 4]), 3, 1, 1, 4, seed=0, stop=Plateau(2))


def test_converge_fedavg_scores_the_start_and_every_epoch_of_examples():
    model = _model()
    trainer = Trainer(model, ClassificationTask((5,), 3), 0.5, "sgd")
    clients = _clients([6, 6, 6, 6, 6])  # 5 clients, 2 per round, 2 local epochs: every ceil(5 / 4) = 2 rounds
    evaluate = Scripted([2.0, 1.0, 0.5, 0.6, 0.7])
    start = model.get_weights()
    curve = cloud_baselines.converge_fedavg(trainer, start, clients, 15, 2, 2, 3, 0, evaluate=evaluate, stop=Plateau(2))
    scored = [p["step"] for p in curve if not np.isnan(p["holdout_loss"])]
    assert scored == [0, 2, 4, 6, 8] and [p["step"] for p in curve if p["kept"]] == [4]
    assert all(np.array_equal(a, b) for a, b in zip(evaluate.scored[0], start))  # round 0: the start
    assert curve[0]["examples_seen"] == 0 and curve[2]["examples_seen"] == 2 * 2 * 6 * 2
    assert curve[2]["epochs_seen"] == 48 / 30 and {p["ended_by"] for p in curve} == {"plateau"}
    evaluate = Scripted([2.0, 1.0, 0.5, 0.6, 0.7])  # an explicit `evaluate_every`
    rule = dict(evaluate=evaluate, stop=Plateau(2), evaluate_every=3)
    curve = cloud_baselines.converge_fedavg(trainer, start, clients, 15, 2, 2, 3, 0, **rule)
    assert [p["step"] for p in curve if not np.isnan(p["holdout_loss"])] == [0, 3, 6, 9, 12]


def test_holdout_loss_is_the_per_position_loss_over_both_parts_of_the_validation_users():
    text = ["the king is here. the queen is there.", "a king and a queen! where is the king?", "here is a fool."]
    sents = [sentences(t) for t in text]
    vocab = Vocabulary.from_sentences([s for part in sents for s in part], 12)
    samples = [build_samples(part, vocab, 2) for part in sents]
    validation = common.Validation(("a", "b"), {"a": samples[0], "b": samples[1]}, {"a": samples[2], "b": samples[2]})
    model = lstm_lm.build(lstm_lm.LSTMConfig(vocab.input_size, vocab.size, 4, 4, 1), seed=0)
    loss = cloud_baselines.holdout_loss("text", validation)(model)["holdout_loss"]
    pooled = build_samples(sents[0] + sents[2] + sents[1] + sents[2], vocab, 2)
    # per part, padded to its own length and summed by TensorFlow, vs pooled and summed by NumPy: the LSTM's
    # gate sums over the longest sample, the softmax's 4 + 1 terms, the log-sum-exp over the vocabulary and
    # the sum over every labelled position. Leaving a part out changes the loss by ~1e-4 of it (random weights:
    # every loss is near log 12), 4x the tolerance.
    terms = lstm_terms(int(pooled.lengths.max()), 4, 4, layers=1) + 5 + vocab.size + int((pooled.labels != 0).sum())
    expected = np.log(NextWordTask().evaluate(model, pooled)["perplexity"])
    assert loss == pytest.approx(expected, rel=float32_sum_tolerance(terms, 1.0))
    # CloudCustomize's choice stops on the test parts alone (its CloudTrain pools the training parts)
    later = customize_choice.later_parts_loss("text", validation)(model)["holdout_loss"]
    pooled = build_samples(sents[2] + sents[2], vocab, 2)
    assert later == pytest.approx(
        np.log(NextWordTask().evaluate(model, pooled)["perplexity"]), rel=float32_sum_tolerance(terms, 1.0)
    )
    assert abs(later - loss) > float32_sum_tolerance(terms, 1.0) * loss  # the training parts would move it
    with pytest.raises(ValueError, match="validation users"):
        cloud_baselines.holdout_loss("text", common.Validation((), {}, {}))


def _users_data(sizes):
    """A stand-in for TextData: users with distinct words (user u's words start with letter u)."""
    word = lambda u, i: "abcdefgh"[u] + "abcde"[i % 5]  # noqa: E731
    train = {f"user{u}": [[word(u, i), word(u, i + 1)] for i in range(n)] for u, n in enumerate(sizes)}
    vocab = Vocabulary.from_sentences([s for sents in train.values() for s in sents], 100)
    data = type("D", (), {})()
    data.users, data.train_sentences, data.vocab, data.context_words = list(train), train, vocab, 3
    data.train = {u: build_samples(s, vocab, 3) for u, s in train.items()}
    return data


def test_shuffled_clients_keep_the_data_and_the_client_sizes_but_mix_the_users():
    from ondevice.papers.autlearn import fedavg_ablation as ab

    data = _users_data([4, 7, 9])
    shuffled = ab.shuffled_clients("text", data, seed=0)
    assert [len(c) for c in shuffled.values()] == [len(data.train[u]) for u in data.users]  # samples per client
    key = lambda s: sorted(map(tuple, (s.inputs[s.offsets[j] : s.offsets[j + 1]] for j in range(len(s)))))  # noqa: E731
    pooled = [x for u in data.users for x in key(data.train[u])]
    assert sorted(x for c in shuffled.values() for x in key(c)) == sorted(pooled)  # the same samples, all of them
    owners = [{word[0] for word in _words(data, c)} for c in shuffled.values()]
    assert any(len(o) > 1 for o in owners)  # some client holds several users' sentences
    assert ab.shuffled_clients("text", data, seed=0).keys() == shuffled.keys()
    sets = ab.client_sets("FedAvg", "text", data, 0, ablate=False)
    assert list(sets) == ["FedAvg"] and sets["FedAvg"] is data.train
    assert list(ab.client_sets("FedAvg", "text", data, 0, ablate=True)) == ["FedAvg", ab.SHUFFLED]


def _words(data, samples) -> set[str]:
    ids = set(np.unique(samples.labels)) - {0, 1}
    return {data.vocab.words[i] for i in ids}


def test_fedavg_ablation_measures_the_non_iid_share_and_leaves_the_rows_open():
    import pandas as pd

    from ondevice.papers.autlearn import fedavg_ablation as ab
    from ondevice.report import claims

    rng = np.random.default_rng(0)
    rows = []
    for model, shuffled_gap in (("LSTM", 0.01), ("MobileNet", 0.20)):  # the paper: CloudTrain +1% on both
        for u in range(8):
            cloud = 0.50 + 0.01 * u
            for method, gap in ((exp.CLOUD, 0.0), (exp.FED, 0.20), (ab.SHUFFLED, shuffled_gap)):
                rows.append(dict(model=model, method=method, seed=0, user=f"u{u}", top1=cloud / (1 + gap)))
    users = pd.DataFrame(rows)
    table = ab.table(users, exp.PAPER, exp.CLOUD, exp.FED, 0, rng, 200)
    assert list(table.clients) == ["users (the protocol)", "shuffled (IID)"] * 2
    assert np.allclose(table[ab.ADVANTAGE], [0.20, 0.01, 0.20, 0.20])
    assert table.audit.iloc[1].startswith("agrees") and table.audit.iloc[3] == "unexplained"
    verdicts = ["passes: within 2% of CloudTrain's held-out loss", "fails: IID FedAvg's plateau is +6.4% above"]
    control = pd.DataFrame(dict(model=["LSTM", "MobileNet"], seed=0, verdict=verdicts))
    why = ab.diagnoses(table, control)
    # non-IID data is a property the paper's clients share: it never closes the row, even where shuffling agrees
    assert list(why) == ["CloudTrain beats FedAvg (LSTM)", "CloudTrain beats FedAvg (MobileNet)"]
    assert all(d.kind == claims.Kind.OPEN and d.section == ab.SECTION for d in why.values())
    lstm, mobilenet = why["CloudTrain beats FedAvg (LSTM)"].text, why["CloudTrain beats FedAvg (MobileNet)"].text
    assert "+1.0%" in lstm and "+20.0%" in lstm and "non-IID too" in lstm and verdicts[0] in lstm
    assert verdicts[1] in mobilenet


# ---- the cloud baselines' runs are stored: an interrupted notebook resumes ----------------------------


def test_a_finished_baseline_run_is_stored_and_reused_and_changed_data_trains_again(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("ONDEVICE_MODEL_CACHE", str(tmp_path))
    params, rng = exp.Params.for_scale("smoke"), np.random.default_rng(0)
    images = lambda n: (rng.normal(size=(n, 28, 28, 1)).astype(np.float32), rng.integers(0, 62, n).astype(np.int32))  # noqa: E731
    clients = {f"c{i}": images(12) for i in range(3)}
    holdout = cloud_baselines.holdout_loss("image", common.Validation(("v",), {"v": images(8)}, {"v": images(4)}))
    init = keras.initializers.GlorotUniform(seed=0)
    model = keras.Sequential(
        [keras.Input((28, 28, 1)), keras.layers.Flatten(), keras.layers.Dense(62, kernel_initializer=init)]
    )
    start = model.get_weights()

    def runs():
        fed = fedavg_baseline.train(params, "image", model, start, clients, holdout, 0, 1, 0.1, print)
        fed_weights = model.get_weights()
        model.set_weights(start)
        cloud = cloud_baselines.cloud_train(params, "image", model, start, clients["c0"], holdout, 0, print)
        return fed, fed_weights, cloud, model.get_weights()

    first = runs()
    assert "reusing" not in capsys.readouterr().out
    model.set_weights(start)
    again = runs()
    printed = capsys.readouterr().out
    assert (
        "[model cache] autlearn_fedavg: reusing" in printed and "[model cache] autlearn_cloudtrain: reusing" in printed
    )
    for curve, reused in ((first[0], again[0]), (first[2], again[2])):
        assert pd.DataFrame(curve).equals(pd.DataFrame(reused))  # NaN where a round was not scored, in both
        assert all(type(p["kept"]) is bool for p in reused) and sum(p["kept"] for p in reused) == 1
    for weights, reused in ((first[1], again[1]), (first[3], again[3])):
        assert all(np.array_equal(a, b) for a, b in zip(weights, reused))
    assert not np.array_equal(first[1][0], start[0])  # the stored weights are the run's, not the start
    clients["c1"][1][0] = (clients["c1"][1][0] + 1) % 62  # one label of one client changed: a new run
    fedavg_baseline.train(params, "image", model, start, clients, holdout, 0, 1, 0.1, print)
    assert "reusing" not in capsys.readouterr().out
    resized = exp.Params.for_scale("smoke", image_size=params.image_size + 8)  # MobileNet's input: same weights
    fedavg_baseline.train(resized, "image", model, start, clients, holdout, 0, 1, 0.1, print)
    assert "reusing" not in capsys.readouterr().out

    # the clients' step is built outside cloud_baselines: a changed client trainer (here Adam) trains again
    def adam_clients(params, kind, model, learning_rate):
        return Trainer(model, protocol.task(params, kind), learning_rate, "adam")

    monkeypatch.setattr(fedavg_baseline, "client_trainer", adam_clients)
    fedavg_baseline.train(params, "image", model, start, clients, holdout, 0, 1, 0.1, print)
    assert "reusing" not in capsys.readouterr().out
    assert len(list(tmp_path.glob("autlearn_fedavg-*"))) == 4 and len(list(tmp_path.glob("autlearn_cloudtrain-*"))) == 1


def test_the_fedavg_screen_trains_every_pair_its_rounds_and_only_the_best_on_to_its_plateau(monkeypatch, tmp_path):
    """With a screen, each candidate pair costs at most the screen's rounds; the best screened pair
    trains on from the same start with the same client draws, so its first rounds are the screen's."""
    from types import SimpleNamespace

    monkeypatch.setenv("ONDEVICE_MODEL_CACHE", str(tmp_path))
    fields = dict(fedavg_epoch_candidates=(1,), image_fedavg_rate_candidates=(0.001, 0.05), fedavg_evaluate_every=1)
    fields |= dict(image_fedavg_rounds=12, image_fedavg_screen_rounds=3, cloud_patience=20, image_cloud_patience=0)
    params, rng = exp.Params.for_scale("smoke", **fields), np.random.default_rng(0)
    images = lambda n: (rng.normal(size=(n, 28, 28, 1)).astype(np.float32), rng.integers(0, 4, n).astype(np.int32))  # noqa: E731
    validation = common.Validation(("v",), {"v": images(8)}, {"v": images(8)})
    data = SimpleNamespace(train={f"c{i}": images(12) for i in range(3)}, validation=validation)
    init = keras.initializers.GlorotUniform(seed=0)
    model = keras.Sequential(
        [keras.Input((28, 28, 1)), keras.layers.Flatten(), keras.layers.Dense(62, kernel_initializer=init)]
    )
    pre, printed = common.Pretrained(model, model.get_weights(), {}, False), []
    holdout = cloud_baselines.holdout_loss("image", validation)
    choice = fedavg_baseline.choose(params, "image", pre, data.train, holdout, printed.append)
    table, on = choice.table, [line for line in printed if "best screened candidate" in line]
    assert table["kept_step"].max() <= 3 and table["screen"].eq(3).all() and len(table) == 2
    assert table.clients.eq("users").all() and table.unit.eq("round").all()
    best = table[table.chosen].iloc[0]
    assert choice.learning_rate == best.learning_rate and len(on) == 1 and f"{best.learning_rate}" in on[0]
    assert len(list(tmp_path.glob("autlearn_fedavg-*"))) == 3  # two screens and the winner's whole run
    assert max(p["step"] for p in choice.curve) > 3  # past the screen (the plateau's patience is 20 rounds)
    assert table["chosen run: kept step"].notna().tolist() == table.chosen.tolist()
    quiet = lambda _: None  # noqa: E731
    screened = fedavg_baseline.train(
        params, "image", model, pre.weights, data.train, holdout, 0, 1, best.learning_rate, quiet, 3
    )
    first = {p["step"]: p["holdout_loss"] for p in screened if p["step"] < 3}
    again = {p["step"]: p["holdout_loss"] for p in choice.curve if p["step"] in first}
    np.testing.assert_allclose(list(again.values()), list(first.values()))  # the same first rounds
    assert {p["phase"] for p in screened} == {0} and {p["phase"] for p in choice.curve} == {0, 1}  # smoke: one cut
    cut = [p for p in choice.curve if p["phase"] == 1]
    assert cut[0]["learning_rate"] == pytest.approx(0.2 * best.learning_rate) and cut[0]["step"] > cut[0]["phase_step"]
    with pytest.raises(ParameterError, match="image_fedavg_screen_rounds"):
        exp.Params.for_scale("smoke", image_fedavg_rounds=12, image_fedavg_screen_rounds=12)


def test_cloudtrain_screens_adam_and_sgd_on_validation_users_and_only_the_best_trains_on(monkeypatch, tmp_path):
    """CloudTrain's candidates (Adam at the preset's rate, then SGD at the FedAvg grid) each train
    the screen's epochs; the lowest validation loss wins and trains on from the same start with its
    cuts, and is the first seed's CloudTrain; a later seed trains with the chosen optimizer."""
    from types import SimpleNamespace

    monkeypatch.setenv("ONDEVICE_MODEL_CACHE", str(tmp_path))
    fields = dict(image_fedavg_rate_candidates=(0.001, 0.05), image_cloud_learning_rate=0.002, image_cloud_epochs=8)
    fields |= dict(image_cloud_screen_epochs=2, cloud_patience=20, image_cloud_patience=0)
    params, rng = exp.Params.for_scale("smoke", **fields), np.random.default_rng(0)
    images = lambda n: (rng.normal(size=(n, 28, 28, 1)).astype(np.float32), rng.integers(0, 4, n).astype(np.int32))  # noqa: E731
    validation, pooled = common.Validation(("v",), {"v": images(8)}, {"v": images(8)}), images(24)
    data = SimpleNamespace(validation=validation, pooled_train=lambda: pooled)
    init = keras.initializers.GlorotUniform(seed=0)
    model = keras.Sequential(
        [keras.Input((28, 28, 1)), keras.layers.Flatten(), keras.layers.Dense(62, kernel_initializer=init)]
    )
    pre, printed = common.Pretrained(model, model.get_weights(), {}, False), []
    choice = cloud_choice.choose(params, "image", data, pre, printed.append)
    table = choice.table
    assert table[["optimizer", "learning_rate"]].values.tolist() == [["adam", 0.002], ["sgd", 0.001], ["sgd", 0.05]]
    assert table.kept_step.max() <= 2 and table.screen.eq(2).all() and table.unit.eq("epoch").all()
    best = table[table.chosen].iloc[0]
    assert best["validation holdout loss"] == table["validation holdout loss"].min()
    assert (choice.optimizer, choice.learning_rate) == (best.optimizer, best.learning_rate)
    assert sum("best screened candidate" in line for line in printed) == 1
    assert len(list(tmp_path.glob("autlearn_cloudtrain-*"))) == 4  # three screens and the winner's whole run
    assert max(p["step"] for p in choice.curve) > 2 and {p["phase"] for p in choice.curve} == {0, 1}  # smoke: one cut
    holdout = cloud_baselines.holdout_loss("image", validation)
    quiet = lambda _: None  # noqa: E731
    screened = cloud_baselines.cloud_train(
        params, "image", model, pre.weights, pooled, holdout, 0, quiet, best.optimizer, best.learning_rate, 2
    )
    first = [p["holdout_loss"] for p in screened]
    np.testing.assert_allclose([p["holdout_loss"] for p in choice.curve[: len(first)]], first)  # the same epochs
    assert cloud_choice.train(params, "image", data, pre, holdout, 0, choice, quiet) is choice.curve
    assert all(np.array_equal(a, b) for a, b in zip(model.get_weights(), choice.weights))
    later = cloud_choice.train(params, "image", data, pre, holdout, 1, choice, quiet)
    assert {p["optimizer"] for p in later} == {choice.optimizer} and len(list(tmp_path.glob("autlearn_cl*"))) == 5
    with pytest.raises(ParameterError, match="image_cloud_screen_epochs"):
        exp.Params.for_scale("smoke", image_cloud_epochs=8, image_cloud_screen_epochs=8)


def test_fedavg_clients_step_at_the_rate_times_the_clients_a_round(monkeypatch, tmp_path):
    """Averaging K clients' steps is one step of a K-times larger batch: each client steps at the
    grid's rate x K, through every rate cut, and the curve says at which."""
    monkeypatch.setenv("ONDEVICE_MODEL_CACHE", str(tmp_path))
    fields = dict(image_fedavg_rounds=4, image_fedavg_screen_rounds=0, image_fedavg_clients=3, fedavg_evaluate_every=1)
    params = exp.Params.for_scale("smoke", **fields)
    rng = np.random.default_rng(0)
    images = lambda n: (rng.normal(size=(n, 28, 28, 1)).astype(np.float32), rng.integers(0, 4, n).astype(np.int32))  # noqa: E731
    clients = {f"c{i}": images(8) for i in range(4)}
    holdout = cloud_baselines.holdout_loss("image", common.Validation(("v",), {"v": images(8)}, {"v": images(8)}))
    init = keras.initializers.GlorotUniform(seed=0)
    model = keras.Sequential(
        [keras.Input((28, 28, 1)), keras.layers.Flatten(), keras.layers.Dense(62, kernel_initializer=init)]
    )
    real, stepped = fedavg_baseline.client_trainer, []

    def recording(params, kind, model, learning_rate):
        trainer = real(params, kind, model, learning_rate)
        fit = trainer.fit
        trainer.fit = lambda *args, **kwargs: stepped.append(trainer.learning_rate) or fit(*args, **kwargs)
        return trainer

    monkeypatch.setattr(fedavg_baseline, "client_trainer", recording)
    curve = fedavg_baseline.train(params, "image", model, model.get_weights(), clients, holdout, 0, 1, 0.05, print)
    # the warm-up (an epoch of 4 clients' data at 3 a round: 2 rounds) from 0.05 to 3 x 0.05, then 3 x 0.05, then
    # smoke's one cut: 3 x 0.01, never warmed again
    assert sorted(set(np.round(stepped, 9))) == [0.03, 0.1, 0.15]
    warm = fedavg_baseline.warmed(0.05, 3, fedavg_baseline.warmup_rounds(params, 4, 1, 3))
    for p in curve:
        ramped = p["phase"] == 0 and 0 < p["phase_step"] <= 2
        assert p["client_rate"] == pytest.approx(warm(p["phase_step"]) if ramped else 3 * p["learning_rate"]), p


def test_mobilenet_trained_in_every_layer_adapts_its_batch_norm_and_scores_with_the_adapted_statistics():
    """CloudTrain and FedAvg train MobileNet through `every_layer`: the same variables, batch
    normalisation in training mode (its moving statistics move), while the model itself stays in
    inference mode (a call with training=True moves nothing: AutLearn's head step relies on it)."""
    from ondevice.models import mobilenet_v1

    model = mobilenet_v1.build(None, 0.25, 32, 62, seed=0)
    whole = cloud_baselines.every_layer(model, "image")
    assert whole is not model and [id(v) for v in whole.weights] == [id(v) for v in model.weights]
    bn = next(v for v in model.weights if "moving_mean" in v.name)
    x = np.random.default_rng(0).random((4, 28, 28, 1)).astype(np.float32)
    before = bn.numpy().copy()
    model(x, training=True)
    assert np.array_equal(bn.numpy(), before)  # the model's own calls never update the statistics
    trainer = Trainer(whole, common.image_task(), 0.01, "sgd")
    trainer.step(x, np.arange(4, dtype=np.int32))
    assert not np.array_equal(bn.numpy(), before)  # the training of every layer adapts them
    np.testing.assert_allclose(whole(x, training=False).numpy(), model(x, training=False).numpy(), rtol=1e-5)
    lstm = lstm_lm.build(lstm_lm.LSTMConfig(10, 10, 4, 4, 1), seed=0)
    assert cloud_baselines.every_layer(lstm, "text") is lstm


def test_the_iid_control_passes_within_its_tolerance_below_cloudtrain_included():
    verdict = fedavg_baseline._verdict
    assert verdict(0.015, 0.02, "plateau").startswith("passes: within 2% of CloudTrain's")
    assert verdict(-0.094, 0.02, "plateau").startswith("passes")  # one-sided: below CloudTrain is no failure
    assert verdict(0.064, 0.02, "plateau").startswith("fails: IID FedAvg's plateau is +6.4% above CloudTrain's")
    assert verdict(0.064, 0.02, "cap").startswith("fails: the round cap ended")
    assert verdict(float("nan"), 0.02, "plateau").startswith("fails")


def test_the_iid_control_is_judged_against_the_chosen_cloudtrain_the_rows_compare_with():
    """The known answer is the chosen CloudTrain itself, the baseline of the rows the control vouches
    for; the users' FedAvg is shown beside it; seeds without shuffled clients have no row."""

    def curve(method, seed, losses):
        return [
            dict(model="LSTM", seed=seed, method=method, step=i, holdout_loss=v, examples_seen=i, epochs_seen=i)
            | dict(unit="epoch", cap=9, ended_by="plateau", kept=v == min(losses))
            for i, v in enumerate(losses)
        ]

    history = curve(exp.CLOUD, 0, [3.0, 2.9])
    history += curve(exp.fedavg_ablation.SHUFFLED, 0, [3.2, 2.929]) + curve(exp.FED, 0, [3.3, 3.1])
    history += curve(exp.CLOUD, 1, [3.0, 2.95]) + curve(exp.FED, 1, [3.3, 3.2])
    table = fedavg_baseline.control_table(history, 0.02, exp.CLOUD, exp.FED)
    assert len(table) == 1 and table.seed.iloc[0] == 0
    row = table.iloc[0]
    assert row.cloudtrain_loss == 2.9 and row.relative_gap == pytest.approx(0.01) and row.verdict.startswith("passes")
    assert row.users_fedavg_loss == 3.1 and row.users_gap_to_cloudtrain == pytest.approx(3.1 / 2.9 - 1)
