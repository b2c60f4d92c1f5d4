"""The trainable TFLite export with inference-result reuse (DeepType Sec. 5.5, AutLearn Sec. 3.5):
the fine-tune export (`device.tflite.TrainableModel`, only the head trains) plus the two
signatures of `training.inference_reuse`, `infer_and_cache` and `train_from_cache`."""

from __future__ import annotations

import tensorflow as tf
import tf_keras as keras

from ondevice.device.tflite import SIGNATURES, TrainableModel
from ondevice.tasks import Task
from ondevice.training.fine_tune import FineTune
from ondevice.training.inference_reuse import HEAD, features_spec, infer_and_cache, split, train_from_cache

REUSE_SIGNATURES = SIGNATURES + ("infer_and_cache", "train_from_cache")


class ReuseTrainableModel(TrainableModel):
    """The fine-tune export (only `head` trains) with `infer_and_cache` and `train_from_cache`; its
    `train` is the fine-tune step, and both update the same variables, so a keyboard may mix them."""

    def __init__(
        self,
        model: keras.Model,
        task: Task,
        learning_rate: float,
        optimizer: str = "adam",
        head: str = HEAD,
        clip_norm=0.0,
    ):
        super().__init__(model, task, learning_rate, optimizer, hooks=[FineTune(head)], clip_norm=clip_norm)
        self.features_model, self.head = split(model, head)
        sig = task.signature
        self.infer_and_cache = tf.function(
            lambda x: infer_and_cache(self.features_model, self.head, x), input_signature=[sig.inputs]
        )
        self.train_from_cache = tf.function(
            lambda f, y: {"loss": train_from_cache(self.head, task, self.optimizer, self.variables_to_train, f, y)},
            input_signature=[features_spec(model, head), sig.labels],
        )
