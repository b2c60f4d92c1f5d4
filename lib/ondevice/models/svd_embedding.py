"""SVD of the input embedding, the second matrix of DeepType's layer compression under the reading
its sizes fit (Table 2's 17.0 MB needs the 20K x 400 embedding factored as well as the softmax; its
Sec. 5.1 text names the softmax only, `models/svd_compression.py`).

The table E (V x D: ids -> vectors) is replaced by its truncated SVD, E ~ (U_t S_t) V_t^T: an
`embedding` lookup of V x t (U_t S_t) followed by `embedding_svd`, a t -> D projection without
bias (V_t^T). Parameters drop from V D to t (V + D). The layers after the embedding are the
model's own (copied), so `svd_compression.compress` of the softmax applies after it unchanged.
"""

from __future__ import annotations

import tf_keras as keras

from ondevice.models.svd_compression import truncated_factors

EMBEDDING = "embedding"
PROJECTION = "embedding_svd"


def compress_embedding(model: keras.Model, rank: int) -> keras.Model:
    """A new model: `model`'s embedding factored at `rank` singular values (rank = D is exact up to
    float rounding), the rest a copy of `model` (same weights, own variables). The model must be
    a chain (each layer reads the previous one's output), as DeepType's LSTM LM is."""
    table = model.get_layer(EMBEDDING).get_weights()[0]
    if not 1 <= rank <= min(table.shape):
        raise ValueError(f"SVD rank must be in [1, {min(table.shape)}], got {rank}")
    clone = keras.models.clone_model(model)
    clone.set_weights(model.get_weights())
    layers = clone.layers
    chain = layers[1].name == EMBEDDING and all(b.input is a.output for a, b in zip(layers, layers[1:]))
    if not chain or not isinstance(layers[0], keras.layers.InputLayer):
        raise ValueError(f"{model.name}: the embedding SVD needs a chain input -> {EMBEDDING} -> ... layers")
    first, second = truncated_factors(table, rank)
    tokens = keras.Input(shape=clone.input.shape[1:], dtype=clone.input.dtype, name=layers[0].name)
    lookup = keras.layers.Embedding(table.shape[0], rank, name=EMBEDDING)
    project = keras.layers.Dense(table.shape[1], use_bias=False, name=PROJECTION)
    x = project(lookup(tokens))
    lookup.set_weights([first])
    project.set_weights([second])
    for layer in layers[2:]:
        x = layer(x)
    return keras.Model(tokens, x, name=f"{model.name}_emb{rank}")
