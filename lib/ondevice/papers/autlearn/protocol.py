"""AutLearn's method, once: the on-device step (transfer learning: the last layer of the public
pre-trained model trains on one user's data), its learning rate chosen on validation users, online
learning from the inference cache, the step timed on a compiler path and online updates timed with
and without the cache, and the cloud's compression of the public model within an accuracy budget
(Sec. 3.2-3.5). Every AutLearn experiment trains users through `PersonalTrainer` and the per-kind
fields `<kind>_personal_{optimizer,learning_rate,epochs,batch_size}`.

The last-layer hook (`FineTune`), equal-length bucketing, the inference cache and the SVD of the
softmax are DeepType's modules: AutLearn (same first author) names the same methods (Sec. 3.3:
bucketing [23]; Sec. 3.5: the inference-training cache; Sec. 3.2: SVD-based compression).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pandas as pd
import tensorflow as tf
import tf_keras as keras

from ondevice import streams
from ondevice.data import femnist
from ondevice.data.typing_samples import Samples, batch_indices, build_samples
from ondevice.models import mobilenet_v1, svd_compression
from ondevice.papers.autlearn import common
from ondevice.papers.autlearn.common import LAST_LAYER, MODEL_NAMES, image_features
from ondevice.papers.autlearn.techniques import compiler, magnitude_pruning, pruning
from ondevice.papers.autlearn.techniques.fedavg import fedavg
from ondevice.tasks.bucketing import EqualLength
from ondevice.tasks.classification import ClassificationTask
from ondevice.tasks.next_word import NextWordTask, masked_cross_entropy, position_scores
from ondevice.training import selection
from ondevice.training.fine_tune import FineTune
from ondevice.training.inference_reuse import OnlineTrainer
from ondevice.training.trainer import Plateau, Trainer


class Setting(NamedTuple):
    optimizer: str
    learning_rate: float
    epochs: int
    batch_size: int


def setting(params, kind: str) -> Setting:
    """The on-device step's optimizer, rate, epochs and batch size of a model kind."""
    if kind not in common.KINDS:
        raise ValueError(f"kind must be one of {common.KINDS}, got {kind!r}")
    return Setting(*(getattr(params, f"{kind}_personal_{f}") for f in Setting._fields))


def task(params, kind: str):
    return NextWordTask(params.k) if kind == "text" else common.image_task()


def last_layer(kind: str) -> FineTune:
    """AutLearn's transfer learning: only the last layer trains (LSTM: the softmax; MobileNet: the
    FC head, whose softmax is in the loss)."""
    if kind not in common.KINDS:
        raise ValueError(f"kind must be one of {common.KINDS}, got {kind!r}")
    return FineTune(LAST_LAYER[kind])


def batches(params, kind: str, data, batch_size: int, rng) -> list:
    """One epoch's batches of a user's data: equal-length buckets for the LSTM (the paper's bucketing)."""
    if kind == "text":
        return list(EqualLength().batches(NextWordTask(params.k), data, batch_size, rng))
    return list(common.image_task().batches(data, batch_size, rng))


def score(params, kind: str, model, test) -> dict:
    return common.score_text(model, test, params.k) if kind == "text" else common.score_image(model, test)


class PersonalTrainer:
    """One user's on-device step: from given start weights, train the last layer only on the
    user's training data with a fresh optimizer; afterwards `model` holds the user's model.

    Text: a Trainer of the whole LSTM with the `last_layer` hook and equal-length buckets. Images:
    the backbone is frozen and in inference mode, so its features of a user's images are computed
    once and the head trains on them (the same variables and gradients as the hook on the whole
    model, a forward pass cheaper per step)."""

    def __init__(self, params, kind: str, model: keras.Model):
        self.kind, self.model, self.setting = kind, model, setting(params, kind)
        opt, lr = self.setting.optimizer, self.setting.learning_rate
        if kind == "text":
            self.trainer = Trainer(model, NextWordTask(params.k), lr, opt, hooks=[last_layer(kind), EqualLength()])
        else:
            head = mobilenet_v1.head_model(model)
            self.trainer = Trainer(head, ClassificationTask(head.input_shape[1:], femnist.CLASSES), lr, opt)

    def fit(self, start: list[np.ndarray], train, rng: np.random.Generator, epochs: int | None = None) -> list[dict]:
        """Train from `start` on `train` (Samples, or (images, labels)); the per-epoch history."""
        self.model.set_weights(start)
        self.trainer.reset(self.trainer.model.get_weights())  # zero optimizer state, same weights
        if self.kind == "image":
            train = (image_features(self.model, train[0]), train[1])
        epochs = self.setting.epochs if epochs is None else epochs
        return self.trainer.fit(train, epochs, self.setting.batch_size, rng)


