"""Trainable TFLite export from builtin ops only: signatures `train`, `infer`, `get_weights` and
`set_weights`, run by LiteRT (`ai-edge-litert`) with no Flex delegate.

Why: `device.tflite` exports `training.trainer.train_step` as it is, and its LSTM gradients (While
and TensorList ops) and checkpoints (Save, Restore) become Select TF ops that only the Flex delegate
runs; pip TensorFlow >= 2.20, ai-edge-litert and Android's select-TF-ops AAR (after 2.16.1) have
none. So here the training step is written out with ops that have builtin kernels:

- forward: an LSTM unrolled over a fixed number of steps (no While, no TensorList). A next-word
  batch is right-padded to that length with <pad>; the loss mask (label <pad>) drops the padded
  positions, and a forward LSTM's real positions never see them, so loss and gradients are those
  of the unpadded batch;
- backward: gradients by hand (back-propagation through time for the LSTM, segment sums for the
  embeddings). Tried: a GradientTape over such an unrolled LSTM lowers to Flex ops
  (BroadcastGradientArgs for a dynamic batch, StridedSliceGrad, SparseSoftmaxCrossEntropyWithLogits);
- optimizer: Keras's SGD and Adam update rules as arithmetic on resource variables, which convert
  to the builtin VAR_HANDLE, READ_VARIABLE and ASSIGN_VARIABLE;
- weights: `get_weights` returns, and `set_weights` assigns, the weights that change on the device
  (those that train, and the M-RNN's slot switches) as named tensors; the app stores them itself,
  where the Flex export wrote a checkpoint with Save/Restore ops.

What trains (`train=`): "all" (the LSTM language model: embedding, both LSTMs, softmax, and the
projection of an SVD-compressed softmax; a vocabulary-compressed or structurally pruned LM is the
same graph with smaller shapes, a magnitude-pruned one the same with zeros; the Colla
M-RNN: six embeddings, LSTM, FC) or "head", the last Dense layer (the LM's softmax: DeepType's
fine-tune and AutLearn's last layer; the classifier of MobileNetV2 and YAMNet, MoIL's LF(1); the
MobileNetV1 `logits` layer, AutLearn's; the M-RNN's FC). Layers that do not train are constants in
the file. Convolution, depthwise convolution and batch norm gradients (Conv2DBackpropFilter,
DepthwiseConv2dNativeBackprop*, FusedBatchNormGrad) have no builtin kernel, so conv models train
their head only. Optional signatures: `train_distill` (Colla's client update, Eq. 2, the teacher's
probabilities given as an input) and `infer_and_cache` / `train_from_cache` (DeepType's online path:
the head trains from the features the inference computed).

`compare` trains a copy with TensorFlow's `Trainer` and the exported file in LiteRT on the same
batches; `parity_row` sums that up. `python -m ondevice.device.builtin_export --out DIR` exports a
small instance of every family in both modes, writes `manifest.json` and compares them.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np
import tensorflow as tf
import tf_keras as keras

from ..data.places import FEATURES
from ..data.typing_samples import PAD_ID
from ..models import mrnn
from ..tasks import Task
from ..tasks.classification import ClassificationTask
from ..tasks.next_word import NextWordTask
from ..training.trainer import Hook, Trainer, make_optimizer
from . import litert

TRAIN_ALL, TRAIN_HEAD = "all", "head"
SIGNATURES = ("train", "infer", "get_weights", "set_weights")


class NotExportable(ValueError):
    """The model or its training set-up has no builtin-op form here (the message says why)."""


# --- layers written with builtin ops -------------------------------------------------------------


class _Stage(tf.Module):
    """Keras layers' computation with builtin ops. `forward` returns the output and what `backward`
    needs; `backward` returns the gradients of `params` (when `train`) and, if asked, of the input.
    Parameters are variables when they change on the device (`train` or `kept`), else constants."""

    def __init__(self, layers: Sequence[keras.layers.Layer], train: bool, kept: bool = False):
        super().__init__()
        self.layer_names = [layer.name for layer in layers]
        self.train, self.kept = train, train or kept
        weights = [(layer, w) for layer in layers for w in layer.weights]
        # signature name of a weight: its layer's name and its own (softmax_kernel, lstm_1_bias)
        self.keys = [f"{layer.name}_{w.name.split('/')[-1].split(':')[0]}" for layer, w in weights]
        self.params = [
            tf.Variable(w.numpy(), name=k) if self.kept else tf.constant(w.numpy())
            for k, (_, w) in zip(self.keys, weights)
        ]

    def forward(self, x):
        raise NotImplementedError

    def backward(self, saved, dy, need_dx: bool):
        raise NotImplementedError


class _Embeddings(_Stage):
    """Ids -> vectors: one table (the LM) or one per id feature on the last axis, concatenated in
    order (the M-RNN). The gradient of a table sums the rows' gradients per id."""

    def forward(self, ids):
        if len(self.params) == 1:
            return tf.gather(self.params[0], ids), ids
        return tf.concat([tf.gather(t, ids[..., i]) for i, t in enumerate(self.params)], axis=-1), ids

    def backward(self, ids, dy, need_dx):
        parts = [dy] if len(self.params) == 1 else tf.split(dy, len(self.params), axis=-1)
        columns = [ids] if len(self.params) == 1 else [ids[..., i] for i in range(len(self.params))]
        grads = [
            tf.math.unsorted_segment_sum(tf.reshape(d, [-1, t.shape[1]]), tf.reshape(c, [-1]), t.shape[0])
            for t, d, c in zip(self.params, parts, columns)
        ]
        return grads, None


