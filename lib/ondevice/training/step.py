"""One training step for every place a model trains: the cloud loop (`trainer.Trainer`), the
trainable TFLite export (`device.tflite` converts a `Step` as it is), online training with reuse
of inference results (`inference_reuse.OnlineTrainer`), and the reference that the builtin-op
export (`device.builtin_export`) is checked against.

A technique enters training through a `Hook`: it may choose which variables train (layer
freezing, fine-tuning the last layer), add a loss term (distillation), transform gradients
(masks) or supply the batches (a feature-map cache). Hooks compose: a "combined" row is a list
of hooks.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import tensorflow as tf
import tf_keras as keras

from ..tasks import Task

OPTIMIZERS = {"adam": keras.optimizers.Adam, "sgd": keras.optimizers.SGD}
_PATH = tf.TensorSpec([], tf.string, name="checkpoint_path")


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


def make_optimizer(name: str, learning_rate: float, clip_norm: float = 0.0):
    """`clip_norm` > 0 rescales the gradients whenever their global norm exceeds it (PTB: 5)."""
    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {sorted(OPTIMIZERS)}, got {name!r}")
    if clip_norm < 0:
        raise ValueError(f"clip_norm must be >= 0 (0 = no clipping), got {clip_norm}")
    return OPTIMIZERS[name](learning_rate, global_clipnorm=clip_norm or None)


def trainable_variables(model: keras.Model, hooks: Sequence[Hook]) -> list:
    variables = list(model.trainable_variables)
    for hook in hooks:
        variables = hook.trainable(model, variables)
    if not variables:
        raise ValueError("no variable is left to train")
    return variables


def train_step(model, task: Task, optimizer, variables, hooks: Sequence[Hook], inputs, labels):
    """Task loss plus the hooks' terms, and one optimizer update of `variables`. Returns the total loss."""
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


class Step(tf.Module):
    """A model, its task, the variables that train (after the hooks) and their optimizer, with the
    step as TensorFlow functions: `train(inputs, labels) -> {"loss"}`, `infer(inputs) -> {"logits"}`,
    `save` / `restore(checkpoint_path)`. These are the signatures of the trainable TFLite file, so
    the cloud and the phone run one graph; `reset` starts again from given weights. `jit_compile`
    `True` compiles `train` with XLA (AutLearn's compiler stand-in)."""

    def __init__(
        self,
        model: keras.Model,
        task: Task,
        learning_rate: float,
        optimizer: str = "adam",
        hooks: Sequence[Hook] = (),
        clip_norm: float = 0.0,
        jit_compile: bool | None = None,
    ):
        super().__init__()
        self.model, self.task, self.hooks = model, task, list(hooks)
        self.variables_to_train = trainable_variables(model, self.hooks)
        self.learning_rate, self.optimizer_name, self.clip_norm = learning_rate, optimizer, clip_norm
        self.optimizer = make_optimizer(optimizer, learning_rate, clip_norm)
        self.optimizer.build(self.variables_to_train)
        sig = task.signature  # unknown batch and length: one trace (XLA still compiles once per shape)
        self.train = tf.function(self._train, input_signature=[sig.inputs, sig.labels], jit_compile=jit_compile)
        self.infer = tf.function(self._infer, input_signature=[sig.inputs])

    def _train(self, inputs, labels):
        variables = self.variables_to_train
        return {"loss": train_step(self.model, self.task, self.optimizer, variables, self.hooks, inputs, labels)}

    def _infer(self, inputs):
        return {"logits": self.model(inputs, training=False)}

    @tf.function(input_signature=[_PATH])
    def save(self, checkpoint_path):
        weights = self.model.weights
        tf.raw_ops.Save(
            filename=checkpoint_path,
            tensor_names=[w.name for w in weights],
            data=[w.read_value() for w in weights],
            name="save",
        )
        return {"checkpoint_path": checkpoint_path}

    @tf.function(input_signature=[_PATH])
    def restore(self, checkpoint_path):
        for w in self.model.weights:
            value = tf.raw_ops.Restore(file_pattern=checkpoint_path, tensor_name=w.name, dt=w.dtype, name="restore")
            w.assign(tf.reshape(value, w.shape))
        return {"restored": tf.constant(len(self.model.weights))}

    def reset(self, weights: list[np.ndarray]) -> None:
        """Start again from given weights with a fresh optimizer state (a new user, a restart)."""
        self.model.set_weights(weights)
        for v in self.optimizer.variables:
            v.assign(tf.zeros_like(v))
        self.optimizer.learning_rate = self.learning_rate
