"""Colla's Multiple-feature RNN (M-RNN, Sec. 2.2): six embedded id features -> one LSTM -> FC.

Input [batch, history, 6] int32 ids (location, hour, minute, weekday, duration, gap); each feature
has its own embedding, the six are concatenated per step, one LSTM reads the steps and a fully
connected layer maps its last hidden state to logits over locations. The cloud model's FC covers
every place; a device model's FC is *customised* (Sec. 3.3): it has `outputs` slots, each either
switched on for one of the device's places or off (logit -1e9, so softmax gives it nothing and it
never learns). A device switches a slot on when a new place appears, so the layer grows without
changing shape, and one compiled training step serves every device. Its parameters, uploads and
FLOPs count only the switched-on slots.

`stacked_probabilities` runs many same-shaped device models at once (a leading model axis), with
the same LSTM equations as Keras, for the cloud's teacher ensemble and model grouping.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tensorflow as tf
import tf_keras as keras

from ..data.places import FEATURES, TIME_IDS

OFF = -1e9  # logit added to a switched-off slot


@dataclass(frozen=True)
class MRNNConfig:
    locations: int  # place ids at the input (embedding rows), incl. 0 = elsewhere
    outputs: int  # FC width: every place (cloud) or the device's slots
    embedding_dim: int
    hidden_units: int
    history: int
    slots: bool = False  # a switchable (customised) FC, for device models

    def id_counts(self) -> list[int]:
        return [self.locations] + [TIME_IDS[f] for f in FEATURES[1:]]


class SlotMask(keras.layers.Layer):
    """Switches FC outputs on (1) or off (0): a non-trainable vector, part of the weights."""

    def build(self, input_shape):
        self.active = self.add_weight(name="active", shape=(int(input_shape[-1]),), initializer="ones", trainable=False)

    def call(self, logits):
        return logits + (1.0 - self.active) * OFF


def build(config: MRNNConfig, seed: int) -> keras.Model:
    init = lambda k: keras.initializers.GlorotUniform(seed=seed + k)
    steps = keras.Input((config.history, len(FEATURES)), dtype=tf.int32, name="steps")
    embedded = [
        keras.layers.Embedding(
            n,
            config.embedding_dim,
            embeddings_initializer=keras.initializers.RandomUniform(-0.05, 0.05, seed=seed + 10 + i),
            name=f"embed_{f}",
        )(steps[:, :, i])
        for i, (f, n) in enumerate(zip(FEATURES, config.id_counts()))
    ]
    x = keras.layers.Concatenate(name="features")(embedded)
    h = keras.layers.LSTM(
        config.hidden_units,
        kernel_initializer=init(1),
        recurrent_initializer=keras.initializers.Orthogonal(seed=seed + 2),
        name="lstm",
    )(x)
    logits = keras.layers.Dense(config.outputs, kernel_initializer=init(3), name="fc")(h)
    if config.slots:
        logits = SlotMask(name="slots")(logits)
    return keras.Model(steps, logits, name="mrnn")


def parameter_count(config: MRNNConfig, active_outputs: int | None = None) -> dict:
    """Parameters by part; the FC counts `active_outputs` rows (default: all outputs)."""
    n = config.outputs if active_outputs is None else active_outputs
    emb = sum(config.id_counts()) * config.embedding_dim
    inp, h = len(FEATURES) * config.embedding_dim, config.hidden_units
    lstm = 4 * h * (inp + h + 1)
    fc = (h + 1) * n
    return {"embeddings": emb, "lstm": lstm, "fc": fc, "total": emb + lstm + fc}


def inference_flops(config: MRNNConfig, active_outputs: int | None = None) -> int:
    """Floating-point operations of one prediction (a multiply-add is 2): the LSTM's matrix
    products and gate arithmetic over `history` steps, then the FC; lookups cost none."""
    n = config.outputs if active_outputs is None else active_outputs
    inp, h = len(FEATURES) * config.embedding_dim, config.hidden_units
    per_step = 2 * 4 * h * (inp + h) + 4 * h + 3 * 4 * h + 3 * h  # products, bias, activations, cell update
    return config.history * per_step + 2 * h * n + n


def stacked_probabilities(weights: list[tf.Tensor], steps: tf.Tensor) -> tf.Tensor:
    """Softmax outputs [models, batch, slots] of several device models with identical shapes.

    `weights` are the Keras weights (in `model.weights` order) stacked on a leading model axis:
    six embeddings, LSTM kernel, recurrent kernel, bias, FC kernel, FC bias, slot switches.
    """
    tables, (kernel, recurrent, bias, fc_w, fc_b, active) = weights[:6], weights[6:]
    x = tf.concat([tf.gather(t, steps[:, :, i], axis=1) for i, t in enumerate(tables)], axis=-1)  # [M,B,T,E]
    units = recurrent.shape[1]
    models, batch = tf.shape(x)[0], tf.shape(x)[1]
    h = tf.zeros([models, batch, units])
    c = tf.zeros([models, batch, units])
    zx = tf.einsum("mbte,meg->mbtg", x, kernel) + bias[:, None, None, :]
    for t in range(x.shape[2]):
        z = zx[:, :, t] + tf.einsum("mbu,mug->mbg", h, recurrent)
        i, f, g, o = tf.split(z, 4, axis=-1)  # Keras's gate order
        c = tf.sigmoid(f) * c + tf.sigmoid(i) * tf.tanh(g)
        h = tf.sigmoid(o) * tf.tanh(c)
    logits = tf.einsum("mbu,mus->mbs", h, fc_w) + fc_b[:, None, :] + (1.0 - active[:, None, :]) * OFF
    return tf.nn.softmax(logits)


def stack(weight_lists: list[list[np.ndarray]]) -> list[np.ndarray]:
    return [np.stack(ws) for ws in zip(*weight_lists)]
