"""AutLearn's cloud baselines trained to convergence (autlearn_accuracy: CloudTrain, FedAvg), their
stopping rule on the validation users' data, and the on-device step's runs on augmented data
(autlearn_augment_online). MobileNet's baselines train through `every_layer`, in even batches
(`batching`). With `<kind>_rate_cuts` both models' baselines go on from each plateau at a fifth of
the rate (`training.rate_cuts`). MobileNet's at a constant rate swing +-10% between evaluations
(seed 0, default, 2026-12-05, before even batches: CloudTrain 0.599, 0.632, 0.630, 0.699, 0.610,
0.696 in epochs 15-20; IID FedAvg 0.706, 0.774 in rounds 60 and 64), so the kept minimum, and a
known answer judged on two of them, is mostly noise. With the cuts CloudTrain settled at 0.539
(0.550 at 1e-4, 0.539 at 2e-5) and IID FedAvg (3 local epochs, SGD 0.03) went from 0.628 to 0.583.
In even batches CloudTrain's curve after a cut stays within 2% (0.616, then 0.563, then 0.559) and
IID FedAvg's within 4% (0.688 to 0.730 in rounds 68-100, still falling). The LSTM's (default, seed
0, 2026-12-06): CloudTrain by SGD 1.0 kept 2.949, with two cuts 2.910; IID FedAvg at grid 0.3 and
one local epoch stopped at its 30-round cap still falling (2.988), and with the cuts reached a plateau
at 2.963, against centralized SGD 0.3's 2.956 with the same cuts: a constant-rate run there is not
converged within its cap."""

from __future__ import annotations

import math
from dataclasses import asdict

import numpy as np
import pandas as pd
import tensorflow as tf

from ondevice import streams
from ondevice.data import femnist
from ondevice.data.typing_samples import batch_indices
from ondevice.models import mobilenet_v1
from ondevice.papers.autlearn import cached_runs, common
from ondevice.papers.autlearn.common import MODEL_NAMES
from ondevice.papers.autlearn.protocol import PersonalTrainer, score, task
from ondevice.papers.autlearn.techniques.fedavg import fedavg
from ondevice.tasks.next_word import masked_cross_entropy
from ondevice.training.bucketing import EqualLength
from ondevice.training.even_batches import EvenBatches
from ondevice.training.rate_cuts import RateCuts, with_cuts
from ondevice.training.trainer import Plateau, Trainer


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
        return Holdout(lambda model: {"holdout_loss": common.image_task().evaluate(model, pooled)["loss"]}, parts)

    batches = [samples.padded(idx) for samples in parts for idx in batch_indices(samples, 256, None)]
    spec = [tf.TensorSpec([None, None], tf.int32)] * 2
    compiled = {}  # per model: one graph for every batch shape (eager LSTM calls are several times slower)

    def text_loss(model) -> dict:
        if id(model) not in compiled:
            compiled[id(model)] = tf.function(lambda x, y: masked_cross_entropy(y, model(x, training=False)), spec)
        sums = np.array([[float(v) for v in compiled[id(model)](x, y)] for x, y in batches])
        return {"holdout_loss": float(sums[:, 0].sum() / sums[:, 1].sum())}

    return Holdout(text_loss, parts)


class Holdout:
    """`holdout_loss`'s score (model -> {"holdout_loss": ...}) and the digest of the data it reads,
    which keys the stored runs that stop on it (`cached_runs`)."""

    def __init__(self, score, parts: list):
        self.score, self.digest = score, cached_runs.digest(parts)

    def __call__(self, model) -> dict:
        return self.score(model)


def rate_cuts(params, kind: str) -> RateCuts:
    """The cloud baselines' rate cuts at a plateau for a model kind (`<kind>_rate_cuts`)."""
    return RateCuts(getattr(params, f"{kind}_rate_cuts"))


def every_layer(model, kind: str):
    """The model a training of every layer steps (CloudTrain, FedAvg's clients), sharing `model`'s
    variables: MobileNet's with its batch normalisation adapting to FEMNIST (`mobilenet_v1.adapting`;
    with ImageNet's statistics fixed, plain SGD cannot train it); the LSTM, or an image model without
    MobileNet's backbone, as it is."""
    names = {layer.name for layer in model.layers}
    return mobilenet_v1.adapting(model) if kind == "image" and mobilenet_v1.BACKBONE in names else model