def choose_rate(params, kind: str, data, pre: common.Pretrained, log=print):
    """AutLearn's on-device learning rate for one kind, chosen on the validation users: each
    candidate runs the on-device step from the public model on every validation user's earlier
    part and is scored by the mean top-1 on their later parts (ties: the earlier candidate). The
    params with the chosen rate, and the table of every candidate's score (with the public model's
    own score as a reference row, rate 0). No candidates or no validation users: the preset's rate."""
    name, model = f"{kind}_personal_learning_rate", MODEL_NAMES[kind]
    candidates, val = getattr(params, f"{kind}_rate_candidates"), data.validation
    if not candidates or not val.users:
        log(f"{model}: on-device rate {getattr(params, name)} from the preset (nothing to choose on)")
        return params, pd.DataFrame()
    top1 = lambda u: score(params, kind, pre.model, val.test[u])["top1"]

    def mean_top1(candidate: dict) -> float:
        step = PersonalTrainer(dataclasses.replace(params, **{name: candidate["learning_rate"]}), kind, pre.model)
        tops = []
        for u in val.users:
            step.fit(pre.weights, val.train[u], streams.rng(params.seed, f"validation/{kind}/{u}"))
            tops.append(top1(u))
        return float(np.mean(tops))

    best, table = selection.select([{"learning_rate": c} for c in candidates], mean_top1, log)
    pre.model.set_weights(pre.weights)
    reference = float(np.mean([top1(u) for u in val.users]))  # rate 0: the public model itself, not a candidate
    table = pd.concat([table, pd.DataFrame([{"learning_rate": 0.0, "score": reference, "chosen": False}])])
    table = table.reset_index(drop=True).rename(columns={"score": "validation mean top-1"})
    table = table.assign(model=model, optimizer=getattr(params, f"{kind}_personal_optimizer"))
    table = table.assign(validation_users=len(val.users))
    log(
        f"{model}: on-device rate {best['learning_rate']} chosen on {len(val.users)} validation users "
        f"(mean top-1 {table.loc[table.chosen, 'validation mean top-1'].iloc[0]:.4f}; public model {reference:.4f})"
    )
    return dataclasses.replace(params, **{name: best["learning_rate"]}), table


def choose_rates(params, text, images, pre: dict[str, common.Pretrained], log=print):
    """Both models' on-device rates (`choose_rate` per kind): the params to train users with, and
    one selection table."""
    tables = []
    for kind, data in (("text", text), ("image", images)):
        params, table = choose_rate(params, kind, data, pre[kind], log)
        tables.append(table)
    return params, pd.concat(tables, ignore_index=True)


# ---- the cloud baselines trained to convergence (autlearn_accuracy: CloudTrain, FedAvg) ---------


def holdout_loss(kind: str, validation: common.Validation):
    """The cloud baselines' stopping criterion: model -> {"holdout_loss": mean cross-entropy} over
    all of the validation users' data, both parts (LSTM: per labelled position, as its training
    loss; MobileNet: per image). Validation users are neither pooled by CloudTrain nor FedAvg
    clients, so both parts are held out, and both (5x the later part's words, 10x its images) make
    a loss compared at a 0.5% threshold steadier; no test user's data enters it. It measures what a
    model without per-user training is for: users it has not seen."""
    if not validation.users:
        raise ValueError("the stopping rule needs validation users (validation_users >= 1)")
    parts = [part[u] for u in validation.users for part in (validation.train, validation.test)]
    if kind == "image":
        pooled = tuple(np.concatenate([p[i] for p in parts]) for i in (0, 1))
        return lambda model: {"holdout_loss": common.image_task().evaluate(model, pooled)["loss"]}

    batches = [samples.padded(idx) for samples in parts for idx in batch_indices(samples, 256, None)]
    spec = [tf.TensorSpec([None, None], tf.int32)] * 2
    compiled = {}  # per model: one graph for every batch shape (eager LSTM calls are several times slower)

    def text_loss(model) -> dict:
        if id(model) not in compiled:
            compiled[id(model)] = tf.function(lambda x, y: masked_cross_entropy(y, model(x, training=False)), spec)
        sums = np.array([[float(v) for v in compiled[id(model)](x, y)] for x, y in batches])
        return {"holdout_loss": float(sums[:, 0].sum() / sums[:, 1].sum())}

    return text_loss


