"""Counted work: floating-point operations of a training step, from the model's layer shapes.

The modelled meter needs busy time. Measured step time is the natural input, but it differs run
to run; FLOPs counted from the shapes do not, so a run that must reproduce bit for bit (the
suite's smoke run is diffed against its re-run) can model counted time instead:
seconds = FLOPs / (flops_per_cycle x frequency). The usual accounting: a matrix product of an
(n x d) input with (d x m) weights costs 2ndm forward; backward costs as much again for the
weight gradients of a layer that trains and again for the input gradients when any layer below
it trains; a layer below every trained one needs no backward pass at all (why fine-tuning the
last layer is cheap). Adam adds about 12 operations per trained parameter per step.
"""

from __future__ import annotations

import tf_keras as keras

ADAM_FLOPS_PER_PARAM = 12


def _costs(layer) -> tuple[float, float, float]:
    """FLOPs per token: (forward, weight gradients, input gradients) for the layers of DeepType's LSTM."""
    if isinstance(layer, keras.layers.Dropout):
        return 0.0, 0.0, 0.0
    if isinstance(layer, keras.layers.Embedding):
        return 0.0, float(layer.output_dim), 0.0  # a lookup; its gradient is a scatter-add of one row
    if isinstance(layer, keras.layers.LSTM):
        d, h = layer.input_shape[-1], layer.units
        matmul = 2.0 * 4 * h * (d + h)
        forward = matmul + 12.0 * h  # gates: biases, sigmoid/tanh, element-wise products
        return forward, matmul, forward
    if isinstance(layer, keras.layers.Dense):
        d, n = layer.input_shape[-1], layer.units
        return 2.0 * d * n + n, 2.0 * d * n, 2.0 * d * n
    raise ValueError(f"no FLOP count for layer {layer.name} ({type(layer).__name__})")


def step_flops(model: keras.Model, trained: list, tokens: int, loss_classes: int = 0) -> float:
    """FLOPs of one training step over `tokens` input positions (batch x padded length) when
    only the variables in `trained` update; `loss_classes` adds the softmax cross-entropy."""
    trained_ids = {id(v) for v in trained}
    layers = [l for l in model.layers if not isinstance(l, keras.layers.InputLayer)]
    trains = [any(id(v) in trained_ids for v in l.trainable_weights) for l in layers]
    per_token = 5.0 * loss_classes  # softmax and cross-entropy, forward and backward
    for i, layer in enumerate(layers):
        forward, weight_grad, input_grad = _costs(layer)
        per_token += forward
        if trains[i]:
            per_token += weight_grad
        if any(trains[:i]):
            per_token += input_grad  # needed by a trained layer below
    params = sum(int(v.shape.num_elements()) for v in trained)
    return tokens * per_token + ADAM_FLOPS_PER_PARAM * params
