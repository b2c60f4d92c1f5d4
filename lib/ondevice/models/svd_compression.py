"""SVD layer compression of the softmax (DeepType Sec. 5.1; AutLearn Sec. 3.2 uses it too).

The softmax kernel W (M x V: LSTM state -> word logits) is replaced by its truncated SVD,
W ~ (U_t S_t) V_t^T, i.e. two Dense layers: `softmax_svd` (M -> t, no bias) initialised with
U_t S_t and `softmax` (t -> V, with the original bias) initialised with V_t^T. Parameters and
multiply-adds of the layer drop from M V to t (M + V). The paper keeps 10% of the singular values
(400 -> 40) and then re-trains the compressed global model in the cloud before it is sent to
phones; `retrain_global` does that on the crowd, to a plateau on held-out text, once per machine
(model cache; DeepType's per-seed use is `papers/deeptype/techniques/svd_retrain.py`).
`rank_sweep` measures how many singular values a model needs.

The output layer keeps the name `softmax`, so fine-tune training (`training.fine_tune.FineTune`) and
DeepType's vocabulary compression act on the compressed model unchanged: they
compose.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pandas as pd
import tf_keras as keras

from ondevice.training import model_cache
from ondevice.training.trainer import Plateau, Trainer

SOFTMAX = "softmax"
PROJECTION = "softmax_svd"
# code whose change must invalidate a re-trained compressed model (the training loop and task)
RETRAIN_CODE = ("ondevice.training.trainer", "ondevice.tasks.next_word", "ondevice.models.lstm_lm", "ondevice.streams")
RETRAIN_CODE += ("ondevice.models.svd_compression",)
TRAINING = ("epochs", "batch_size", "learning_rate", "optimizer", "clip_norm")


def replace_softmax(model: keras.Model, head: Callable, name: str) -> keras.Model:
    """A new model: a copy of `model` (same weights, own variables) up to the input of its
    `softmax` layer, then `head(features)` -> logits. `model` is not changed."""
    clone = keras.models.clone_model(model)
    clone.set_weights(model.get_weights())
    features = clone.get_layer(SOFTMAX).input
    return keras.Model(clone.input, head(features), name=name)


def truncated_factors(kernel: np.ndarray, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """(M x t, t x V) factors whose product is the best rank-t approximation of `kernel`."""
    u, s, vt = np.linalg.svd(kernel.astype(np.float64), full_matrices=False)
    return (u[:, :rank] * s[:rank]).astype(np.float32), vt[:rank].astype(np.float32)


def compress(model: keras.Model, rank: int) -> keras.Model:
    """The model with its softmax factored at `rank` singular values (rank = min(M, V) is exact
    up to float rounding)."""
    kernel, bias = model.get_layer(SOFTMAX).get_weights()
    full = min(kernel.shape)
    if not 1 <= rank <= full:
        raise ValueError(f"SVD rank must be in [1, {full}], got {rank}")
    first, second = truncated_factors(kernel, rank)

    def head(features):
        proj = keras.layers.Dense(rank, use_bias=False, name=PROJECTION)
        out = keras.layers.Dense(kernel.shape[1], name=SOFTMAX)
        logits = out(proj(features))
        proj.set_weights([first])
        out.set_weights([second, bias])
        return logits

    return replace_softmax(model, head, f"{model.name}_svd{rank}")


def rank_for(hidden_units: int, fraction: float) -> int:
    """The paper's t: a fraction of the softmax input width (400 -> 40 is 0.1), at least 1."""
    return max(1, int(round(hidden_units * fraction)))


def retrain_global(
    model: keras.Model,
    base_key: str,
    rank: int,
    crowd,
    task,
    *,
    rng_factory: Callable,
    holdout=None,
    stop: Plateau | None = None,
    log=print,
    **training,
) -> model_cache.Entry:
    """Compress the (global) `model` at `rank`, re-train it on the crowd (`training`: epochs,
    batch_size, learning_rate, optimizer, clip_norm), cached: the key holds the base model's key,
    the rank, `training`, the stop rule, the task's loss, the data's digests and the code. With
    `holdout` and `stop`, `epochs` is a cap: re-training ends on the held-out loss's plateau and
    keeps that epoch's weights; epoch 0 of the history is the compressed model before any
    re-training. `rng_factory()` gives the batch order (called only when training). Returns the
    entry; its weights fit `compress(model, rank)`."""
    epochs, batch_size, learning_rate, optimizer, clip_norm = (training[k] for k in TRAINING)
    if stop is not None and holdout is None:
        raise ValueError("a stop rule needs held-out text")

    def train():
        compressed = compress(model, rank)
        trainer = Trainer(compressed, task, learning_rate, optimizer, clip_norm=clip_norm)
        label = f"SVD t={rank} re-training"
        held = (lambda m: {"holdout_loss": float(np.log(task.evaluate(m, holdout)["perplexity"]))}) if holdout else None
        args = (epochs, batch_size, rng_factory(), log, label, held, stop, held is not None)
        history = trainer.fit(crowd, *args) if epochs else []
        return compressed.get_weights(), {"history": list(history), "kept_epoch": getattr(history, "best_epoch", None)}

    fields = {"base_key": base_key, "rank": rank, **{k: training[k] for k in TRAINING}, "k": getattr(task, "k", None)}
    fields.update(loss_per=getattr(task, "loss_per", "position"), stop=repr(stop))
    name, data = "deeptype_global_svd", [crowd.digest()] + ([holdout.digest()] if holdout else [])
    return model_cache.cached_train(name, fields, data, RETRAIN_CODE, train, log, sources=(retrain_global,))


def rank_sweep(model: keras.Model, fractions, hidden_units: int, task, holdout) -> pd.DataFrame:
    """The held-out loss of `model` factored at several ranks, without re-training: how much of the
    softmax's spectrum the model needs (the paper found 10% enough for its 400 x 20K softmax)."""
    rows = []
    for fraction in fractions:
        rank = rank_for(hidden_units, fraction)
        loss = float(np.log(task.evaluate(compress(model, rank), holdout)["perplexity"]))
        rows.append({"rank_fraction": fraction, "rank": rank, "holdout_loss": loss})
    return pd.DataFrame(rows)