class _LSTM(_Stage):
    """Keras's LSTM (gates i, f, c, o; sigmoid and tanh) unrolled over the input's fixed length,
    every step's output (`return_sequences`) or the last one."""

    def __init__(self, layer: keras.layers.LSTM, train: bool):
        c = layer.get_config()
        if (c["activation"], c["recurrent_activation"], c["use_bias"]) != ("tanh", "sigmoid", True) or (
            c["dropout"] or c["recurrent_dropout"] or c["go_backwards"] or c["stateful"] or c["return_state"]
        ):
            raise NotExportable(
                f"{layer.name}: only a plain Keras LSTM (tanh, sigmoid, bias, no dropout) is written out"
            )
        super().__init__([layer], train)
        self.sequences = c["return_sequences"]

    def forward(self, x):
        kernel, recurrent, bias = self.params
        steps, units = x.shape[1], recurrent.shape[0]
        if steps is None:
            raise ValueError("the LSTM is unrolled: the input needs a fixed sequence length")
        xk = tf.reshape(tf.matmul(tf.reshape(x, [-1, x.shape[-1]]), kernel), [-1, steps, 4 * units])
        h = c = tf.zeros([tf.shape(x)[0], units])
        saved, outputs = [], []
        for xk_t in tf.unstack(xk, axis=1):
            z = xk_t + tf.matmul(h, recurrent) + bias  # Keras's order: x.K + h.R, then the bias
            i, f, g, o = tf.split(z, 4, axis=-1)
            i, f, g, o = tf.sigmoid(i), tf.sigmoid(f), tf.tanh(g), tf.sigmoid(o)
            c_next = f * c + i * g
            tanh_c = tf.tanh(c_next)
            saved.append((h, c, i, f, g, o, tanh_c))
            h, c = o * tanh_c, c_next
            outputs.append(h)
        return (tf.stack(outputs, axis=1) if self.sequences else h), (x, saved)

    def backward(self, cache, dy, need_dx):
        x, saved = cache
        kernel, recurrent, _ = self.params
        steps, units = len(saved), recurrent.shape[0]
        dh_out = tf.unstack(dy, axis=1) if self.sequences else [None] * (steps - 1) + [dy]
        dh_next = dc_next = None
        dz = [None] * steps
        for t in reversed(range(steps)):
            _, c_prev, i, f, g, o, tanh_c = saved[t]
            dh = dh_out[t] if dh_next is None else (dh_next if dh_out[t] is None else dh_out[t] + dh_next)
            dc = dh * o * (1.0 - tanh_c * tanh_c)
            dc = dc if dc_next is None else dc + dc_next
            dz[t] = tf.concat(
                [
                    dc * g * i * (1.0 - i),
                    dc * c_prev * f * (1.0 - f),
                    dc * i * (1.0 - g * g),
                    dh * tanh_c * o * (1.0 - o),
                ],
                axis=-1,
            )
            dh_next, dc_next = tf.matmul(dz[t], recurrent, transpose_b=True), dc * f
        # the weights' gradients sum over steps: one product over all of them
        dz_all = tf.reshape(tf.stack(dz, axis=1), [-1, 4 * units])
        h_prev = tf.reshape(tf.stack([s[0] for s in saved], axis=1), [-1, units])
        x_all = tf.reshape(x, [-1, x.shape[-1]])
        grads = [
            tf.matmul(x_all, dz_all, transpose_a=True),
            tf.matmul(h_prev, dz_all, transpose_a=True),
            tf.reduce_sum(dz_all, axis=0),
        ]
        dx = tf.reshape(tf.matmul(dz_all, kernel, transpose_b=True), [-1, *x.shape[1:]]) if need_dx else None
        return grads, dx


class _Dense(_Stage):
    """Keras's Dense (linear, with or without bias: the SVD-compressed softmax's projection has none)
    on the last axis."""

    def __init__(self, layer: keras.layers.Dense, train: bool):
        if layer.get_config()["activation"] != "linear":
            raise NotExportable(f"{layer.name}: only a linear Dense layer is written out")
        super().__init__([layer], train)

    def forward(self, x):
        kernel = self.params[0]
        y = tf.matmul(tf.reshape(x, [-1, kernel.shape[0]]), kernel)
        y = y + self.params[1] if len(self.params) == 2 else y
        return tf.reshape(y, [-1, *x.shape[1:-1], kernel.shape[1]]), x

    def backward(self, x, dy, need_dx):
        kernel = self.params[0]
        x2, dy2 = tf.reshape(x, [-1, kernel.shape[0]]), tf.reshape(dy, [-1, kernel.shape[1]])
        grads = [tf.matmul(x2, dy2, transpose_a=True)] + ([tf.reduce_sum(dy2, axis=0)] if len(self.params) == 2 else [])
        dx = tf.reshape(tf.matmul(dy2, kernel, transpose_b=True), [-1, *x.shape[1:]]) if need_dx else None
        return grads, dx