def _point(step: int, examples: int, total: int, train_loss: float, row: dict) -> dict:
    seen = dict(examples_seen=int(examples), epochs_seen=examples / total)
    return dict(step=step, **seen, train_loss=train_loss, holdout_loss=row.get("holdout_loss", np.nan))


def _ended(points: list[dict], unit: str, kept: int, plateau: bool, cap: int) -> list[dict]:
    """The curve's rows, each saying which one was kept and whether the plateau or the cap ended it."""
    ending = dict(unit=unit, ended_by="plateau" if plateau else "cap", cap=cap)
    return [p | ending | {"kept": p["step"] == kept} for p in points]


def converge_cloud(trainer: Trainer, data, max_epochs: int, batch_size: int, rng, evaluate, stop, log, label: str):
    """CloudTrain to convergence: `Trainer.fit` on the pooled data from the trainer's weights, the
    start scored first (epoch 0), at most `max_epochs`, ending at `stop`'s plateau of `evaluate`
    and leaving the kept epoch's weights in the model. Its curve: a row per epoch."""
    total = trainer.task.size(data)
    history = trainer.fit(data, max_epochs, batch_size, rng, log, label, evaluate, stop, evaluate_first=True)
    points = [_point(r["epoch"], r["epoch"] * total, total, r["loss"], r) for r in history]
    return _ended(points, "epoch", history.best_epoch, history.plateau, max_epochs)


def converge_fedavg(
    trainer: Trainer,
    start,
    clients: dict,
    cap: int,
    per_round: int,
    local: int,
    batch_size: int,
    seed: int,
    *,
    evaluate,
    stop: Plateau,
    evaluate_every: int = 0,
    log=None,
):
    """FedAvg to convergence: the start scored (round 0), then at most `cap` rounds of `fedavg`
    ending at `stop`'s plateau of `evaluate`, scored every `evaluate_every` rounds (0: about one
    epoch-equivalent, ceil(clients / (per_round x local)) rounds, so that a patience means as much
    data as CloudTrain's epochs). Its curve: a row per round (held-out loss NaN between evaluations)."""
    total = sum(trainer.task.size(c) for c in clients.values())
    every = evaluate_every or math.ceil(len(clients) / (per_round * local))
    trainer.reset(start)
    first = _point(0, 0, total, np.nan, evaluate(trainer.model))
    rule = dict(log=log, evaluate=evaluate, stop=stop, evaluate_every=every)
    _, rounds = fedavg(trainer, start, clients, cap, per_round, local, batch_size, seed, **rule)
    seen = np.cumsum([r["examples"] * local for r in rounds])
    points = [first] + [_point(r["round"], n, total, r["client_loss"], r) for r, n in zip(rounds, seen)]
    return _ended(points, "round", rounds.best_round, rounds.plateau, cap)


def scratch_weights(params, kind: str, data, seed: int) -> list[np.ndarray]:
    """Random initial weights of the same model (the cloud baselines with cloud_init = "scratch")."""
    if kind == "text":
        return common.text_model(params, data, seed).get_weights()
    init = streams.tf_seed(seed, "init/autlearn-head")
    return mobilenet_v1.build(None, params.mobilenet_alpha, params.image_size, femnist.CLASSES, seed=init).get_weights()


