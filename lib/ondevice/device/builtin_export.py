"""Trainable TFLite export from builtin ops only: signatures `train`, `infer`, `get_weights` and
`set_weights`, run by LiteRT (`ai-edge-litert`) with no Flex delegate.

Why: `device.tflite` exports `training.step.Step` as it is, and its LSTM gradients (While
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

What trains (`train_mode`, from the Step's hooks): "all" (the LSTM language model: embedding, both
LSTMs, softmax, and the projection of an SVD-compressed softmax; a vocabulary-compressed or
structurally pruned LM is the same graph with smaller shapes, a magnitude-pruned one the same with
zeros; the Colla M-RNN: six embeddings, LSTM, FC) or "head", the last Dense layer (the LM's softmax:
DeepType's fine-tune and AutLearn's last layer; the classifier of MobileNetV2 and YAMNet, MoIL's
LF(1); the MobileNetV1 `logits` layer, AutLearn's; the M-RNN's FC). Layers that do not train are
constants in the file. Convolution, depthwise convolution and batch norm gradients
(Conv2DBackpropFilter, DepthwiseConv2dNativeBackprop*, FusedBatchNormGrad) have no builtin kernel,
so conv models train their head only. Optional signatures: `train_distill` (Colla's client update,
Eq. 2, the teacher's probabilities given as an input) and `infer_and_cache` / `train_from_cache`
(DeepType's online path: the head trains from the features the inference computed).

A `BuiltinTrainable` is written out from a `training.step.Step`: the same model, task, optimizer,
rate, clipping and hooks (which decide what trains), so the Flex file (the Step converted as it is)
and this one are two forms of one step; `device.parity` checks both against TensorFlow.
"""

from __future__ import annotations

import logging
import tempfile
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
from ..training.step import Hook, Step

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
    """The update rule of a Step's optimizer (`training.step.make_optimizer`: Keras's SGD or Adam,
    hyperparameters read from it, gradients clipped to a global norm) as arithmetic on variables,
    in Keras's order of operations."""

    def __init__(self, optimizer: keras.optimizers.Optimizer, variables: list):
        super().__init__()
        name = {keras.optimizers.Adam: "adam", keras.optimizers.SGD: "sgd"}.get(type(optimizer))
        config = optimizer.get_config()
        self.clip_norm = config.pop("global_clipnorm", None)
        extras = {k: config.get(k) for k in ("weight_decay", "clipnorm", "clipvalue")}
        if (
            name is None
            or any(extras.values())
            or config.get("use_ema")
            or config.get("amsgrad")
            or config.get("momentum")
        ):
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
    """A `Step` of a model of a known family, written out with the four builtin signatures; the
    Step's hooks decide what trains (`train_mode`).

    `train(inputs, labels) -> loss`; `infer(inputs) -> logits`; `get_weights() -> {key: weight}`;
    `set_weights(**{key: weight})` assigns them and resets the optimizer state (as `Trainer.reset`:
    a new user, or a restart, begins with a fresh optimizer). Keys are `<layer>_<weight>`
    (`softmax_kernel`). `sequence_length` fixes a next-word batch's length (pad shorter batches
    with `pad`). The Step's model is not changed.

    Optional signatures: `distill=lam` adds `train_distill(inputs, labels, teacher) -> loss`, Colla's
    client update (Eq. 2) with the teacher's probabilities over the student's outputs given by the
    app (the pulled cloud model's `infer`, restricted to the device's places and renormalised);
    `reuse=True` (head training only) adds DeepType's online path, `infer_and_cache(inputs) ->
    logits, features` and `train_from_cache(features, labels) -> loss`, which trains the head on
    the features the inference already computed instead of running the frozen layers again.
    """

    def __init__(self, step: Step, sequence_length: int | None = None, distill: float | None = None, reuse=False):
        super().__init__()
        task = self.task = step.task
        train = self.train_mode = train_mode(step.model, step.hooks)
        self.stages = _stages(step.model, train)
        self.first = next(i for i, s in enumerate(self.stages) if s.train)
        kept = [(k, p) for s in self.stages if s.kept for k, p in zip(s.keys, s.params)]
        self.keys, self.kept = [k for k, _ in kept], [p for _, p in kept]
        self.trained_keys = [k for s in self.stages if s.train for k in s.keys]
        self.trained_layers = [n for s in self.stages if s.train for n in s.layer_names]
        trained = [p for s in self.stages if s.train for p in s.params]
        self.optimizer = _Optimizer(step.optimizer, trained)
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


# --- what trains, and the file's inputs -----------------------------------------------------------


def train_mode(model: keras.Model, hooks: Sequence[Hook] = ()) -> str:
    """The train mode that matches TensorFlow training of `model` with `hooks`: TRAIN_ALL when every
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
