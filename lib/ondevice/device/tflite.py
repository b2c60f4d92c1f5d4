"""Trainable TFLite export in Flex mode: a `training.step.Step` converted as it is, so the phone runs
the cloud loop's own step. The on-device API is its four signatures, `train`, `infer`, `save`,
`restore` (with inference reuse also `infer_and_cache`, `train_from_cache`), whose inputs come from
the task (`task.signature`). LSTM gradients and checkpoints need Select TF ops, so files run with
the Flex delegate (linked into TensorFlow 2.19's Python interpreter, and into an Android app through
tensorflow-lite-select-tf-ops). Parity with TensorFlow and the builtin export: `device.parity`.
"""

from __future__ import annotations

import logging
import tempfile
import warnings
from typing import Sequence

import numpy as np
import tensorflow as tf

from ..tasks import Task

SIGNATURES = ("train", "infer", "save", "restore")
REUSE_SIGNATURES = SIGNATURES + ("infer_and_cache", "train_from_cache")  # training.inference_reuse.OnlineTrainer


def convert(module: tf.Module, signatures: Sequence[str] = SIGNATURES) -> bytes:
    """Flatbuffer with the named signatures of `module` (by default the four of a `Step`),
    builtin ops where possible and Flex ops elsewhere."""
    tf_logger = tf.get_logger()
    level = tf_logger.level
    tf_logger.setLevel(logging.ERROR)  # "Assets written to /tmp/..." on every save
    with tempfile.TemporaryDirectory() as saved:
        tf.saved_model.save(
            module, saved, signatures={name: getattr(module, name).get_concrete_function() for name in signatures}
        )
        converter = tf.lite.TFLiteConverter.from_saved_model(saved)
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS, tf.lite.OpsSet.SELECT_TF_OPS]
        converter.experimental_enable_resource_variables = True
        try:
            return converter.convert()
        finally:
            tf_logger.setLevel(level)


def interpreter(flatbuffer: bytes) -> tf.lite.Interpreter:
    """tf.lite.Interpreter warns it moves to ai_edge_litert after 2.19; we pin 2.19 because its
    interpreter links the Flex delegate (LiteRT's does not), so the warning is expected."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*tf.lite.Interpreter is deprecated.*")
        interp = tf.lite.Interpreter(model_content=flatbuffer)
    interp.allocate_tensors()
    return interp


def _feed(task: Task, inputs, labels=None) -> dict:
    sig = task.signature
    feed = {sig.inputs.name: np.asarray(inputs, sig.inputs.dtype.as_numpy_dtype)}
    if labels is not None:
        feed[sig.labels.name] = np.asarray(labels, sig.labels.dtype.as_numpy_dtype)
    return feed


def train_on_device(interp: tf.lite.Interpreter, task: Task, batches) -> list[float]:
    """Losses of the TFLite `train` signature over (inputs, labels) batches, in order."""
    train = interp.get_signature_runner("train")
    return [float(train(**_feed(task, x, y))["loss"]) for x, y in batches]


def infer_on_device(interp: tf.lite.Interpreter, task: Task, inputs) -> np.ndarray:
    return interp.get_signature_runner("infer")(**_feed(task, inputs))["logits"]
