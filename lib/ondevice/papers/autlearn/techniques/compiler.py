"""AutLearn's compiler (Sec. 3.4: TVM extended with gradient operators, tuned per phone) stood in
for by what runs here: one last-layer training step on a path, `tensorflow` (the baseline,
`tf.function`), `xla` (the same step compiled by XLA, `jit_compile`) or `tflite` (the trainable
TFLite file's `train` signature)."""

from __future__ import annotations

import contextlib
import logging

import numpy as np
import tensorflow as tf

from ondevice.device import tflite
from ondevice.training.step import Step

PATHS = ("tensorflow", "xla", "tflite")


def step_function(path: str, model, task, optimizer: str, learning_rate: float, hooks: list):
    """One training step of `model` on `path`: (x, y) -> loss. Each path has its own optimizer
    state, starting from zero, and trains `model`'s weights as they are (TFLite: a copy of them
    inside the file)."""
    if path == "tflite":
        runner = tflite.interpreter(tflite.convert(Step(model, task, learning_rate, optimizer, hooks)))
        runner = runner.get_signature_runner("train")
        sig = task.signature
        names, dtypes = (sig.inputs.name, sig.labels.name), (sig.inputs.dtype, sig.labels.dtype)
        feed = lambda x, y: {n: np.asarray(v, d.as_numpy_dtype) for n, v, d in zip(names, (x, y), dtypes)}
        return lambda x, y: float(runner(**feed(x, y))["loss"])
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    step = Step(model, task, learning_rate, optimizer, hooks, jit_compile=path == "xla")
    return lambda x, y: float(step.train(x, y)["loss"])


@contextlib.contextmanager
def quiet_tracing():
    """TensorFlow warns when a step function's code is traced again and again (one per path, model
    and variant), naming the function's memory address: a line that differs between two runs of a
    notebook. Warnings are muted for the block; errors still show."""
    logger = tf.get_logger()
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