def augmented_steps(params, kind: str, data, pre: common.Pretrained, augment, unit: str, log) -> pd.DataFrame:
    """On-device data augmentation (Sec. 3.4), per user: the on-device step on the training part
    without and with the generated samples (`augment(user)`: the training set with them, and how many
    were generated), scored on the test part; `unit` names what is counted (sentences, images)."""
    step, task_, rows = PersonalTrainer(params, kind, pre.model), task(params, kind), []
    for user in data.users:
        for condition, (train, made) in (("without", (data.train[user], 0)), ("with", augment(user))):
            step.fit(pre.weights, train, streams.rng(params.seed, f"personal/{user}"))
            s = score(params, kind, step.model, data.test[user])
            row = dict(model=MODEL_NAMES[kind], user=user, augmentation=condition, train_samples=task_.size(train))
            counts = {f"generated_{unit}": made, f"original_{unit}": _originals(data, user)}
            rows.append(row | counts | {"test_samples": task_.size(data.test[user])} | s)
    out = pd.DataFrame(rows).drop(columns=["perplexity", "loss"], errors="ignore")
    means = out.groupby("augmentation", sort=False).top1.mean()
    log(f"{MODEL_NAMES[kind]}, {len(data.users)} users: mean top-1 {means['without']:.4f} -> {means['with']:.4f}")
    return out


def _originals(data, user: str) -> int:
    """A user's original training sentences (text) or images."""
    return len(data.train_sentences[user]) if isinstance(data, common.TextData) else len(data.train[user][1])


# ---- online learning -------------------------------------------------------------------------


def stream_pass(
    trainer: OnlineTrainer, start: list[np.ndarray], n: int, batch, hits, batch_size: int, train: bool
) -> tuple[np.ndarray, int]:
    """Online learning (Sec. 3.4): predict every sample of a stream of n in order with the model of
    that moment: `batch(idx)` gives (inputs, labels), `hits(logits, idx, labels)` 1/0 per sample
    (NaN: not scored). With `train`, each full buffer of `batch_size` then trains the last layer from
    the cached features (a last partial buffer is not trained on). Returns the hits and the updates."""
    trainer.reset(start)
    b = batch_size if train else max(batch_size, 256)  # no updates: the same predictions, faster
    out, steps = np.full(n, np.nan), 0
    for first in range(0, n, b):
        idx = np.arange(first, min(first + b, n))
        x, y = batch(idx)
        cached = trainer.infer_and_cache(x)
        out[idx] = hits(cached["logits"].numpy(), idx, y)
        if train and len(idx) == b:
            trainer.train_from_cache(cached["features"], y)
            steps += 1
    return out, steps


def stream_parts(hit: np.ndarray, last_fraction: float) -> dict[str, float]:
    """Top-1 over the scored samples of a stream, and over its last `last_fraction` of them."""
    scored = np.flatnonzero(~np.isnan(hit))
    last = scored[len(scored) - max(1, int(round(last_fraction * len(scored)))) :]
    return {"stream": float(hit[scored].mean()), "last": float(hit[last].mean())}


def stream_curve(hit: np.ndarray, points: int) -> list[dict]:
    """Cumulative top-1 at `points` evenly spaced positions of the scored samples."""
    scored = hit[~np.isnan(hit)]
    at = np.unique(np.linspace(0, len(scored), points + 1).round().astype(int)[1:])
    total = np.cumsum(scored)
    return [{"samples": int(p), "fraction": p / len(scored), "cumulative_top1": total[p - 1] / p} for p in at]


def online_trainer(params, kind: str, model, optimizer: str | None = None, learning_rate: float | None = None):
    """AutLearn's online trainer: the last layer trains from the features the prediction cached
    (DeepType's inference reuse), by the on-device step's optimizer and rate unless given."""
    s = setting(params, kind)
    opt, lr = optimizer or s.optimizer, learning_rate or s.learning_rate
    return OnlineTrainer(model, task(params, kind), lr, opt, head=LAST_LAYER[kind])


def text_stream(text: common.TextData, user: str):
    """A user's sentences in order (training part, then test part) as a stream (n, batch, hits):
    a sample is scored when it has a previous word (top-1 before any character is typed)."""
    samples = build_samples(text.train_sentences[user] + text.test_sentences[user], text.vocab, text.context_words)
    one = tf.constant(1)

    def hits(logits, idx, y):
        hit = position_scores(tf.constant(logits), tf.constant(y), one)[0].numpy()
        ctx = samples.n_context[idx]
        return np.where(ctx > 0, hit[np.arange(len(idx)), np.maximum(ctx - 1, 0)], np.nan)

    return len(samples), samples.padded, hits


def image_stream(x: np.ndarray, y: np.ndarray):
    """Images in order as a stream (n, batch, hits): every image is scored."""
    return len(y), lambda idx: (x[idx], y[idx]), lambda logits, idx, labels: (logits.argmax(1) == labels).astype(float)


