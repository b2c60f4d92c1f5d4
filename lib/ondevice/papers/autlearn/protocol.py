"""AutLearn's method, once: the on-device step (transfer learning: the last layer of the public
pre-trained model trains on one user's data) and its learning rate and epochs chosen on validation
users (Sec. 3.3; `choose_step`). Every AutLearn experiment trains users through `PersonalTrainer`
and the per-kind fields `<kind>_personal_{optimizer,learning_rate,epochs,batch_size}`. Beside it:
the cloud baselines (`cloud_baselines`), online learning (`online_learning`), the step's timing
(`step_timing`) and the cloud's compression of the public model (`compression`).

The last-layer hook (`training.fine_tune.FineTune`), equal-length bucketing (`training.bucketing`),
the inference cache (`training.inference_reuse`) and the SVD of the softmax
(`models.svd_compression`) are shared with DeepType: AutLearn (same first author) names the same
methods (Sec. 3.3: bucketing [23]; Sec. 3.5: the inference-training cache; Sec. 3.2: SVD-based
compression).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np
import pandas as pd
import tf_keras as keras

from ondevice import streams
from ondevice.data import femnist
from ondevice.device import parity
from ondevice.models import mobilenet_v1
from ondevice.papers.autlearn import common
from ondevice.papers.autlearn.common import LAST_LAYER, MODEL_NAMES, image_features
from ondevice.tasks.classification import ClassificationTask
from ondevice.tasks.next_word import NextWordTask
from ondevice.training import selection
from ondevice.training.bucketing import EqualLength
from ondevice.training.fine_tune import FineTune
from ondevice.training.trainer import Trainer


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
        self.kind, self.model, self.setting, self.k = kind, model, setting(params, kind), params.k
        opt, lr = self.setting.optimizer, self.setting.learning_rate
        if kind == "text":
            self.trainer = Trainer(model, NextWordTask(params.k), lr, opt, hooks=[last_layer(kind), EqualLength()])
        else:
            head = mobilenet_v1.head_model(model)
            self.trainer = Trainer(head, ClassificationTask(head.input_shape[1:], femnist.CLASSES), lr, opt)

    def fit(self, start: list[np.ndarray], train, rng, epochs: int | None = None, test=None) -> list[dict]:
        """Train from `start` on `train` (Samples, or (images, labels)); the per-epoch history, with
        `test` (the same kind of data) each epoch's top-1 on it."""
        self.model.set_weights(start)
        self.trainer.reset(self.trainer.model.get_weights())  # zero optimizer state, same weights
        if self.kind == "image":
            train = (image_features(self.model, train[0]), train[1])
            test = None if test is None else (image_features(self.model, test[0]), test[1])
        evaluate = None if test is None else (lambda m: {"top1": self._top1(m, test)})
        epochs = self.setting.epochs if epochs is None else epochs
        return self.trainer.fit(train, epochs, self.setting.batch_size, rng, evaluate=evaluate)

    def _top1(self, model, test) -> float:
        """Top-1 of the trained model (images: the head on the features) on `test`."""
        if self.kind == "text":
            return common.top1_text(model, test)
        return self.trainer.task.evaluate(model, test)["accuracy"]


def choose_step(params, kind: str, data, pre: common.Pretrained, log=print):
    """AutLearn's on-device rate and epochs for one kind, chosen on the validation users (a rule
    fixed before any test run): each rate candidate runs the on-device step from `pre` on every
    validation user's earlier part for the most candidate epochs, scored after each candidate number
    of epochs by the mean top-1 on their later parts (the batches of an epoch do not depend on the
    epochs after it, so this equals a run of that many epochs); the highest mean wins, ties to fewer
    epochs, then to the smaller rate. The params with both, and the table of every pair's score
    (with the public model's own score as a reference row, rate 0 and 0 epochs). No rate candidates
    or no validation users: the preset's rate and epochs; no epoch candidates: the preset's epochs."""
    names = {f: f"{kind}_personal_{f}" for f in ("learning_rate", "epochs")}
    rates, val, model = getattr(params, f"{kind}_rate_candidates"), data.validation, MODEL_NAMES[kind]
    if not rates or not val.users:
        log(f"{model}: on-device rate and epochs from the preset (nothing to choose on)")
        return params, pd.DataFrame()
    epochs = getattr(params, f"{kind}_epoch_candidates") or (getattr(params, names["epochs"]),)
    scores = {}
    for rate in rates:
        step = PersonalTrainer(dataclasses.replace(params, **{names["learning_rate"]: rate}), kind, pre.model)
        runs = [
            step.fit(
                pre.weights, val.train[u], streams.rng(params.seed, f"validation/{kind}/{u}"), max(epochs), val.test[u]
            )
            for u in val.users
        ]
        scores |= {(e, rate): float(np.mean([h[e - 1]["top1"] for h in runs])) for e in epochs}
    candidates = [{"epochs": e, "learning_rate": r} for e in sorted(epochs) for r in rates]
    best, table = selection.select(candidates, lambda c: scores[c["epochs"], c["learning_rate"]], log)
    pre.model.set_weights(pre.weights)
    reference = float(np.mean([score(params, kind, pre.model, val.test[u])["top1"] for u in val.users]))
    table = pd.concat([table, pd.DataFrame([{"epochs": 0, "learning_rate": 0.0, "score": reference, "chosen": False}])])
    table = table.reset_index(drop=True).rename(columns={"score": "validation mean top-1"})
    table = table.assign(model=model, optimizer=getattr(params, f"{kind}_personal_optimizer"), method="on-device step")
    table = table.assign(validation_users=len(val.users))
    top1 = scores[best["epochs"], best["learning_rate"]]
    log(
        f"{model}: on-device rate {best['learning_rate']}, {best['epochs']} epochs chosen on "
        f"{len(val.users)} validation users (mean top-1 {top1:.4f}; public model {reference:.4f})"
    )
    return dataclasses.replace(params, **{names[f]: best[f] for f in names}), table


def choose_steps(params, text, images, pre: dict[str, common.Pretrained], log=print):
    """Both models' on-device rates and epochs (`choose_step` per kind): the params to train users
    with, and one selection table."""
    tables = []
    for kind, data in (("text", text), ("image", images)):
        params, table = choose_step(params, kind, data, pre[kind], log)
        tables.append(table)
    return params, pd.concat(tables, ignore_index=True)


def tflite_check(params, user: str, train, pre: common.Pretrained, log=print) -> pd.DataFrame:
    """AutLearn's LSTM step (softmax only, the chosen rate) for a user's first `tflite_check_steps`
    batches in TensorFlow and through the exported trainable TFLite model (`parity.parity_table`),
    from the public model; it trains copies and draws from its own stream."""
    s, task_ = setting(params, "text"), task(params, "text")
    rng = streams.rng(params.seed, "diagnostics/tflite")
    batches_ = list(task_.batches(train, s.batch_size, rng))[: params.tflite_check_steps]
    pre.model.set_weights(pre.weights)
    hooks = [last_layer("text")]
    return parity.parity_table(pre.model, task_, s.learning_rate, batches_, s.optimizer, hooks, log, user)[0]
