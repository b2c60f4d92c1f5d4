"""SVD layer compression of the softmax (DeepType Sec. 5.1).

The softmax kernel W (M x V: LSTM state -> word logits) is replaced by its truncated SVD,
W ~ (U_t S_t) V_t^T, i.e. two Dense layers: `softmax_svd` (M -> t, no bias) initialised with
U_t S_t and `softmax` (t -> V, with the original bias) initialised with V_t^T. Parameters and
multiply-adds of the layer drop from M V to t (M + V). The paper keeps 10% of the singular values
(400 -> 40) and then re-trains the compressed global model in the cloud before it is sent to
phones; `retrain_global` does that on the crowd, once per machine (model cache).

The output layer keeps the name `softmax`, so fine-tune training (`fine_tune.FineTune`) and
vocabulary compression (`vocab_compression`) act on the compressed model unchanged: they
compose.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd
import tf_keras as keras

from ondevice.training import model_cache
from ondevice.training.trainer import Trainer

SOFTMAX = "softmax"
PROJECTION = "softmax_svd"
# code whose change must invalidate a re-trained compressed model (the training loop and task)
RETRAIN_CODE = ("ondevice.training.trainer", "ondevice.tasks.next_word", "ondevice.models.lstm_lm", "ondevice.streams")
RETRAIN_CODE += ("ondevice.papers.deeptype.techniques.svd_compression",)
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
    model: keras.Model, base_key: str, rank: int, crowd, task, *, rng_factory: Callable, log=print, **training
) -> model_cache.Entry:
    """Compress the (global) `model` at `rank`, re-train it on the crowd (`training`: epochs,
    batch_size, learning_rate, optimizer), cached: the key holds the base model's key, the rank,
    `training`, the task's loss, the crowd's digest and the code. `rng_factory()` gives the batch order (called only
    when training). Returns the entry; its weights fit `compress(model, rank)`."""
    epochs, batch_size, learning_rate, optimizer, clip_norm = (training[k] for k in TRAINING)

    def train():
        compressed = compress(model, rank)
        trainer = Trainer(compressed, task, learning_rate, optimizer, clip_norm=clip_norm)
        label = f"SVD t={rank} re-training"
        history = trainer.fit(crowd, epochs, batch_size, rng_factory(), log, label) if epochs else []
        return compressed.get_weights(), {"history": history}

    fields = {"base_key": base_key, "rank": rank, **{k: training[k] for k in TRAINING}, "k": getattr(task, "k", None)}
    fields["loss_per"] = getattr(task, "loss_per", "position")
    name, data = "deeptype_global_svd", [crowd.digest()]
    return model_cache.cached_train(name, fields, data, RETRAIN_CODE, train, log, sources=(retrain_global,))


@dataclass
class Compressed:
    """Each seed's SVD-compressed global model, re-trained on the crowd (from the model cache)."""

    model: keras.Model
    rank: int
    weights: dict
    entries: dict

    def cache(self) -> pd.DataFrame:
        rows = [(s, self.rank, e.hit, e.info["train_seconds"], e.key[:16]) for s, e in self.entries.items()]
        return pd.DataFrame(rows, columns=["seed", "rank", "from_cache", "train_seconds", "key"])

    def history(self) -> pd.DataFrame:
        rows = [
            {"phase": "svd re-training", "seed": s, **h} for s, e in self.entries.items() for h in e.info["history"]
        ]
        return pd.DataFrame(rows)


def compress_globals(models, params, crowd, log=print) -> Compressed:
    """`retrain_global` for every seed's global model (`common.GlobalModels`) at `params.svd_rank`,
    re-trained as the global models are (global batch size, rate and optimizer)."""
    from ondevice import streams
    from ondevice.papers.deeptype import common

    training = dict(epochs=params.svd_retrain_epochs, batch_size=params.global_batch_size)
    training.update(
        learning_rate=params.global_learning_rate, optimizer=params.optimizer, clip_norm=params.global_clip_norm
    )
    entries = {}
    for seed in params.seed_list:
        models.model.set_weights(models.weights[seed])
        rng = lambda s=seed: streams.rng(s, "batches/svd_retrain")  # noqa: E731
        args = (models.model, models.entries[seed].key, params.svd_rank, crowd, common.global_task(params))
        entries[seed] = retrain_global(*args, rng_factory=rng, log=log, **training)
    shape = compress(models.model, params.svd_rank)
    return Compressed(shape, params.svd_rank, {s: e.weights for s, e in entries.items()}, entries)
