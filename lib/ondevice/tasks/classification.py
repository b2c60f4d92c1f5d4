"""Classification of fixed-shape inputs: single-label (images: top-1) or multi-label (audio
tagging: mean ROC AUC over classes, as MoIL scores YAMNet)."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from ..metrics import accuracy, mean_auc
from . import Signature, Task, inference


class ClassificationTask(Task):
    """Data is a pair (inputs, labels) of arrays: labels are class ids, or multi-hot rows when
    `multi_label`. The model outputs logits."""

    def __init__(
        self,
        input_shape: tuple[int, ...],
        classes: int,
        multi_label: bool = False,
        input_dtype=tf.float32,
        eval_batch_size: int = 256,
    ):
        self.classes = classes
        self.multi_label = multi_label
        self.eval_batch_size = eval_batch_size
        self.name = "multi_label" if multi_label else "classification"
        labels = (
            tf.TensorSpec([None, classes], tf.float32, name="labels")
            if multi_label
            else tf.TensorSpec([None], tf.int32, name="labels")
        )
        self.signature = Signature(tf.TensorSpec([None, *input_shape], input_dtype, name="inputs"), labels)

    def batches(self, data, batch_size, rng):
        x, y = data
        order = rng.permutation(len(x)) if rng is not None else np.arange(len(x))
        for i in range(0, len(x), batch_size):
            idx = order[i : i + batch_size]
            yield x[idx], y[idx]

    def loss(self, labels, outputs):
        if self.multi_label:
            return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=outputs))
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=outputs))

    def size(self, data) -> int:
        return len(data[0])

    def predict(self, model, x: np.ndarray) -> np.ndarray:
        forward, step = inference(model), self.eval_batch_size
        return np.concatenate([forward(x[i : i + step]).numpy() for i in range(0, len(x), step)])

    def evaluate(self, model, data) -> dict:
        x, y = data
        logits = self.predict(model, x)
        if self.multi_label:
            return {"auc": mean_auc(y, logits), "loss": float(self.loss(tf.constant(y, tf.float32), logits))}
        return {"accuracy": accuracy(y, logits), "loss": float(self.loss(tf.constant(y, tf.int32), logits))}
