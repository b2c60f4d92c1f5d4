"""Trainable TFLite export: the on-device API is four signatures, `train`, `infer`, `save`, `restore`.

The personal model is wrapped in a tf.Module whose train signature is `train.train_step`, the
step `train.Trainer` runs in the cloud; LSTM gradients and checkpoints need Select TF ops, so the
file runs with the Flex delegate (linked into TensorFlow 2.19's Python interpreter, and into an
Android app through tensorflow-lite-select-tf-ops).
"""
from __future__ import annotations

import logging
import tempfile
import warnings

import numpy as np
import tensorflow as tf
import tf_keras as keras

from ..training.trainer import train_step

_TOKENS = tf.TensorSpec([None, None], tf.int32, name="tokens")
_LABELS = tf.TensorSpec([None, None], tf.int32, name="labels")
_PATH = tf.TensorSpec([], tf.string, name="checkpoint_path")


class TrainableModel(tf.Module):
    """A Keras model plus its optimizer, with the four on-device signatures."""

    def __init__(self, model: keras.Model, learning_rate: float):
        super().__init__()
        self.model = model
        self.optimizer = keras.optimizers.Adam(learning_rate)
        self.optimizer.build(model.trainable_variables)

    @tf.function(input_signature=[_TOKENS, _LABELS])
    def train(self, tokens, labels):
        return {"loss": train_step(self.model, self.optimizer, tokens, labels)}

    @tf.function(input_signature=[_TOKENS])
    def infer(self, tokens):
        return {"logits": self.model(tokens, training=False)}

    @tf.function(input_signature=[_PATH])
    def save(self, checkpoint_path):
        weights = self.model.weights
        tf.raw_ops.Save(filename=checkpoint_path, tensor_names=[w.name for w in weights],
                        data=[w.read_value() for w in weights], name="save")
        return {"checkpoint_path": checkpoint_path}

    @tf.function(input_signature=[_PATH])
    def restore(self, checkpoint_path):
        restored = {}
        for w in self.model.weights:
            value = tf.raw_ops.Restore(file_pattern=checkpoint_path, tensor_name=w.name, dt=w.dtype, name="restore")
            w.assign(tf.reshape(value, w.shape))
            restored[w.name] = value
        return {"restored": tf.constant(len(restored))}


def convert(module: TrainableModel) -> bytes:
    """Flatbuffer with all four signatures, builtin ops where possible and Flex ops elsewhere."""
    tf_logger = tf.get_logger()
    level = tf_logger.level
    tf_logger.setLevel(logging.ERROR)  # "Assets written to /tmp/..." on every save
    with tempfile.TemporaryDirectory() as saved:
        tf.saved_model.save(module, saved, signatures={
            "train": module.train.get_concrete_function(),
            "infer": module.infer.get_concrete_function(),
            "save": module.save.get_concrete_function(),
            "restore": module.restore.get_concrete_function(),
        })
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


def train_on_device(interp: tf.lite.Interpreter, batches) -> list[float]:
    """Losses of the TFLite `train` signature over (tokens, labels) batches, in order."""
    train = interp.get_signature_runner("train")
    return [float(train(tokens=np.asarray(x, np.int32), labels=np.asarray(y, np.int32))["loss"]) for x, y in batches]


def compare_training(model: keras.Model, learning_rate: float, batches) -> dict:
    """Train one copy in TensorFlow and one through the TFLite interpreter from the same weights,
    on the same batches; return both loss curves and the flatbuffer (trainable from `weights`)."""
    weights = model.get_weights()
    tf_module = TrainableModel(keras.models.clone_model(model), learning_rate)
    tf_module.model.set_weights(weights)
    flatbuffer = convert(TrainableModel(model, learning_rate))
    tf_losses = [float(tf_module.train(tf.constant(x), tf.constant(y))["loss"]) for x, y in batches]
    tflite_losses = train_on_device(interpreter(flatbuffer), batches)
    return {"tensorflow": tf_losses, "tflite": tflite_losses, "flatbuffer": flatbuffer}
