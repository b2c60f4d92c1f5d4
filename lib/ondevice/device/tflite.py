"""Trainable TFLite export: the on-device API is four signatures, `train`, `infer`, `save`, `restore`.

The signatures' inputs come from the task (`task.signature`), and `train` is
`training.trainer.train_step`, the step the cloud loop runs, with the same hooks, so every
personal model of every paper is exported and parity-checked by this one module. LSTM gradients
and checkpoints need Select TF ops, so files run with the Flex delegate (linked into
TensorFlow 2.19's Python interpreter, and into an Android app through tensorflow-lite-select-tf-ops).
"""

from __future__ import annotations

import logging
import tempfile
import warnings
from typing import Sequence

import numpy as np
import pandas as pd
import tensorflow as tf
import tf_keras as keras

from ..tasks import Task
from ..tasks.next_word import NextWordTask
from ..training.trainer import Hook, make_optimizer, train_step, trainable_variables

_PATH = tf.TensorSpec([], tf.string, name="checkpoint_path")


class TrainableModel(tf.Module):
    """A Keras model, its task, optimizer and hooks, with the four on-device signatures."""

    def __init__(
        self,
        model: keras.Model,
        task: Task,
        learning_rate: float,
        optimizer: str = "adam",
        hooks: Sequence[Hook] = (),
        clip_norm: float = 0.0,
    ):
        super().__init__()
        self.model, self.task, self.hooks = model, task, list(hooks)
        self.variables_to_train = trainable_variables(model, self.hooks)
        self.optimizer = make_optimizer(optimizer, learning_rate, clip_norm)
        self.optimizer.build(self.variables_to_train)
        sig = task.signature
        self.train = tf.function(self._train, input_signature=[sig.inputs, sig.labels])
        self.infer = tf.function(self._infer, input_signature=[sig.inputs])
        self.save = tf.function(self._save, input_signature=[_PATH])
        self.restore = tf.function(self._restore, input_signature=[_PATH])

    def _train(self, inputs, labels):
        return {
            "loss": train_step(
                self.model, self.task, self.optimizer, self.variables_to_train, self.hooks, inputs, labels
            )
        }

    def _infer(self, inputs):
        return {"logits": self.model(inputs, training=False)}

    def _save(self, checkpoint_path):
        weights = self.model.weights
        tf.raw_ops.Save(
            filename=checkpoint_path,
            tensor_names=[w.name for w in weights],
            data=[w.read_value() for w in weights],
            name="save",
        )
        return {"checkpoint_path": checkpoint_path}

    def _restore(self, checkpoint_path):
        for w in self.model.weights:
            value = tf.raw_ops.Restore(file_pattern=checkpoint_path, tensor_name=w.name, dt=w.dtype, name="restore")
            w.assign(tf.reshape(value, w.shape))
        return {"restored": tf.constant(len(self.model.weights))}


SIGNATURES = ("train", "infer", "save", "restore")


def convert(module: tf.Module, signatures: Sequence[str] = SIGNATURES) -> bytes:
    """Flatbuffer with the named signatures of `module` (by default the four of TrainableModel),
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


def compare_training(
    model: keras.Model,
    task: Task,
    learning_rate: float,
    batches,
    optimizer: str = "adam",
    hooks: Sequence[Hook] = (),
    clip_norm: float = 0.0,
) -> dict:
    """Train one copy in TensorFlow and one through the TFLite interpreter from the same weights on
    the same batches. Returns both loss curves, both models' outputs on the first batch after
    training, and the flatbuffer (trainable from the starting weights). `model` is not changed."""
    start = model.get_weights()
    flatbuffer = convert(TrainableModel(model, task, learning_rate, optimizer, hooks, clip_norm))
    twin = keras.models.clone_model(model)
    twin.set_weights(start)
    module = TrainableModel(twin, task, learning_rate, optimizer, hooks, clip_norm)
    tf_losses = [float(module.train(tf.constant(x), tf.constant(y))["loss"]) for x, y in batches]
    interp = interpreter(flatbuffer)
    tflite_losses = train_on_device(interp, task, batches)
    probe = batches[0][0]
    return {
        "tensorflow": tf_losses,
        "tflite": tflite_losses,
        "flatbuffer": flatbuffer,
        "outputs_tensorflow": twin(probe, training=False).numpy(),
        "outputs_tflite": infer_on_device(interp, task, probe),
    }


def parity_table(
    model: keras.Model,
    task: Task,
    learning_rate: float,
    batches,
    optimizer: str = "adam",
    hooks: Sequence[Hook] = (),
    log=None,
    label: str = "",
    clip_norm: float = 0.0,
) -> tuple[pd.DataFrame, bytes]:
    """The one on-device parity table: the same steps in TensorFlow and through the exported
    trainable TFLite model (`compare_training`), one row per step with both losses and their
    difference, and the largest output difference after the steps. Returns it and the flatbuffer."""
    check = compare_training(model, task, learning_rate, batches, optimizer, hooks, clip_norm)
    table = pd.DataFrame(
        {
            "step": range(1, len(check["tflite"]) + 1),
            "loss_tensorflow": check["tensorflow"],
            "loss_tflite": check["tflite"],
        }
    )
    table["abs_difference"] = (table.loss_tflite - table.loss_tensorflow).abs()
    table["max_output_difference_after"] = float(np.abs(check["outputs_tflite"] - check["outputs_tensorflow"]).max())
    table, builtin = _builtin_columns(table, model, task, learning_rate, batches, optimizer, hooks, clip_norm)
    if log:
        log(
            f"on-device check{f' ({label})' if label else ''}: {len(table)} steps through the TFLite interpreter, "
            f"max |loss difference| {table.abs_difference.max():.2e}, max |output difference| after them "
            f"{table.max_output_difference_after.iloc[0]:.2e}; {builtin}"
        )
    return table, check["flatbuffer"]


def _builtin_columns(table: pd.DataFrame, model, task, learning_rate, batches, optimizer, hooks, clip_norm=0.0):
    """The same steps through the builtin-op export in LiteRT (`device.builtin_export`), from the same
    weights: its losses, their difference from TensorFlow's, the largest weight difference after the
    steps, and what trained (`builtin`: all / head), or why the model has no builtin form."""
    from . import builtin_export

    try:
        mode = builtin_export.train_mode(model, hooks)
        length = max(np.shape(x)[1] for x, _ in batches) if isinstance(task, NextWordTask) else None
        check = builtin_export.compare(
            model, task, learning_rate, batches, optimizer, mode, length, clip_norm=clip_norm
        )
    except builtin_export.NotExportable as why:
        return table.assign(
            loss_builtin=np.nan,
            abs_difference_builtin=np.nan,
            max_weight_difference_builtin=np.nan,
            builtin=f"no builtin form: {why}",
        ), f"builtin: {why}"
    w_tf, w_lite = check["weights_tensorflow"], check["weights_litert"]
    table = table.assign(loss_builtin=check["litert"])
    table["abs_difference_builtin"] = (table.loss_builtin - table.loss_tensorflow).abs()
    table["max_weight_difference_builtin"] = max(float(np.abs(w_lite[k] - w_tf[k]).max()) for k in w_tf)
    table["builtin"] = mode
    return table, (f"builtin export ({mode}) in LiteRT: max |loss difference| {table.abs_difference_builtin.max():.2e}")