def online_rows(params, kind: str, trainer, start, user_streams: dict, log):
    """Each user's stream (n, batch, hits) through `stream_pass` without and with online updates:
    a row per user and condition (top-1 over the stream and on its last part) and the curve."""
    rows, curve, model, p = [], [], MODEL_NAMES[kind], params
    for user, (n, batch, hits) in user_streams.items():
        for condition in ("pre-trained", "online"):
            hit, steps = stream_pass(trainer, start, n, batch, hits, p.online_batch_size, condition == "online")
            who = dict(model=model, user=user, condition=condition)
            scored = dict(stream_samples=n, scored_samples=int((~np.isnan(hit)).sum()), updates=steps)
            rows.append(who | scored | {f"top1_{k}": v for k, v in stream_parts(hit, p.last_fraction).items()})
            curve += [who | c for c in stream_curve(hit, p.curve_points)]
        before, after = rows[-2], rows[-1]
        log(
            f"{model} {user} ({n} samples): top-1 over the stream {before['top1_stream']:.4f} -> "
            f"{after['top1_stream']:.4f} online, last part {before['top1_last']:.4f} -> {after['top1_last']:.4f}"
        )
    return pd.DataFrame(rows), pd.DataFrame(curve)


def online_candidate(text: str) -> tuple[str, float] | None:
    """An online update "optimizer:rate" ('sgd:0.01' -> ('sgd', 0.01)); None when malformed."""
    name, _, rate = text.partition(":")
    try:
        value = float(rate)
    except ValueError:
        return None
    return (name, value) if name in ("sgd", "adam") and value > 0 else None


def image_roles(params, images: common.ImageData) -> dict[str, tuple[str, ...]]:
    """Writers by role, drawn at random from their own stream: "head" and "validation" (public,
    the cloud's) and "users" (the streaming users) for A4; the same for every seed."""
    order = streams.rng(params.seed, "autlearn/public-writers").permutation(len(images.users))
    n_public = max(2, min(len(order) - 2, round(params.image_public_fraction * len(order))))
    n_val = max(1, min(n_public - 1, round(params.image_validation_fraction * n_public)))
    pick = lambda idx: tuple(sorted(images.users[i] for i in idx))
    return {"head": pick(order[n_val:n_public]), "validation": pick(order[:n_val]), "users": pick(order[n_public:])}


def online_images(params, images: common.ImageData, pre: common.Pretrained, roles: dict, candidates, log):
    """A4 for MobileNet: the cloud trains the head on its public writers (`roles["head"]`) and
    chooses the online update among `candidates` on its validation writers by online's gain; each
    user's images in LEAF's order (training part, then test part) then stream through that head,
    with and without online updates. Returns the users' rows and curve, the selection table, the
    update chosen."""
    pooled = images.pooled(roles["head"], ("train", "test"))
    PersonalTrainer(params, "image", pre.model).fit(pre.weights, pooled, streams.rng(params.seed, "batches/cloud-head"))
    start = pre.model.get_weights()
    log(f"cloud head trained on {len(roles['head'])} public writers ({len(pooled[1])} images)")
    stream = lambda users: {u: image_stream(*images.pooled([u], ("train", "test"))) for u in users}
    trainer = lambda candidate: online_trainer(params, "image", pre.model, *online_candidate(candidate))

    def gain(candidate: dict) -> float:
        update, quiet = trainer(candidate["update"]), lambda _: None
        rows, _ = online_rows(params, "image", update, start, stream(roles["validation"]), quiet)
        wide = rows.pivot(index="user", columns="condition", values="top1_stream")
        return float((wide["online"] - wide["pre-trained"]).mean())

    best, table = selection.select([{"update": c} for c in candidates], gain, log)
    table = table.rename(columns={"score": "validation gain (top-1, absolute)"})
    rows, curve = online_rows(params, "image", trainer(best["update"]), start, stream(roles["users"]), log)
    return rows, curve, table, best["update"]


