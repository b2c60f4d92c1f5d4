"""Dual distillation, the client side (Colla Sec. 3.3, Eq. 2-3), and the distillation loss the
cloud side shares.

The loss is lambda*CE(y, p) + (1 - lambda)*CE(q, p): hard labels y and a teacher's probabilities q,
both matched by the student's p. The trainer's task already adds CE(y, p), so the hook adds
(1 - lambda)*(CE(q, p) - CE(y, p)), which makes the total exactly Eq. 2. On a device the teacher is
the pulled cloud model: its probabilities over every place, restricted to the device's places (its
switched-on FC slots) and renormalised, because the customised FC knows only those. The teacher
runs inside the training step, so the same step (and the exported TFLite file) holds it.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from ondevice.training.step import Hook


class DistillationHook(Hook, tf.Module):
    """Adds the teacher term of Eq. 2; `teacher(inputs)` gives probabilities over the student's outputs.

    A tf.Module, so a trainable TFLite export tracks (and carries) the teacher's variables.
    """

    def __init__(self, teacher, lam: float):
        tf.Module.__init__(self, name="distillation")
        if not 0 <= lam <= 1:
            raise ValueError(f"lambda must be in [0, 1], got {lam}")
        self.teacher, self.lam = teacher, float(lam)

    def extra_loss(self, inputs, labels, outputs):
        q = tf.stop_gradient(self.teacher(inputs))
        soft = -tf.reduce_mean(tf.reduce_sum(q * tf.nn.log_softmax(outputs), axis=-1))
        hard = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=outputs))
        return (1.0 - self.lam) * (soft - hard)


class CloudTeacher(tf.Module):
    """The pulled cloud model as a device's teacher: its softmax restricted to the device's slots
    (slot s holds global place `slot_places[s]`, or is off) and renormalised."""

    def __init__(self, cloud_model, slots: int):
        super().__init__(name="cloud_teacher")
        self.model = cloud_model
        self.slot_places = tf.Variable(tf.zeros([slots], tf.int32), trainable=False, name="slot_places")
        self.active = tf.Variable(tf.zeros([slots]), trainable=False, name="active")

    def assign(self, cloud_weights: list[np.ndarray], slot_places: np.ndarray) -> None:
        """A new pull: the cloud model's weights and the device's slot map (-1 = off)."""
        self.model.set_weights(cloud_weights)
        self.slot_places.assign(np.maximum(slot_places, 0).astype(np.int32))
        self.active.assign((slot_places >= 0).astype(np.float32))

    def __call__(self, inputs):
        p = tf.nn.softmax(self.model(inputs, training=False))
        q = tf.gather(p, self.slot_places, axis=1) * self.active
        return q / tf.maximum(tf.reduce_sum(q, axis=-1, keepdims=True), 1e-12)


class FullTeacher(tf.Module):
    """A teacher over the same outputs as its student (the first pull: cloud model -> small model)."""

    def __init__(self, model):
        super().__init__(name="full_teacher")
        self.model = model

    def __call__(self, inputs):
        return tf.nn.softmax(self.model(inputs, training=False))
