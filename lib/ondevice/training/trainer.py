"""One training loop for every task: epochs of `step.Step` updates (the step the trainable TFLite
export runs on the phone), with step timing, a stop rule on held-out data and a per-epoch history.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import tensorflow as tf
import tf_keras as keras

from .step import Step


def seed_everything(seed: int) -> None:
    """Same seed on one machine -> same numbers: seeds Python, NumPy and TF, deterministic ops."""
    keras.utils.set_random_seed(seed)
    tf.config.experimental.enable_op_determinism()


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
        steady = self.durations[self.warmup :]
        return float(np.median(steady)) if steady else float("nan")


class Trainer(Step):
    """The training loop around one `Step`: `step` times each update, `fit` runs epochs with an
    optional stop rule; `reset` reuses the compiled step for the next user."""

    def __init__(self, *args, warmup_steps: int = 5, **kwargs):
        """`Step`'s arguments (model, task, learning_rate, optimizer, hooks, clip_norm); `warmup_steps`
        are left out of the steady-state step time."""
        super().__init__(*args, **kwargs)
        self.timer = StepTimer(warmup_steps)

    def step(self, inputs, labels) -> float:
        start = time.perf_counter()
        loss = float(self.train(inputs, labels)["loss"])  # float() waits for the step to finish
        self.timer.add(time.perf_counter() - start)
        return loss

    def _batches(self, data, batch_size, rng):
        for hook in self.hooks:
            source = hook.batches(self.task, data, batch_size, rng)
            if source is not None:
                return list(source)
        return list(self.task.batches(data, batch_size, rng))

    def fit(
        self,
        data,
        epochs: int,
        batch_size: int,
        rng: np.random.Generator,
        log=None,
        label: str = "",
        evaluate=None,
        stop: "Plateau | None" = None,
        evaluate_first: bool = False,
        schedule=None,
    ) -> "History":
        """Train up to `epochs` whole epochs; one row per epoch: mean loss, seconds, steps, steady
        step time, and what `evaluate(model)` returns (a dict of floats) after the epoch.

        With `stop`, training ends when the monitored value of `evaluate` reaches a plateau and the
        model is left with the weights of the epoch `stop` keeps (`History.best_epoch`). With
        `evaluate_first`, a row for epoch 0 scores the starting weights. `schedule(epoch)` gives the
        learning rate of each epoch (1-based; e.g. PTB's decay), recorded as `learning_rate`. With
        `log`, prints about every tenth of an epoch so a slow run can be told from a hung one.
        """
        if stop is not None and evaluate is None:
            raise ValueError("stop needs evaluate: a plateau is judged on held-out data")
        history = History()
        if evaluate_first:
            history.append({"epoch": 0, "loss": float("nan"), **evaluate(self.model)})
        watch = stop.watch() if stop is not None else None
        for epoch in range(1, epochs + 1):
            rate = {}
            if schedule is not None:
                self.optimizer.learning_rate = rate["learning_rate"] = float(schedule(epoch))
            row = self._epoch(data, batch_size, rng, log, f"{label} epoch {epoch}/{epochs}")
            row = {"epoch": epoch, **rate, **row, **(evaluate(self.model) if evaluate else {})}
            history.append(row)
            if watch is not None:
                if log:
                    log(f"{label} epoch {epoch}/{epochs}: {stop.monitor} {row[stop.monitor]:.4f}")
                if watch.update(row[stop.monitor], epoch, self.model):
                    break
        if watch is not None:
            self.model.set_weights(watch.weights)
            history.best_epoch, history.plateau = watch.epoch, watch.plateau
        return history

    def _epoch(self, data, batch_size: int, rng, log, label: str) -> dict:
        batches = self._batches(data, batch_size, rng)
        every = max(1, len(batches) // 10)
        losses, start = [], time.perf_counter()
        for n, (x, y) in enumerate(batches, 1):
            losses.append(self.step(x, y))
            if log and (n % every == 0 or n == len(batches)):
                rate = n / (time.perf_counter() - start)
                log(f"{label} step {n}/{len(batches)} loss {np.mean(losses[-every:]):.3f} ({rate:.1f} steps/s)")
        return {
            "loss": float(np.mean(losses)) if losses else float("nan"),
            "seconds": time.perf_counter() - start,
            "steps": len(batches),
            "steady_step_seconds": self.timer.steady(),
        }


class History(list):
    """`Trainer.fit`'s rows, one per epoch; with a stop rule also the kept epoch and whether the
    plateau was reached (False: the epoch cap came first)."""

    best_epoch: int | None = None
    plateau: bool = False


@dataclass(frozen=True)
class Plateau:
    """When to stop on held-out data, and which epoch's weights to keep.

    An epoch *improves* when the monitored value (lower is better) falls below the reference by
    more than `min_delta` (relative to the reference, or absolute with `relative=False`); training
    stops after `patience` epochs in a row without improvement. The reference and the weights kept
    are those of the last improving epoch, or with `keep_lowest` those of the lowest value seen
    (an epoch below the reference by less than `min_delta` is then kept, yet does not reset the
    patience). The first epoch always improves. Every stopping rule of the papers is one of these:
    DeepType's global model (relative 1%, patience 1), AutLearn's pre-training (relative 1%,
    patience 1, keep_lowest), Colla (absolute 1e-6, patience 20).
    """

    patience: int = 1
    min_delta: float = 0.0
    relative: bool = True
    keep_lowest: bool = False
    monitor: str = "holdout_loss"

    def __post_init__(self):
        if self.patience < 1:
            raise ValueError(f"patience must be at least 1, got {self.patience}")
        if not 0 <= self.min_delta < (1 if self.relative else np.inf):
            raise ValueError(f"min_delta must be in [0, 1) when relative, >= 0 otherwise; got {self.min_delta}")

    def watch(self) -> "_Watch":
        return _Watch(self)


class _Watch:
    """The state of one `Plateau` during one fit."""

    def __init__(self, rule: Plateau):
        self.rule, self.reference, self.weights, self.epoch, self.waited = rule, np.inf, None, None, 0

    @property
    def plateau(self) -> bool:
        return self.waited >= self.rule.patience

    def update(self, value: float, epoch: int, model) -> bool:
        """Record an epoch's monitored value; True when training should stop."""
        rule = self.rule
        threshold = self.reference * (1 - rule.min_delta) if rule.relative else self.reference - rule.min_delta
        improved = self.weights is None or value < threshold
        if improved or (rule.keep_lowest and value < self.reference):
            self.reference, self.weights, self.epoch = value, model.get_weights(), epoch
        self.waited = 0 if improved else self.waited + 1
        return self.plateau