def time_steps(step, batches: list, timing_steps: int, warmup_steps: int, repeats: int = 1) -> tuple[float, int]:
    """Steady-state seconds per step and the steps timed per pass: the first `timing_steps`
    batches, in order, after every distinct batch shape among them ran `warmup_steps` times untimed
    (tracing; XLA compiles once per shape), timed in `repeats` passes: the median of the passes'
    mean step times, so that one disturbed pass on a shared machine does not move the result."""
    seen = {}
    for x, y in batches[:timing_steps]:
        seen.setdefault(np.shape(x), (x, y))
    for x, y in seen.values():
        for _ in range(warmup_steps):
            step(x, y)
    means = []
    for _ in range(repeats):
        times = []
        for x, y in batches[:timing_steps]:
            t0 = time.perf_counter()
            step(x, y)
            times.append(time.perf_counter() - t0)
        means.append(np.mean(times))
    return float(np.median(means)), len(times)


def step_function(params, kind: str, path: str, model: keras.Model, head: str):
    """The on-device step of `head` alone on a compiler path (`techniques.compiler`), by the kind's
    on-device optimizer and rate: (x, y) -> loss."""
    s = setting(params, kind)
    return compiler.step_function(path, model, task(params, kind), s.optimizer, s.learning_rate, [FineTune(head)])


def update_seconds(
    trainer: OnlineTrainer, start, batches: list, timing_steps: int, warmup_steps: int, repeats: int = 1
) -> dict:
    """Measured seconds of a stream's online updates (`time_steps` x updates) from `start` without
    the inference cache (the whole forward pass, then the head's gradient) and with it (the head's
    update from the features the prediction cached)."""
    timed = lambda step: time_steps(step, batches, timing_steps, warmup_steps, repeats)[0] * len(batches)
    trainer.reset(start)
    without = timed(lambda x, y: float(trainer.train(x, y)["loss"]))
    trainer.reset(start)
    cached = {id(x): trainer.infer_and_cache(x)["features"] for x, _ in batches}
    with_cache = timed(lambda x, y: float(trainer.train_from_cache(cached[id(x)], y)["loss"]))
    return {"without cache": without, "with cache": with_cache}


# ---- the cloud's compression of the public model (Sec. 3.2) -------------------------------------


@dataclass
class Compressed:
    kind: str
    method: str  # uncompressed | structured pruning | SVD | magnitude pruning
    model: keras.Model
    detail: str
    val_top1: float
    head: str


def subset(samples: Samples, n: int, rng) -> Samples:
    """`n` of the samples drawn at random, in their order (all when n is 0 or at least their number)."""
    if not n or n >= len(samples):
        return samples
    idx = np.sort(rng.choice(len(samples), n, replace=False))
    spans = [slice(samples.offsets[j], samples.offsets[j + 1]) for j in idx]
    parts, labels = [samples.inputs[s] for s in spans], [samples.labels[s] for s in spans]
    offsets = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(samples.offsets.dtype)
    kept = (samples.n_context[idx], samples.word_len[idx], samples.target[idx])
    return Samples(np.concatenate(parts), np.concatenate(labels), offsets, *kept)


def cloud_text(params, text: common.TextData):
    """The LSTM's (evaluate, retrain) in the cloud: top-1 on held-out public samples, re-training on
    public samples with the pre-training's optimizer."""
    holdout = subset(
        text.public_holdout, params.validation_samples, streams.rng(params.seed, "autlearn-cost/cloud-text")
    )

    def retrain(model):
        trainer = Trainer(model, NextWordTask(params.k), params.pretrain_learning_rate, "adam", hooks=[EqualLength()])
        sub = subset(
            text.public_train, params.retrain_samples, streams.rng(params.seed, "autlearn-cost/retrain-sample")
        )
        rng = streams.rng(params.seed, "autlearn-cost/retrain")
        trainer.fit(sub, params.retrain_epochs, params.pretrain_batch_size, rng)

    return (lambda model: common.score_text(model, holdout, params.k)["top1"]), retrain


def cloud_image(params, images: common.ImageData, writers, pre: common.Pretrained):
    """MobileNet's (evaluate, retrain) in the cloud: a backbone's score is the top-1 on the cloud
    writers' test images of a head fitted on their training images (features once). No ImageNet
    here, so a pruned backbone is not re-trained."""
    train, test, head_name = images.pooled(writers), images.pooled(writers, ("test",)), LAST_LAYER["image"]
    s = setting(params, "image")

    def evaluate(model):
        feats, head = keras.Model(model.input, model.get_layer(head_name).input), mobilenet_v1.head_model(model)
        head.get_layer(head_name).set_weights(pre.model.get_layer(head_name).get_weights())
        f = lambda x: np.concatenate([feats(x[i : i + 256], training=False).numpy() for i in range(0, len(x), 256)])
        trainer = Trainer(
            head, ClassificationTask((head.input_shape[-1],), femnist.CLASSES), s.learning_rate, s.optimizer
        )
        rng = streams.rng(params.seed, "autlearn-cost/cloud-head")
        trainer.fit((f(train[0]), train[1]), params.cloud_head_epochs, s.batch_size, rng)
        return float((head(f(test[0]), training=False).numpy().argmax(-1) == test[1]).mean())

    return evaluate, lambda model: None