class _SlotMask(_Stage):
    """The M-RNN's switchable FC slots: kept on the device (a place switches a slot on), never trained."""

    def __init__(self, layer: mrnn.SlotMask):
        super().__init__([layer], train=False, kept=True)

    def forward(self, x):
        return x + (1.0 - self.params[0]) * mrnn.OFF, None

    def backward(self, saved, dy, need_dx):
        return [], dy


class _Frozen(_Stage):
    """A Keras model that does not train, run in inference mode (batch norm on moving statistics):
    the feature extractor below a conv model's head. Its ops are inference ops, all builtin."""

    def __init__(self, model: keras.Model):
        super().__init__([], train=False)
        self.model = model

    def forward(self, x):
        return self.model(x, training=False), None


def _stages(model: keras.Model, train: str) -> list[_Stage]:
    """The model as a chain of stages, by family: the LSTM LM (embedding, LSTMs, `softmax`), the
    M-RNN (`embed_<feature>`, `lstm`, `fc`, optional `slots`), or any model whose last layer is a
    Dense head over features (MobileNetV1/V2, YAMNet), which trains the head only."""
    if train not in (TRAIN_ALL, TRAIN_HEAD):
        raise ValueError(f"train must be {TRAIN_ALL!r} or {TRAIN_HEAD!r}, got {train!r}")
    names = {layer.name for layer in model.layers}
    every = train == TRAIN_ALL
    chain = None
    if {"embedding", "softmax"} <= names:
        lstms = [layer for layer in model.layers if isinstance(layer, keras.layers.LSTM)]
        # Dense layers between the last LSTM and the softmax: the SVD-compressed softmax's projection
        after = model.layers[model.layers.index(lstms[-1]) + 1 : model.layers.index(model.get_layer("softmax"))]
        projections = [layer for layer in after if isinstance(layer, keras.layers.Dense)]
        chain = (
            [_Embeddings([model.get_layer("embedding")], every)]
            + [_LSTM(layer, every) for layer in lstms]
            + [_Dense(layer, every) for layer in projections]
            + [_Dense(model.get_layer("softmax"), True)]
        )
    elif {"lstm", "fc"} <= names and {f"embed_{f}" for f in FEATURES} <= names:
        chain = [
            _Embeddings([model.get_layer(f"embed_{f}") for f in FEATURES], every),
            _LSTM(model.get_layer("lstm"), every),
            _Dense(model.get_layer("fc"), True),
        ]
        chain += [_SlotMask(model.get_layer("slots"))] if "slots" in names else []
    if chain is not None:  # a layer with weights outside the chain (a variant's extra layer) would be skipped
        missing = {layer.name for layer in model.layers if layer.weights} - {n for s in chain for n in s.layer_names}
        if missing:
            raise NotExportable(f"{model.name}: builtin export does not write out layers {sorted(missing)}")
        return chain
    head = model.layers[-1]
    if not isinstance(head, keras.layers.Dense):
        raise NotExportable(f"{model.name}: not an LSTM LM, an M-RNN, or a model ending in a Dense head")
    if every:
        raise NotExportable(
            f"{model.name}: conv, depthwise and batch norm gradients have no builtin kernels; "
            f"only train={TRAIN_HEAD!r} (the Dense head) exports"
        )
    return [_Frozen(keras.Model(model.input, head.input)), _Dense(head, True)]


# --- loss and optimizer --------------------------------------------------------------------------


def distillation_loss_and_gradient(lam: float, labels, teacher, logits):
    """Colla's Eq. 2 for a single-label classifier, as its DistillationHook adds it to the task's
    loss: lam * CE(y, p) + (1 - lam) * CE(q, p), q the teacher's probabilities (rows summing to 1),
    and its gradient w.r.t. the logits, (p - (lam * onehot(y) + (1 - lam) * q)) / n."""
    log_p = tf.nn.log_softmax(logits)
    target = lam * tf.one_hot(labels, logits.shape[-1]) + (1.0 - lam) * teacher
    n = tf.cast(tf.shape(labels)[0], tf.float32)
    return -tf.reduce_sum(target * log_p) / n, (tf.exp(log_p) - target) / n


def loss_and_gradient(task: Task, labels, logits):
    """The task's training loss, computed as `task.loss` does, and its gradient w.r.t. the logits."""
    if isinstance(task, NextWordTask):  # cross-entropy over positions whose label is not <pad>
        mask = tf.cast(tf.not_equal(labels, PAD_ID), tf.float32)
        log_p = tf.nn.log_softmax(logits)
        one_hot = tf.one_hot(labels, logits.shape[-1])  # per position, or summed per sample (PTB)
        count = tf.reduce_sum(mask) if task.loss_per == "position" else tf.cast(tf.shape(labels)[0], tf.float32)
        loss = tf.reduce_sum(-tf.reduce_sum(one_hot * log_p, axis=-1) * mask) / count
        return loss, (tf.exp(log_p) - one_hot) * (mask / count)[..., None]
    if isinstance(task, ClassificationTask) and task.multi_label:  # mean sigmoid cross-entropy
        ce = tf.nn.relu(logits) - logits * labels + tf.math.log1p(tf.exp(-tf.abs(logits)))
        n = tf.cast(tf.shape(labels)[0] * labels.shape[1], tf.float32)
        return tf.reduce_sum(ce) / n, (tf.sigmoid(logits) - labels) / n
    if isinstance(task, ClassificationTask):  # mean softmax cross-entropy
        log_p = tf.nn.log_softmax(logits)
        one_hot = tf.one_hot(labels, logits.shape[-1])
        n = tf.cast(tf.shape(labels)[0], tf.float32)
        return -tf.reduce_sum(one_hot * log_p) / n, (tf.exp(log_p) - one_hot) / n
    raise TypeError(f"no builtin loss for task {type(task).__name__}")


