"""One training loop for every task, in the cloud and on device, with hooks for techniques.

A technique enters training through a `Hook`: it may choose which variables train (layer
freezing, fine-tuning the last layer), add a loss term (distillation), transform gradients
(masks) or supply the batches (a feature-map cache). Hooks compose: a "combined" row is a list
of hooks. The same `train_step` is what the trainable TFLite export runs on device.
"""
from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np
import tensorflow as tf
import tf_keras as keras

from ..tasks import Task

OPTIMIZERS = {"adam": keras.optimizers.Adam, "sgd": keras.optimizers.SGD}


def seed_everything(seed: int) -> None:
    """Same seed on one machine -> same numbers: seeds Python, NumPy and TF, deterministic ops."""
    keras.utils.set_random_seed(seed)
    tf.config.experimental.enable_op_determinism()


class Hook:
    """A technique's entry points into training; each default changes nothing."""

    def trainable(self, model: keras.Model, variables: list) -> list:
        """The variables that train (freezing removes some)."""
        return variables

    def extra_loss(self, inputs, labels, outputs):
        """A loss term added to the task's loss (a scalar tensor), or None."""
        return None

    def gradients(self, grads: list, variables: list) -> list:
        """Gradients after this technique (e.g. masked); same order as variables."""
        return grads

    def batches(self, task: Task, data: Any, batch_size: int, rng):
        """An iterable of (inputs, labels) replacing the task's batches, or None."""
        return None


def make_optimizer(name: str, learning_rate: float):
    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {sorted(OPTIMIZERS)}, got {name!r}")
    return OPTIMIZERS[name](learning_rate)


def trainable_variables(model: keras.Model, hooks: Sequence[Hook]) -> list:
    variables = list(model.trainable_variables)
    for hook in hooks:
        variables = hook.trainable(model, variables)
    if not variables:
        raise ValueError("no variable is left to train")
    return variables


def train_step(model, task: Task, optimizer, variables, hooks: Sequence[Hook], inputs, labels):
    """Task loss plus the hooks' terms, and one optimizer update of `variables`: the same step
    in the cloud loop and in the exported TFLite model. Returns the total loss."""
    with tf.GradientTape() as tape:
        outputs = model(inputs, training=True)
        loss = task.loss(labels, outputs)
        for hook in hooks:
            extra = hook.extra_loss(inputs, labels, outputs)
            if extra is not None:
                loss = loss + extra
    grads = tape.gradient(loss, variables)
    for hook in hooks:
        grads = hook.gradients(grads, variables)
    optimizer.apply_gradients(zip(grads, variables))
    return loss


class StepTimer:
    """Wall time of each step; steady state excludes the first `warmup` steps (tracing, caches).

    Every paper reports training time, so it is measured the MoIL way: steady-state seconds
    per step times the number of steps, baseline and technique in the same run.
    """

    def __init__(self, warmup: int = 5):
        self.warmup = warmup
        self.durations: list[float] = []

    def add(self, seconds: float) -> None:
        self.durations.append(seconds)

    def steady(self) -> float:
        """Median seconds per step after warm-up (NaN when there were no steps after it)."""
        steady = self.durations[self.warmup:]
        return float(np.median(steady)) if steady else float("nan")


class Trainer:
    """A model, a task, an optimizer, hooks and one compiled step; `reset` reuses them per user."""

    def __init__(self, model: keras.Model, task: Task, learning_rate: float, optimizer: str = "adam",
                 hooks: Sequence[Hook] = (), warmup_steps: int = 5):
        self.model, self.task, self.hooks = model, task, list(hooks)
        self.variables = trainable_variables(model, self.hooks)
        self.optimizer = make_optimizer(optimizer, learning_rate)
        self.optimizer.build(self.variables)
        self.timer = StepTimer(warmup_steps)
        sig = task.signature
        self._step = tf.function(
            lambda x, y: train_step(model, task, self.optimizer, self.variables, self.hooks, x, y),
            input_signature=[sig.inputs, sig.labels])

    def reset(self, weights: list[np.ndarray]) -> None:
        """Start again from given weights with a fresh optimizer state (incremental training)."""
        self.model.set_weights(weights)
        for v in self.optimizer.variables:
            v.assign(tf.zeros_like(v))

    def step(self, inputs, labels) -> float:
        start = time.perf_counter()
        loss = float(self._step(inputs, labels))  # float() waits for the step to finish
        self.timer.add(time.perf_counter() - start)
        return loss

    def _batches(self, data, batch_size, rng):
        for hook in self.hooks:
            source = hook.batches(self.task, data, batch_size, rng)
            if source is not None:
                return list(source)
        return list(self.task.batches(data, batch_size, rng))

    def fit(self, data, epochs: int, batch_size: int, rng: np.random.Generator, log=None, label: str = "") -> list[dict]:
        """Train whole epochs; one row per epoch: mean loss, seconds, steps, steady step time.

        With `log`, prints about every tenth of an epoch so a slow run can be told from a hung one.
        """
        history = []
        for epoch in range(1, epochs + 1):
            batches = self._batches(data, batch_size, rng)
            every = max(1, len(batches) // 10)
            losses, start = [], time.perf_counter()
            for n, (x, y) in enumerate(batches, 1):
                losses.append(self.step(x, y))
                if log and (n % every == 0 or n == len(batches)):
                    rate = n / (time.perf_counter() - start)
                    log(f"{label} epoch {epoch}/{epochs} step {n}/{len(batches)} "
                        f"loss {np.mean(losses[-every:]):.3f} ({rate:.1f} steps/s)")
            history.append({"epoch": epoch, "loss": float(np.mean(losses)) if losses else float("nan"),
                            "seconds": time.perf_counter() - start, "steps": len(batches),
                            "steady_step_seconds": self.timer.steady()})
        return history
