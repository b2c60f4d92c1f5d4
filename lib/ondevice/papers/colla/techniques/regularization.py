"""Regularization of the M-RNN for the paper's six inputs (issue 70): with them our heavy model
learnt its 3,333 training samples by heart (training loss 0.01 by epoch 12) before it had learnt
the first-order transitions a Markov table knows. Two remedies, both switched off at 0:

- *feature dropout*: in training, each sample's embedding of each non-place feature (hour, minute,
  weekday, duration, gap) is zeroed with probability `rate`, every step of the sample alike, and the
  kept ones scaled by 1 / (1 - rate) (Keras' inverted dropout); the place is never dropped. The
  model cannot rely on a time feature to recognise a sample. Inference reads every feature;
- *weight decay*: `decay` times the sum of squares of every trainable kernel and embedding (no
  biases) added to the training loss, as a `Hook`.

The layers are those of `models.mrnn.build`, rewired around dropout layers that hold no weights, so
the weights (names, shapes, order) are the plain model's: caches, uploads, the teacher ensemble and
the exports read them unchanged."""

from __future__ import annotations

import tensorflow as tf
import tf_keras as keras

from ondevice.models import mrnn
from ondevice.training.step import Hook


class FeatureDropout(keras.layers.Layer):
    """Zeroes each sample's block of each non-place feature in the concatenated embeddings [batch,
    steps, features x width] with probability `rate` in training (one draw per sample and feature,
    shared by its steps), scaling kept blocks by 1 / (1 - rate); the first block, the place, stays."""

    def __init__(self, rate: float, width: int, seed: int, **kwargs):
        super().__init__(**kwargs)
        self.rate, self.width, self.seed = rate, width, seed  # an op seed: no generator state among the weights

    def call(self, x, training=None):
        def dropped():
            features = x.shape[-1] // self.width
            keep = tf.random.uniform([tf.shape(x)[0], 1, features - 1], seed=self.seed) >= self.rate
            scale = tf.cast(keep, x.dtype) / (1.0 - self.rate)
            mask = tf.concat([tf.ones_like(scale[..., :1]), scale], axis=-1)
            return x * tf.repeat(mask, self.width, axis=-1)

        return keras.backend.in_train_phase(dropped, x, training=training)

    def get_config(self):
        return super().get_config() | {"rate": self.rate, "width": self.width, "seed": self.seed}


def build(config: mrnn.MRNNConfig, seed: int, rate: float = 0.0) -> keras.Model:
    """`mrnn.build(config, seed)`, with feature dropout at `rate` in training (0: that model itself)."""
    plain = mrnn.build(config, seed)
    if not rate:
        return plain
    if not 0 < rate < 1:
        raise ValueError(f"feature dropout must be in [0, 1), got {rate}")
    x = FeatureDropout(rate, config.embedding_dim, seed + 60, name="feature_dropout")(
        plain.get_layer("features").output
    )
    logits = plain.get_layer("fc")(plain.get_layer("lstm")(x))
    if config.slots:
        logits = plain.get_layer("slots")(logits)
    return keras.Model(plain.input, logits, name="mrnn")


class WeightDecay(Hook):
    """`decay` x the sum of squares of `model`'s trainable kernels and embeddings, added to the loss."""

    def __init__(self, model: keras.Model, decay: float):
        if decay < 0:
            raise ValueError(f"weight decay must be >= 0, got {decay}")
        self.decay = decay
        self.weights = [w for w in model.trainable_weights if "bias" not in w.name]

    def extra_loss(self, inputs, labels, outputs):
        return self.decay * tf.add_n([tf.reduce_sum(tf.square(w)) for w in self.weights])
