"""The training loop shared by global (cloud) and personal (on-device) training."""
from __future__ import annotations

import time

import numpy as np
import tensorflow as tf
import tf_keras as keras

from ..data.typing_samples import Samples, batch_indices
from ..metrics import masked_cross_entropy

_BATCH = [tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([None, None], tf.int32)]


def seed_everything(seed: int) -> None:
    """Same seed on CPU -> same numbers: seeds Python, NumPy and TF and asks TF for deterministic ops."""
    keras.utils.set_random_seed(seed)
    tf.config.experimental.enable_op_determinism()


def train_step(model: keras.Model, optimizer, tokens, labels):
    """Masked cross-entropy and one optimizer update: the same step in the cloud loop and on device."""
    with tf.GradientTape() as tape:
        total, count = masked_cross_entropy(labels, model(tokens, training=True))
        loss = total / count
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss


class Trainer:
    """A model, its optimizer and one compiled train step; `reset` reuses them for the next user."""

    def __init__(self, model: keras.Model, learning_rate: float):
        self.model = model
        self.optimizer = keras.optimizers.Adam(learning_rate)
        self.optimizer.build(model.trainable_variables)
        self._step = tf.function(lambda x, y: train_step(model, self.optimizer, x, y), input_signature=_BATCH)

    def reset(self, weights: list[np.ndarray]) -> None:
        """Start again from given weights with a fresh optimizer state (incremental training)."""
        self.model.set_weights(weights)
        for v in self.optimizer.variables:
            v.assign(tf.zeros_like(v))

    def fit(self, samples: Samples, epochs: int, batch_size: int, rng: np.random.Generator,
            log=None, label: str = "") -> list[dict]:
        """Train for whole epochs; returns one row per epoch (mean loss, seconds, steps).

        With `log`, prints a line about every tenth of an epoch so a slow run can be told
        from a hung one.
        """
        history = []
        for epoch in range(1, epochs + 1):
            batches = batch_indices(samples, batch_size, rng)
            every = max(1, len(batches) // 10)
            losses, start = [], time.perf_counter()
            for step, idx in enumerate(batches, 1):
                x, y = samples.padded(idx)
                losses.append(float(self._step(x, y)))
                if log and (step % every == 0 or step == len(batches)):
                    rate = step / (time.perf_counter() - start)
                    log(f"{label} epoch {epoch}/{epochs} step {step}/{len(batches)} "
                        f"loss {np.mean(losses[-every:]):.3f} ({rate:.1f} steps/s)")
            history.append({"epoch": epoch, "loss": float(np.mean(losses)),
                            "seconds": time.perf_counter() - start, "steps": len(batches)})
        return history