class _Optimizer(tf.Module):
    """The update rule of `training.trainer.make_optimizer(name, learning_rate, clip_norm)` (Keras's
    SGD or Adam, hyperparameters read from it, gradients clipped to a global norm) as arithmetic on
    variables, in Keras's order of operations."""

    def __init__(self, name: str, learning_rate: float, variables: list, clip_norm: float = 0.0):
        super().__init__()
        config = make_optimizer(name, learning_rate, clip_norm).get_config()
        self.clip_norm = config.pop("global_clipnorm", None)
        extras = {k: config.get(k) for k in ("weight_decay", "clipnorm", "clipvalue")}
        if any(extras.values()) or config.get("use_ema") or config.get("amsgrad") or config.get("momentum"):
            raise ValueError(f"builtin export writes out plain SGD and Adam only, got {config}")
        self.kind, self.config = name, config
        if name == "adam":
            self.step = tf.Variable(0.0, name="adam_step")
            self.m = [tf.Variable(tf.zeros_like(v), name="adam_m") for v in variables]
            self.v = [tf.Variable(tf.zeros_like(v), name="adam_v") for v in variables]

    def apply(self, grads, variables):
        lr = self.config["learning_rate"]
        if self.clip_norm:  # as tf.clip_by_global_norm: scaled down when the global norm exceeds the limit
            norm = tf.sqrt(tf.add_n([tf.reduce_sum(tf.square(g)) for g in grads]))
            grads = [g * (self.clip_norm / tf.maximum(norm, self.clip_norm)) for g in grads]
        if self.kind == "sgd":
            for var, g in zip(variables, grads):
                var.assign_add(-g * lr)
            return
        b1, b2, eps = self.config["beta_1"], self.config["beta_2"], self.config["epsilon"]
        t = self.step + 1.0
        self.step.assign(t)
        alpha = lr * tf.sqrt(1 - tf.pow(b2, t)) / (1 - tf.pow(b1, t))
        for var, g, m, v in zip(variables, grads, self.m, self.v):
            m_t = m + (g - m) * (1 - b1)
            v_t = v + (tf.square(g) - v) * (1 - b2)
            m.assign(m_t)
            v.assign(v_t)
            var.assign_sub((m_t * alpha) / (tf.sqrt(v_t) + eps))

    def reset(self):
        for s in ([self.step] + self.m + self.v) if self.kind == "adam" else []:
            s.assign(tf.zeros_like(s))


# --- the module and its conversion ---------------------------------------------------------------


