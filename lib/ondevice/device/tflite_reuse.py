"""Trainable TFLite export with inference-result reuse, and the inventory of a file's Flex ops.

`ReuseTrainableModel` is `tflite.TrainableModel` with the fine-tune hook and two more signatures:
`infer_and_cache(tokens) -> logits, features` and `train_from_cache(features, labels) -> loss`
(DeepType Sec. 5.5). Its `train` signature is the fine-tune step; `train_from_cache` updates the
same softmax variables with the same optimizer, so a keyboard may mix both.

`flex_ops(flatbuffer)` lists the Select TF ops a file needs (the Flex delegate runs them): TFLite
stores a custom operator's name as a flatbuffer string (a little-endian uint32 length, the bytes,
a NUL), and the converter names every Select op "Flex<TF op name>". We accept a match only when
its length prefix and terminator agree, which a tensor name merely containing "Flex" does not.
"""
from __future__ import annotations

import re
import struct
from typing import Sequence

import numpy as np
import tensorflow as tf
import tf_keras as keras

from ..tasks import Task
from ondevice.papers.deeptype.techniques import inference_reuse
from ondevice.papers.deeptype.techniques.fine_tune import FineTune
from . import tflite
from .tflite import TrainableModel

BASE_SIGNATURES = ("train", "infer", "save", "restore")
REUSE_SIGNATURES = BASE_SIGNATURES + ("infer_and_cache", "train_from_cache")
_FLEX = re.compile(rb"Flex[A-Za-z0-9_]+\x00")


class ReuseTrainableModel(TrainableModel):
    """Fine-tune export (only `head` trains) with `infer_and_cache` and `train_from_cache`."""

    def __init__(self, model: keras.Model, task: Task, learning_rate: float, optimizer: str = "adam",
                 head: str = inference_reuse.HEAD):
        super().__init__(model, task, learning_rate, optimizer, hooks=[FineTune(head)])
        self.features_model, self.head = inference_reuse.split(model, head)
        sig = task.signature
        self.infer_and_cache = tf.function(self._infer_and_cache, input_signature=[sig.inputs])
        self.train_from_cache = tf.function(
            self._train_from_cache, input_signature=[inference_reuse.features_spec(model, head), sig.labels])

    def _infer_and_cache(self, inputs):
        return inference_reuse.infer_and_cache(self.features_model, self.head, inputs)

    def _train_from_cache(self, features, labels):
        return {"loss": inference_reuse.train_from_cache(self.head, self.task, self.optimizer,
                                                         self.variables_to_train, features, labels)}


def convert(module: tf.Module, signatures: Sequence[str] = REUSE_SIGNATURES) -> bytes:
    """Flatbuffer with the reuse signatures as well as the four usual ones."""
    return tflite.convert(module, signatures)


def flex_ops(flatbuffer: bytes) -> list[str]:
    """Sorted names of the Select TF ops (without the "Flex" prefix) that the file uses."""
    found = set()
    for m in _FLEX.finditer(flatbuffer):
        name = m.group()[:-1]
        start = m.start()
        if start >= 4 and struct.unpack_from("<I", flatbuffer, start - 4)[0] == len(name):
            found.add(name[4:].decode())
    return sorted(found)


def signature_details(interp: tf.lite.Interpreter) -> dict:
    """Each signature's inputs and outputs with shapes (-1: any) and dtypes."""
    out = {}
    for name in interp.get_signature_list():
        runner = interp.get_signature_runner(name)
        io = {}
        for kind, details in (("inputs", runner.get_input_details()), ("outputs", runner.get_output_details())):
            io[kind] = {k: {"shape": [int(s) for s in d["shape_signature"]], "dtype": np.dtype(d["dtype"]).name}
                        for k, d in sorted(details.items())}
        out[name] = io
    return out
