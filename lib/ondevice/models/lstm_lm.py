"""DeepType's next-word model: embedding -> stacked LSTM -> softmax over the word vocabulary."""

from __future__ import annotations

from dataclasses import dataclass

import tf_keras as keras


@dataclass(frozen=True)
class LSTMConfig:
    input_vocab: int  # words + characters on the input side
    output_vocab: int  # words only (the softmax)
    embedding_dim: int
    hidden_units: int
    layers: int = 2
    dropout: float = 0.0  # on the embedding and every LSTM output while training (PTB medium/large: 0.5)


def build(config: LSTMConfig, *, seed: int | None = None) -> keras.Model:
    """Outputs logits at every position (the softmax lives in the task's loss and metrics).

    No Keras masking: samples are right-padded, so a forward LSTM's output at a real position
    never sees padding; padded positions are dropped by the loss mask (label 0). With `seed`,
    the initial weights depend on it alone, not on TensorFlow's global random state.
    """

    def init(kind, i):
        if seed is None:
            return kind
        return {
            "glorot_uniform": keras.initializers.GlorotUniform,
            "orthogonal": keras.initializers.Orthogonal,
            "uniform": keras.initializers.RandomUniform,
        }[kind](seed=seed * 16 + i)

    tokens = keras.Input(shape=(None,), dtype="int32", name="tokens")
    x = keras.layers.Embedding(
        config.input_vocab, config.embedding_dim, name="embedding", embeddings_initializer=init("uniform", 0)
    )(tokens)
    drop = lambda x, i: keras.layers.Dropout(config.dropout, seed=None if seed is None else seed * 16 + 8 + i)(x)
    x = drop(x, 0) if config.dropout else x
    for i in range(config.layers):
        x = keras.layers.LSTM(
            config.hidden_units,
            return_sequences=True,
            name=f"lstm_{i + 1}",
            kernel_initializer=init("glorot_uniform", 2 * i + 1),
            recurrent_initializer=init("orthogonal", 2 * i + 2),
        )(x)
        x = drop(x, i + 1) if config.dropout else x
    logits = keras.layers.Dense(
        config.output_vocab, name="softmax", kernel_initializer=init("glorot_uniform", 2 * config.layers + 1)
    )(x)
    return keras.Model(tokens, logits, name="deeptype_lstm")