class BuiltinTrainable(tf.Module):
    """A Keras model of a known family, its task and optimizer, with the four builtin signatures.

    `train(inputs, labels) -> loss`; `infer(inputs) -> logits`; `get_weights() -> {key: weight}`;
    `set_weights(**{key: weight})` assigns them and resets the optimizer state (as `Trainer.reset`:
    a new user, or a restart, begins with a fresh optimizer). Keys are `<layer>_<weight>`
    (`softmax_kernel`). `sequence_length` fixes a next-word batch's length (pad shorter batches
    with `pad`). `model` itself is not changed.

    Optional signatures: `distill=lam` adds `train_distill(inputs, labels, teacher) -> loss`, Colla's
    client update (Eq. 2) with the teacher's probabilities over the student's outputs given by the
    app (the pulled cloud model's `infer`, restricted to the device's places and renormalised);
    `reuse=True` (head training only) adds DeepType's online path, `infer_and_cache(inputs) ->
    logits, features` and `train_from_cache(features, labels) -> loss`, which trains the head on
    the features the inference already computed instead of running the frozen layers again.
    """

    def __init__(
        self,
        model: keras.Model,
        task: Task,
        learning_rate: float,
        optimizer: str = "adam",
        train: str = TRAIN_ALL,
        sequence_length: int | None = None,
        distill: float | None = None,
        reuse: bool = False,
        clip_norm: float = 0.0,
    ):
        super().__init__()
        self.task, self.train_mode = task, train
        self.stages = _stages(model, train)
        self.first = next(i for i, s in enumerate(self.stages) if s.train)
        kept = [(k, p) for s in self.stages if s.kept for k, p in zip(s.keys, s.params)]
        self.keys, self.kept = [k for k, _ in kept], [p for _, p in kept]
        self.trained_keys = [k for s in self.stages if s.train for k in s.keys]
        self.trained_layers = [n for s in self.stages if s.train for n in s.layer_names]
        trained = [p for s in self.stages if s.train for p in s.params]
        self.optimizer = _Optimizer(optimizer, learning_rate, trained, clip_norm)
        self._trained = trained
        sig = task.signature
        self.sequence_length = sequence_length
        inputs, labels = _fixed(sig.inputs, sequence_length), _fixed(sig.labels, sequence_length)
        self.train = tf.function(self._train, input_signature=[inputs, labels])
        self.infer = tf.function(self._infer, input_signature=[inputs])
        self.get_weights = tf.function(self._get_weights, input_signature=[])
        self.set_weights = tf.function(
            self._set_weights, input_signature=[tf.TensorSpec(p.shape, p.dtype, name=k) for k, p in kept]
        )
        self.signature_names = list(SIGNATURES)
        if distill is not None:
            if not isinstance(task, ClassificationTask) or task.multi_label or not 0 <= distill <= 1:
                raise NotExportable("distillation is written out for single-label classifiers, lambda in [0, 1]")
            self.lam = float(distill)
            teacher = tf.TensorSpec([None, task.classes], tf.float32, name="teacher")
            self.train_distill = tf.function(self._train_distill, input_signature=[inputs, labels, teacher])
            self.signature_names.append("train_distill")
        if reuse:
            if train != TRAIN_HEAD:
                raise NotExportable("reuse of inference results trains the head only (train='head')")
            traced = tf.function(self._features).get_concrete_function(inputs).structured_outputs
            head_input = tf.TensorSpec(traced.shape, traced.dtype, name="features")
            self.infer_and_cache = tf.function(self._infer_and_cache, input_signature=[inputs])
            self.train_from_cache = tf.function(self._train_from_cache, input_signature=[head_input, labels])
            self.signature_names += ["infer_and_cache", "train_from_cache"]

    def _forward(self, x):
        saved = []
        for stage in self.stages:
            x, s = stage.forward(x)
            saved.append(s)
        return x, saved

    def _backward_and_apply(self, saved, dy, first: int):
        grads = []
        for i in range(len(self.stages) - 1, first - 1, -1):
            g, dy = self.stages[i].backward(saved[i], dy, need_dx=i > first)
            grads = g + grads
        self.optimizer.apply(grads, self._trained)

    def _train(self, inputs, labels):
        logits, saved = self._forward(inputs)
        loss, dy = loss_and_gradient(self.task, labels, logits)
        self._backward_and_apply(saved, dy, self.first)
        return {"loss": loss}

    def _train_distill(self, inputs, labels, teacher):
        logits, saved = self._forward(inputs)
        loss, dy = distillation_loss_and_gradient(self.lam, labels, teacher, logits)
        self._backward_and_apply(saved, dy, self.first)
        return {"loss": loss}

    def _features(self, inputs):
        """The output of the layers that do not train: what the head trains from."""
        for stage in self.stages[: self.first]:
            inputs, _ = stage.forward(inputs)
        return inputs

    def _infer_and_cache(self, inputs):
        features = self._features(inputs)
        return {"logits": self._from(features)[0], "features": features}

    def _from(self, features):
        x, saved = features, [None] * self.first
        for stage in self.stages[self.first :]:
            x, s = stage.forward(x)
            saved.append(s)
        return x, saved

    def _train_from_cache(self, features, labels):
        logits, saved = self._from(features)
        loss, dy = loss_and_gradient(self.task, labels, logits)
        self._backward_and_apply(saved, dy, self.first)
        return {"loss": loss}

    def _infer(self, inputs):
        return {"logits": self._forward(inputs)[0]}

    def _get_weights(self):
        return {k: p.read_value() for k, p in zip(self.keys, self.kept)}

    def _set_weights(self, *values):
        for p, value in zip(self.kept, values):
            p.assign(value)
        self.optimizer.reset()
        return {"weights_set": tf.constant(len(values))}

    def keras_weights(self, model: keras.Model) -> dict[str, np.ndarray]:
        """`model`'s values of the weights this module keeps, by key (same architecture)."""
        out = {}
        for stage in self.stages:
            if stage.kept:
                values = [w.numpy() for name in stage.layer_names for w in model.get_layer(name).weights]
                out.update(zip(stage.keys, values))
        return out

    def pad(self, inputs: np.ndarray, labels: np.ndarray | None = None):
        """A next-word batch right-padded with <pad> to the fixed sequence length (others as they are)."""
        if self.sequence_length is None:
            return inputs, labels
        n = inputs.shape[1]
        if n > self.sequence_length:
            raise ValueError(f"batch of length {n} is longer than the exported {self.sequence_length}")
        widths = [(0, 0), (0, self.sequence_length - n)]
        return (
            np.pad(inputs, widths, constant_values=PAD_ID),
            None if labels is None else np.pad(labels, widths, constant_values=PAD_ID),
        )


def _fixed(spec: tf.TensorSpec, sequence_length: int | None) -> tf.TensorSpec:
    """`spec` with its unknown non-batch sizes set to `sequence_length` (an unrolled LSTM needs it)."""
    shape = spec.shape.as_list()
    if None in shape[1:]:
        if sequence_length is None:
            raise ValueError(f"{spec.name} has shape {shape}: builtin export needs a sequence_length")
        shape = shape[:1] + [sequence_length if s is None else s for s in shape[1:]]
    return tf.TensorSpec(shape, spec.dtype, name=spec.name)


