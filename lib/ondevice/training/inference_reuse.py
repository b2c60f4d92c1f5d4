"""Reuse of inference results in online training (DeepType Sec. 5.5, Fig. 10b).

While the user types, the keyboard runs the model forward to suggest words. With fine-tune
training only the softmax layer learns, so everything the update needs from the forward pass is
the last LSTM layer's output at every position (the softmax's input). `infer_and_cache` returns
the logits *and* those features; once 16 samples are buffered, `train_from_cache` computes the
masked loss from the cached features and the labels and updates the softmax only, without
running the embedding and LSTM layers again. It is the same update as a fine-tune step
(`FineTune` hook in `training.step.train_step`) on the same batch, and costs the same at any
sequence length up to the (small) softmax matmul.

The cache is valid only while the weights below the softmax do not change, which fine-tuning
guarantees, and while no update happened between the inference and the training of the batch
(the paper's reason why reuse applies to online, not offline, training). `OnlineTrainer` is a
`Step`, so the phone runs the same: `device.tflite.convert(online, REUSE_SIGNATURES)`.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
import tf_keras as keras

from ondevice.tasks import Task
from ondevice.training.fine_tune import FineTune
from ondevice.training.step import Step

HEAD = "softmax"


def split(model: keras.Model, head: str = HEAD) -> tuple[keras.Model, keras.layers.Layer]:
    """The feature part (inputs -> the head's input at every position, sharing the model's layers
    and weights) and the head layer itself."""
    layer = model.get_layer(head)
    return keras.Model(model.inputs, layer.input, name=f"{model.name}_features"), layer


def features_spec(model: keras.Model, head: str = HEAD) -> tf.TensorSpec:
    """The cached features' signature, float32: [batch, positions, head input width] for a
    sequence model, [batch, head input width] for a classifier (e.g. AutLearn's MobileNet head)."""
    shape = model.get_layer(head).input.shape
    return tf.TensorSpec([None] * (len(shape) - 1) + [int(shape[-1])], tf.float32, name="features")


def infer_and_cache(features_model, head, inputs) -> dict:
    feats = features_model(inputs, training=False)
    return {"logits": head(feats, training=False), "features": feats}


def train_from_cache(head, task: Task, optimizer, variables, features, labels):
    """The task's loss from cached features through the head only, and one optimizer update of the
    head's variables (the fine-tune update). Returns the loss."""
    with tf.GradientTape() as tape:
        loss = task.loss(labels, head(features, training=True))
    grads = tape.gradient(loss, variables)
    optimizer.apply_gradients(zip(grads, variables))
    return loss


class OnlineTrainer(Step):
    """Online (fine-tune) training of one model, with and without reuse, in TensorFlow and (converted
    with `device.tflite.REUSE_SIGNATURES`) on the phone.

    `train` is the fine-tune step (a forward pass through every layer, gradients of the head only);
    `infer_and_cache` + `train_from_cache` is the reuse path. Both update the same head variables
    with the same optimizer, so a keyboard may mix them. Arguments: `Step`'s but the hooks (the
    fine-tune hook on `head`).
    """

    def __init__(self, *args, head: str = HEAD, **kwargs):
        super().__init__(*args, hooks=[FineTune(head)], **kwargs)
        self.features_model, self.head = split(self.model, head)
        sig = self.task.signature
        self.infer_and_cache = tf.function(self._infer_and_cache, input_signature=[sig.inputs])
        self.train_from_cache = tf.function(
            self._train_from_cache, input_signature=[features_spec(self.model, head), sig.labels]
        )

    def _infer_and_cache(self, inputs):
        return infer_and_cache(self.features_model, self.head, inputs)

    def _train_from_cache(self, features, labels):
        variables = self.variables_to_train
        return {"loss": train_from_cache(self.head, self.task, self.optimizer, variables, features, labels)}

    def head_weights(self) -> list[np.ndarray]:
        return [v.numpy() for v in self.variables_to_train]


def forward_flops(config, positions: int, rank: int = 0) -> tuple[float, float]:
    """Multiply-add FLOPs (2 per MAC) of the forward pass over `positions` (batch x length) of an
    `lstm_lm.LSTMConfig`: (below the head, the head). An LSTM layer of H units over inputs of width
    d runs 4 gates of (d + H) x H per position; the head is the H x V softmax, or with `rank` t
    (SVD layer compression) the t x V `softmax` after an H x t projection that counts as below it
    (fine-tuning trains `softmax` only, so reuse caches the projection's output). Elementwise work
    (gates, cross-entropy) is left out: it is O(units), not O(units^2)."""
    lstm, width = 0, config.embedding_dim
    for _ in range(config.layers):
        lstm += 2 * positions * 4 * config.hidden_units * (width + config.hidden_units)
        width = config.hidden_units
    if rank:
        return float(lstm + 2 * positions * config.hidden_units * rank), float(
            2 * positions * rank * config.output_vocab
        )
    return float(lstm), float(2 * positions * config.hidden_units * config.output_vocab)


def flops_per_update(config, batch: int, length: int, reuse: bool, rank: int = 0) -> float:
    """FLOPs of one fine-tune update of `batch` samples of `length` positions. Without reuse: the
    forward pass of every layer below the head and the head, plus the head's kernel gradient (no
    gradient flows below it). With reuse: the head's forward and kernel gradient only."""
    below, head = forward_flops(config, batch * length, rank)
    return 2 * head + (0.0 if reuse else below)


def cost_readings(config, batch: int, length: int, rank: int = 0) -> dict[str, float]:
    """Update cost without reuse over with reuse, in FLOPs, under each reading of the two steps: ours
    (the fine-tune step against the head's forward and kernel gradient from the cached features),
    the paper's text (Sec. 5.5: the loss straight from the cached probabilities, so the reuse step
    is the kernel gradient alone) and the widest (every layer back-propagated, the backward pass
    counted as twice the forward, against that gradient)."""
    below, head = forward_flops(config, batch * length, rank)
    return {
        "ours: fine-tune step / softmax from the cached hidden states": (below + 2 * head) / (2 * head),
        "fine-tune step / gradient from the cached probabilities": (below + 2 * head) / head,
        "full back-propagation / gradient from the cached probabilities": 3 * (below + head) / head,
    }