def batching(kind: str) -> list:
    """How a training of every layer batches: the LSTM in equal-length buckets, MobileNet in even
    batches (no short remainder for its batch statistics, `training.even_batches`)."""
    return [EqualLength()] if kind == "text" else [EvenBatches()]


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


def cloud_train(
    params, kind, model, start, pooled, holdout: Holdout, seed: int, log, optimizer="adam", rate=0.0, cap=0
):
    """CloudTrain: every layer by `optimizer` ("adam" or plain "sgd") at `rate` (0: the preset's)
    on the pooled training data from `start` to its plateau (`converge_cloud`), at most `cap`
    epochs without rate cuts if given (a screen, `cloud_choice`), the kept weights left in `model`;
    stored in the model cache (`cached_runs`)."""
    (preset_rate, epochs, batch), stop = params.cloud(kind), params.plateau(kind)
    rate, (epochs, cuts) = rate or preset_rate, (cap, RateCuts(0)) if cap else (epochs, rate_cuts(params, kind))
    trainer = Trainer(every_layer(model, kind), task(params, kind), rate, optimizer, hooks=batching(kind))
    rng, label = streams.rng(seed, f"cloud/{kind}"), f"CloudTrain {MODEL_NAMES[kind]} ({optimizer})"

    def phase(k: int, phase_rate: float) -> list[dict]:  # a fresh optimizer state at each rate
        trainer.learning_rate = phase_rate
        trainer.reset(start if k == 0 else model.get_weights())
        named = f"{label} at rate {phase_rate:g}" if k else label
        return converge_cloud(trainer, pooled, epochs, batch, rng, holdout, stop, log, named)

    def run():
        return with_cuts(cuts, rate, phase, model)

    setting = dict(kind=kind, seed=seed, optimizer=optimizer, learning_rate=rate, epochs=epochs, batch=batch)
    setting |= dict(stop=asdict(stop)) | (dict(cuts=asdict(cuts)) if cuts.cuts else {})
    setting |= cached_runs.model_fields(params, kind)
    data = [cached_runs.digest(start), cached_runs.digest(pooled), holdout.digest]
    curve = cached_runs.curve_run("autlearn_cloudtrain", setting, data, model, run, (cloud_train,), log)[0]
    return [p | dict(optimizer=optimizer) for p in curve]


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
    together=None,
    client_rate=None,
):
    """FedAvg to convergence: the start scored (round 0), then at most `cap` rounds of `fedavg`
    ending at `stop`'s plateau of `evaluate`, scored every `evaluate_every` rounds (0: an epoch of
    the examples, ceil(clients / (local x per_round)) rounds, as CloudTrain is scored every epoch;
    the patience counts evaluations); `together`: a round's clients at once, `client_rate`: the
    clients' rate by round (both `fedavg`'s). Its
    curve: a row per round (held-out loss NaN between evaluations). One rule in one unit holds when
    the clients step at `per_round` times the centralized rate (`fedavg_baseline.train`): the
    global model then moves per example as far as centralized SGD does."""
    total = sum(trainer.task.size(c) for c in clients.values())
    every = evaluate_every or math.ceil(len(clients) / (local * per_round))
    trainer.reset(start)
    first = _point(0, 0, total, np.nan, evaluate(trainer.model))
    rule = dict(log=log, evaluate=evaluate, stop=stop, evaluate_every=every, together=together, client_rate=client_rate)
    _, rounds = fedavg(trainer, start, clients, cap, per_round, local, batch_size, seed, **rule)
    seen = np.cumsum([r["examples"] * local for r in rounds])
    ramp = lambda r: {"client_rate": r["client_rate"]} if "client_rate" in r else {}  # noqa: E731
    points = [first] + [_point(r["round"], n, total, r["client_loss"], r) | ramp(r) for r, n in zip(rounds, seen)]
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