def convert(module: BuiltinTrainable) -> bytes:
    """Flatbuffer with the four signatures, builtin ops only: the converter fails on any op
    without a builtin kernel, and resource variables become VAR_HANDLE/READ/ASSIGN_VARIABLE."""
    tf_logger = tf.get_logger()
    level = tf_logger.level
    tf_logger.setLevel(logging.ERROR)  # "Assets written to /tmp/..." on every save
    try:
        with tempfile.TemporaryDirectory() as saved:
            tf.saved_model.save(
                module,
                saved,
                signatures={n: getattr(module, n).get_concrete_function() for n in module.signature_names},
            )
            converter = tf.lite.TFLiteConverter.from_saved_model(saved)
            converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
            converter.experimental_enable_resource_variables = True
            return converter.convert()
    finally:
        tf_logger.setLevel(level)


# --- parity with TensorFlow's Trainer ------------------------------------------------------------


class TrainOnly(Hook):
    """Train only the named layers; mark every other layer non-trainable so that its batch norm uses
    moving statistics (MoIL's LayerFreezing does the same; DeepType's FineTune and AutLearn's last
    layer give the same result, their frozen parts having no batch norm or running in inference
    mode). The TensorFlow side of `train="head"`. Changes the model it is given: use a copy."""

    def __init__(self, layers: Sequence[str]):
        self.layers = list(layers)

    def trainable(self, model, variables):
        for layer in model.layers:
            if layer.name not in self.layers:
                layer.trainable = False
        keep = {id(v) for name in self.layers for v in model.get_layer(name).trainable_variables}
        return [v for v in variables if id(v) in keep]


def train_mode(model: keras.Model, hooks: Sequence[Hook] = ()) -> str:
    """The `train=` that matches TensorFlow training of `model` with `hooks`: TRAIN_ALL when every
    layer with weights trains, TRAIN_HEAD when only the last Dense layer does. NotExportable for any
    other split (MoIL's LF(n>1) trains conv blocks) or a hook that changes the loss or gradients."""
    for hook in hooks:
        for method in ("extra_loss", "gradients"):
            if getattr(type(hook), method) is not getattr(Hook, method):
                raise NotExportable(f"{type(hook).__name__} changes the {method.replace('_', ' ')}")
    twin = keras.models.clone_model(model)
    variables = twin.trainable_variables
    for hook in hooks:
        variables = hook.trainable(twin, variables)
    kept = {id(v) for v in variables}
    trained = [layer for layer in twin.layers if any(id(v) in kept for v in layer.trainable_variables)]
    if trained == [layer for layer in twin.layers if layer.trainable_variables]:
        return TRAIN_ALL
    if trained == [twin.layers[-1]] and isinstance(twin.layers[-1], keras.layers.Dense):
        return TRAIN_HEAD
    raise NotExportable(f"trains {[layer.name for layer in trained]}: only every layer or the last Dense layer")


def reference_trainer(
    model: keras.Model, module: BuiltinTrainable, learning_rate: float, optimizer: str = "adam"
) -> Trainer:
    """TensorFlow's `Trainer` on a copy of `model`, training what `module` trains."""
    twin = keras.models.clone_model(model)
    twin.set_weights(model.get_weights())
    hooks = [TrainOnly(module.trained_layers)] if module.train_mode == TRAIN_HEAD else []
    return Trainer(
        twin, module.task, learning_rate, optimizer, hooks=hooks, clip_norm=module.optimizer.clip_norm or 0.0
    )


def compare(
    model: keras.Model,
    task: Task,
    learning_rate: float,
    batches,
    optimizer: str = "adam",
    train: str = TRAIN_ALL,
    sequence_length: int | None = None,
    **signatures,
) -> dict:
    """The same batches through TensorFlow's Trainer (on a copy of `model`) and through the exported
    `train` signature in LiteRT, from the same weights. Returns both loss curves, both sets of
    kept weights after the steps (by key), the flatbuffer and the module. `signatures`: the
    optional ones of BuiltinTrainable (distill=, reuse=), exported beside `train`."""
    module = BuiltinTrainable(model, task, learning_rate, optimizer, train, sequence_length, **signatures)
    flatbuffer = convert(module)
    trainer = reference_trainer(model, module, learning_rate, optimizer)
    as_sig = (task.signature.inputs.dtype.as_numpy_dtype, task.signature.labels.dtype.as_numpy_dtype)
    tf_losses = [trainer.step(np.asarray(x, as_sig[0]), np.asarray(y, as_sig[1])) for x, y in batches]
    interp = litert.interpreter(flatbuffer)
    lite_losses = train_on_device(interp, module, batches)
    return {
        "tensorflow": tf_losses,
        "litert": lite_losses,
        "weights_tensorflow": module.keras_weights(trainer.model),
        "weights_litert": interp.get_signature_runner("get_weights")(),
        "flatbuffer": flatbuffer,
        "module": module,
    }


def feed(module: BuiltinTrainable, inputs, labels=None) -> dict:
    """Signature arguments for a batch: named as the task's signature, padded to the fixed length."""
    sig = module.task.signature
    inputs, labels = module.pad(np.asarray(inputs), None if labels is None else np.asarray(labels))
    out = {sig.inputs.name: inputs.astype(sig.inputs.dtype.as_numpy_dtype)}
    if labels is not None:
        out[sig.labels.name] = labels.astype(sig.labels.dtype.as_numpy_dtype)
    return out


def train_on_device(interp, module: BuiltinTrainable, batches) -> list[float]:
    train = interp.get_signature_runner("train")
    return [float(train(**feed(module, x, y))["loss"]) for x, y in batches]