def compress(params, kind: str, pre: common.Pretrained, evaluate, retrain, log=print):
    """The uncompressed public model and each compression within `max_accuracy_drop` of its cloud
    accuracy, and the structured search's rounds: the paper's structured pruning (`pruning.search`)
    for both models; for the LSTM also DeepType's SVD of the softmax (the smallest tried rank within
    the budget, re-trained) and magnitude pruning (the highest tried sparsity within it). MobileNet's
    FC head (256 x 62) is too small for SVD or sparsity to matter, and its backbone cannot be
    re-trained here."""
    pre.model.set_weights(pre.weights)
    base = pruning.flatten(pre.model) if kind == "image" else keras.models.clone_model(pre.model)
    if kind == "text":
        base.set_weights(pre.model.get_weights())
    layers = pruning.candidates(base)
    if kind == "image" and params.prune_candidates:
        layers = sorted(layers, key=lambda n: -pruning.layer_flops(base.get_layer(n)))[: params.prune_candidates]
    name, head = MODEL_NAMES[kind], LAST_LAYER[kind]
    log_ = lambda m: log(f"{name}: {m}")
    search = dict(step=params.prune_step, max_drop=params.max_accuracy_drop, max_rounds=params.prune_rounds)
    best, rounds, base_acc = pruning.search(base, evaluate, retrain, layers=layers, log=log_, **search)
    w = lambda model, n: pruning.width(model.get_layer(n))
    widths = ", ".join(f"{n} {w(base, n)}->{w(best, n)}" for n in layers if w(base, n) != w(best, n))
    acc = evaluate(best) if best is not base else base_acc
    variants = [
        Compressed(kind, "uncompressed", base, "the public pre-trained model", base_acc, head),
        Compressed(kind, "structured pruning", best, widths or "no round within the budget", acc, head),
    ]
    if kind == "text":
        budget = lambda tried: _within_budget(tried, evaluate, base_acc, params.max_accuracy_drop, log_)
        hidden = int(base.get_layer(svd_compression.SOFTMAX).input_shape[-1])
        ranks = [svd_compression.rank_for(hidden, f) for f in sorted(params.svd_fractions, reverse=True)]
        svd = lambda r: _retrained(svd_compression.compress(base, r), retrain)
        rank, model, acc = budget((f"SVD rank {r}", r, lambda r=r: svd(r)) for r in ranks)
        variants.append(
            Compressed(kind, "SVD", model, f"softmax rank {rank} of {hidden}", acc, svd_compression.SOFTMAX)
        )
        sparse = lambda s: magnitude_pruning.prune(base, s)
        sparsity, model, acc = budget(
            (f"magnitude pruning {s:.0%}", s, lambda s=s: sparse(s)) for s in sorted(params.sparsities)
        )
        variants.append(Compressed(kind, "magnitude pruning", model, f"{sparsity:.0%} of weights zero", acc, head))
    return variants, [{"model": name, **r.__dict__} for r in rounds]


def _retrained(model, retrain):
    retrain(model)
    return model


def _within_budget(tried, evaluate, base_acc: float, max_drop: float, log):
    """(setting, model, accuracy) of the strongest of `tried` ((label, setting, build) from the
    weakest) within `max_drop` of `base_acc`, stopping at the first outside it (the weakest when
    none is within: it is reported, with its accuracy)."""
    chosen = None
    for label, value, build in tried:
        model = build()
        acc = evaluate(model)
        log(f"{label}: accuracy {acc:.4f} (uncompressed {base_acc:.4f})")
        if chosen is None or acc >= base_acc - max_drop:
            chosen = (value, model, acc)
        if acc < base_acc - max_drop:
            break
    return chosen
