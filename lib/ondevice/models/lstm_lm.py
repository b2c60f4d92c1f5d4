"""DeepType's next-word model: embedding -> stacked LSTM -> softmax over the word vocabulary."""
from __future__ import annotations

import tf_keras as keras


def build(input_vocab: int, output_vocab: int, embedding_dim: int, hidden_units: int, layers: int = 2) -> keras.Model:
    """Outputs logits at every position (the softmax lives in the loss and the metrics).

    No Keras masking: samples are right-padded, so a forward LSTM's output at a real position
    never sees padding; padded positions are dropped by the loss mask (label 0).
    """
    tokens = keras.Input(shape=(None,), dtype="int32", name="tokens")
    x = keras.layers.Embedding(input_vocab, embedding_dim, name="embedding")(tokens)
    for i in range(layers):
        x = keras.layers.LSTM(hidden_units, return_sequences=True, name=f"lstm_{i + 1}")(x)
    logits = keras.layers.Dense(output_vocab, name="softmax")(x)
    return keras.Model(tokens, logits, name="deeptype_lstm")
