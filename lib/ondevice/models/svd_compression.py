"""SVD layer compression of the softmax (DeepType Sec. 5.1; AutLearn Sec. 3.2 uses it too).

The softmax kernel W (M x V: LSTM state -> word logits) is replaced by its truncated SVD,
W ~ (U_t S_t) V_t^T, i.e. two Dense layers: `softmax_svd` (M -> t, no bias) initialised with
U_t S_t and `softmax` (t -> V, with the original bias) initialised with V_t^T. Parameters and
multiply-adds of the layer drop from M V to t (M + V). The paper keeps 10% of the singular values
(400 -> 40) and then re-trains the compressed global model in the cloud before it is sent to
phones (DeepType's `papers/deeptype/techniques/svd_retrain.py`; AutLearn's `protocol.compress`).
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

SOFTMAX = "softmax"
PROJECTION = "softmax_svd"


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


def rank_sweep(model: keras.Model, fractions, hidden_units: int, task, holdout) -> pd.DataFrame:
    """The held-out loss of `model` factored at several ranks, without re-training: how much of the
    softmax's spectrum the model needs (the paper found 10% enough for its 400 x 20K softmax)."""
    rows = []
    for fraction in fractions:
        rank = rank_for(hidden_units, fraction)
        loss = float(np.log(task.evaluate(compress(model, rank), holdout)["perplexity"]))
        rows.append({"rank_fraction": fraction, "rank": rank, "holdout_loss": loss})
    return pd.DataFrame(rows)