def parity_row(name: str, check: dict) -> dict:
    """One table row from `compare`: largest loss and weight differences, file size, op list."""
    w_tf, w_lite = check["weights_tensorflow"], check["weights_litert"]
    return {
        "model": name,
        "mode": "builtin",
        "steps": len(check["litert"]),
        "max_loss_diff": float(np.max(np.abs(np.subtract(check["litert"], check["tensorflow"])))),
        "max_weight_diff": max(float(np.max(np.abs(w_lite[k] - w_tf[k]))) for k in w_tf),
        "size_bytes": len(check["flatbuffer"]),
        "ops": " ".join(litert.operators(check["flatbuffer"])),
    }


# --- the CLI: one small instance per family, both modes -------------------------------------------


def _instances(rng: np.random.Generator) -> list[dict]:
    """A small instance of every family: name, model, task, training set-up and 8 batches."""
    from ..models import lstm_lm, mobilenet_v1, mobilenet_v2, yamnet

    lm = lstm_lm.LSTMConfig(input_vocab=60, output_vocab=40, embedding_dim=16, hidden_units=32)
    text = []
    for _ in range(8):  # right-padded batches of 8 samples of 3 to 10 words, as Samples.padded makes them
        real = np.arange(10)[None, :] < rng.integers(3, 11, size=(8, 1))
        text.append((rng.integers(2, lm.input_vocab, (8, 10)) * real, rng.integers(2, lm.output_vocab, (8, 10)) * real))
    colla = mrnn.MRNNConfig(locations=30, outputs=16, embedding_dim=8, hidden_units=16, history=6, slots=True)
    device = mrnn.build(colla, seed=0)
    device.get_layer("slots").set_weights([(np.arange(16) < 10).astype(np.float32)])  # 10 of 16 slots on
    places = [
        (np.stack([rng.integers(0, n, (8, colla.history)) for n in colla.id_counts()], axis=-1), rng.integers(0, 10, 8))
        for _ in range(8)
    ]

    def images(shape, classes):
        return [(rng.random((8, *shape), np.float32), rng.integers(0, classes, 8)) for _ in range(8)]

    patches = [
        (rng.normal(size=(4, yamnet.PATCH_FRAMES, yamnet.MEL_BINS)), rng.random((4, 10)) < 0.2) for _ in range(8)
    ]
    adam, sgd = {"optimizer": "adam"}, {"optimizer": "sgd"}
    return [
        {
            "name": "deeptype_lstm_full",
            "model": lstm_lm.build(lm, seed=0),
            "task": NextWordTask(),
            "lr": 1e-3,
            **adam,
            "train": TRAIN_ALL,
            "sequence_length": 10,
            "batches": text,
        },
        {
            "name": "deeptype_lstm_svd",
            "model": _svd_softmax(lstm_lm.build(lm, seed=0), rank=8),
            "task": NextWordTask(),
            "lr": 1e-3,
            **adam,
            "train": TRAIN_ALL,
            "sequence_length": 10,
            "batches": text,
        },
        {
            "name": "deeptype_lstm_fine_tune",
            "model": lstm_lm.build(lm, seed=0),
            "task": NextWordTask(),
            "lr": 1e-3,
            **adam,
            "train": TRAIN_HEAD,
            "sequence_length": 10,
            "batches": text,
            "signatures": {"reuse": True},  # DeepType's online path: infer_and_cache, train_from_cache
        },
        {
            "name": "autlearn_lstm_last_layer",
            "model": lstm_lm.build(lm, seed=0),
            "task": NextWordTask(),
            "lr": 0.1,
            **sgd,
            "train": TRAIN_HEAD,
            "sequence_length": 10,
            "batches": text,
        },
        {
            "name": "moil_mobilenet_v2_head",
            "model": mobilenet_v2.build(32, 1, 5, 0.35),
            "task": ClassificationTask((32, 32, 1), 5),
            "lr": 1e-3,
            **adam,
            "train": TRAIN_HEAD,
            "batches": images((32, 32, 1), 5),
        },
        {
            "name": "moil_yamnet_head",
            "model": yamnet.build(10, seed=0),
            "task": ClassificationTask((yamnet.PATCH_FRAMES, yamnet.MEL_BINS), 10, multi_label=True),
            "lr": 5e-4,
            **adam,
            "train": TRAIN_HEAD,
            "batches": patches,
        },
        {
            "name": "autlearn_mobilenet_v1_head",
            "model": mobilenet_v1.build(None, 0.25, 32, 62, seed=0),
            "task": ClassificationTask((28, 28, 1), 62),
            "lr": 3e-3,
            **adam,
            "train": TRAIN_HEAD,
            "batches": images((28, 28, 1), 62),
        },
        {
            "name": "colla_mrnn_device",
            "model": device,
            "lr": 1e-2,
            **adam,
            "train": TRAIN_ALL,
            "task": ClassificationTask((colla.history, len(FEATURES)), 16, input_dtype=tf.int32),
            "batches": places,
            "signatures": {"distill": 0.5},  # Colla's client update: train_distill with the teacher's q
        },
    ]


