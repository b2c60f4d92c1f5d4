"""The on-device step timed on this machine: its steady-state seconds per step, on a compiler
path (`techniques.compiler`), and a stream's online updates with and without the inference cache
(autlearn_cost)."""

from __future__ import annotations

import time

import numpy as np
import tf_keras as keras

from ondevice.papers.autlearn.protocol import setting, task
from ondevice.papers.autlearn.techniques import compiler
from ondevice.training.fine_tune import FineTune
from ondevice.training.inference_reuse import OnlineTrainer


def time_steps(step, batches: list, timing_steps: int, warmup_steps: int, repeats: int = 1) -> tuple[float, int]:
    """Steady-state seconds per step and the steps timed per pass: the first `timing_steps`
    batches, in order, after every distinct batch shape among them ran `warmup_steps` times untimed
    (tracing; XLA compiles once per shape), timed in `repeats` passes: the median of the passes'
    mean step times, so that one disturbed pass on a shared machine does not move the result."""
    return time_interleaved({"": step}, batches, timing_steps, warmup_steps, repeats)[""]


def time_interleaved(
    steps: dict, batches: list, timing_steps: int, warmup_steps: int, repeats: int = 1
) -> dict[str, tuple[float, int]]:
    """`time_steps` of several steps on the same batches (name -> step), their passes interleaved:
    each repeat times one pass of every step in turn (the order reversed every other repeat), so a
    machine that slows down for a while slows them all alike and their ratios hold."""
    timed = batches[:timing_steps]
    seen = {}
    for x, y in timed:
        seen.setdefault(np.shape(x), (x, y))
    for step in steps.values():
        for x, y in seen.values():
            for _ in range(warmup_steps):
                step(x, y)
    means = {name: [] for name in steps}
    for repeat in range(repeats):
        for name in list(steps)[:: 1 if repeat % 2 == 0 else -1]:
            times = []
            for x, y in timed:
                t0 = time.perf_counter()
                steps[name](x, y)
                times.append(time.perf_counter() - t0)
            means[name].append(np.mean(times))
    return {name: (float(np.median(m)), len(timed)) for name, m in means.items()}


def step_function(params, kind: str, path: str, model: keras.Model, head: str):
    """The on-device step of `head` alone on a compiler path (`techniques.compiler`), by the kind's
    on-device optimizer and rate: (x, y) -> loss."""
    s = setting(params, kind)
    return compiler.step_function(path, model, task(params, kind), s.optimizer, s.learning_rate, [FineTune(head)])


def update_seconds(
    trainer: OnlineTrainer, start, batches: list, timing_steps: int, warmup_steps: int, repeats: int = 1
) -> dict:
    """Measured seconds of a stream's online updates (`time_steps` x updates) from `start` without
    the inference cache (the whole forward pass, then the head's gradient) and with it (the head's
    update from the features the prediction cached)."""
    timed = lambda step: time_steps(step, batches, timing_steps, warmup_steps, repeats)[0] * len(batches)
    trainer.reset(start)
    without = timed(lambda x, y: float(trainer.train(x, y)["loss"]))
    trainer.reset(start)
    cached = {id(x): trainer.infer_and_cache(x)["features"] for x, _ in batches}
    with_cache = timed(lambda x, y: float(trainer.train_from_cache(cached[id(x)], y)["loss"]))
    return {"without cache": without, "with cache": with_cache}
