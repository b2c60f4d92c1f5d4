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

import inspect
from typing import Callable

import numpy as np
import tf_keras as keras

from ondevice.report import provenance
from ondevice.training import model_cache
from ondevice.training.trainer import Trainer

SOFTMAX = "softmax"
PROJECTION = "softmax_svd"
# code whose change must invalidate a re-trained compressed model (the training loop and task)
RETRAIN_CODE = ("ondevice.training.trainer", "ondevice.tasks.next_word", "ondevice.models.lstm_lm",
                "ondevice.streams", "ondevice.papers.deeptype.techniques.svd_compression")


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


def retrain_global(model: keras.Model, base_key: str, rank: int, crowd, task, *, epochs: int, batch_size: int,
                   learning_rate: float, optimizer: str, rng_factory: Callable, log=print) -> model_cache.Entry:
    """Compress the (global) `model` at `rank`, re-train it on the crowd for `epochs`, cached.

    The key holds the base model's cache key, the rank, the re-training fields, the crowd's
    samples digest and the code of the training loop and of this module. `rng_factory()` gives
    the batch-order generator (called only when training). Returns the entry; its weights fit
    `compress(model, rank)`.
    """
    def train():
        compressed = compress(model, rank)
        trainer = Trainer(compressed, task, learning_rate, optimizer)
        history = trainer.fit(crowd, epochs, batch_size, rng_factory(), log, f"SVD t={rank} re-training") if epochs else []
        return compressed.get_weights(), {"history": history}

    fields = {"base_key": base_key, "rank": rank, "epochs": epochs, "batch_size": batch_size,
              "learning_rate": learning_rate, "optimizer": optimizer, "k": getattr(task, "k", None)}
    code = model_cache.code_digest([f for m in RETRAIN_CODE for f in provenance.module_files(m)],
                                   extra=inspect.getsource(retrain_global))
    return model_cache.load_or_train("deeptype_global_svd", fields, [crowd.digest()], code, train, log)