def _svd_softmax(model: keras.Model, rank: int) -> keras.Model:
    """`model` with its softmax kernel replaced by a rank-`rank` factorisation, as DeepType's layer
    compression builds it: a projection without bias (`softmax_svd`), then the softmax."""
    kernel, bias = model.get_layer("softmax").get_weights()
    u, s, vt = np.linalg.svd(kernel, full_matrices=False)
    features = model.get_layer("softmax").input
    projection = keras.layers.Dense(rank, use_bias=False, name="softmax_svd")
    softmax = keras.layers.Dense(kernel.shape[1], name="softmax")
    compressed = keras.Model(model.input, softmax(projection(features)), name="deeptype_lstm_svd")
    projection.set_weights([u[:, :rank] * s[:rank]])
    softmax.set_weights([vt[:rank], bias])
    return compressed


def flex_export(model: keras.Model, module: BuiltinTrainable, learning_rate: float, optimizer: str) -> bytes:
    """The existing Flex export (`device.tflite`) of the same set-up as `module`, for comparison."""
    from . import tflite

    twin = keras.models.clone_model(model)
    twin.set_weights(model.get_weights())
    hooks = [TrainOnly(module.trained_layers)] if module.train_mode == TRAIN_HEAD else []
    return tflite.convert(tflite.TrainableModel(twin, module.task, learning_rate, optimizer, hooks))


def export_both(spec: dict, out: Path) -> tuple[dict, dict]:
    """Write `spec`'s model in both modes to `out`: manifest entries by file, and a comparison row.
    Builtin runs in LiteRT, Flex in TensorFlow's interpreter (the only one with the Flex delegate);
    step time: median over 14 steps after 2 of warm-up, the same batches for both."""
    from . import tflite

    name = spec["name"]
    check = compare(
        spec["model"],
        spec["task"],
        spec["lr"],
        spec["batches"],
        spec["optimizer"],
        spec["train"],
        spec.get("sequence_length"),
        **spec.get("signatures", {}),
    )
    module, row = check["module"], parity_row(name, check)
    flex = flex_export(spec["model"], module, spec["lr"], spec["optimizer"])
    feeds = [feed(module, x, y) for x, y in spec["batches"]] * 2
    entries, seconds = {}, {}
    for mode, flatbuffer, interp, runtime in (
        ("builtin", check["flatbuffer"], litert.interpreter(check["flatbuffer"]), f"ai-edge-litert {litert.version()}"),
        ("flex", flex, tflite.interpreter(flex), f"tensorflow {tf.__version__} tf.lite.Interpreter + Flex delegate"),
    ):
        seconds[mode] = litert.median_step_seconds(interp.get_signature_runner("train"), feeds)
        file = f"{name}.{mode}.tflite"
        (out / file).write_bytes(flatbuffer)
        entries[file] = {
            "model": name,
            "mode": mode,
            "size_bytes": len(flatbuffer),
            "ops": litert.operators(flatbuffer),
            "custom_ops": litert.custom_operators(flatbuffer),
            "signatures": litert.signature_details(interp),
            "trains": module.trained_keys,
            "optimizer": spec["optimizer"],
            "learning_rate": spec["lr"],
            "runtime": {"converter": f"tensorflow {tf.__version__}", "interpreter": runtime},
            "median_step_seconds": seconds[mode],
        }
    entries[f"{name}.builtin.tflite"]["parity"] = {k: row[k] for k in ("steps", "max_loss_diff", "max_weight_diff")}
    return entries, {
        "model": name,
        "trains": spec["train"],
        "builtin_kb": len(check["flatbuffer"]) / 1024,
        "flex_kb": len(flex) / 1024,
        "builtin_step_ms": seconds["builtin"] * 1e3,
        "flex_step_ms": seconds["flex"] * 1e3,
        "max_loss_diff": row["max_loss_diff"],
        "max_weight_diff": row["max_weight_diff"],
    }


def main(argv: Sequence[str] | None = None) -> None:
    import pandas as pd

    parser = argparse.ArgumentParser(
        description="Export a small instance of every model family in builtin and "
        "flex mode; write manifest.json; compare step time and size."
    )
    parser.add_argument("--out", required=True, type=Path, help="directory for the .tflite files and manifest.json")
    parser.add_argument("--only", nargs="*", help="export only these instances (by name)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    manifest = {"runtime": {"tensorflow": tf.__version__, "ai-edge-litert": litert.version()}, "files": {}}
    table = []
    for spec in _instances(np.random.default_rng(0)):
        if not args.only or spec["name"] in args.only:
            entries, row = export_both(spec, args.out)
            manifest["files"].update(entries)
            table.append(row)
            print(f"{spec['name']}: exported both modes", flush=True)
    staged = args.out / ".manifest.json.part"  # written whole, then renamed: never a half manifest
    staged.write_text(json.dumps(manifest, indent=1))
    staged.replace(args.out / "manifest.json")
    cpu = (
        next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            platform.processor(),
        )
        if Path("/proc/cpuinfo").exists()
        else ""
    )
    print(
        f"machine: {platform.machine()} {cpu}, {os.cpu_count()} cores; "
        f"step time: median of 14 train steps after 2 warm-up, same batches in both modes"
    )
    with pd.option_context("display.width", 200, "display.float_format", "{:.3g}".format):
        print(pd.DataFrame(table).to_string(index=False))


if __name__ == "__main__":
    main()
