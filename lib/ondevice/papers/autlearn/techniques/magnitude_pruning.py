"""Unstructured weight magnitude pruning (tensorflow-model-optimization), the alternative to
AutLearn's structured pruning (`pruning`): it zeroes weights but keeps every shape, so dense kernels
on a CPU do not get faster; the cost notebook shows exactly that beside the structured kind."""

from __future__ import annotations

import numpy as np
import tf_keras as keras


def prune(model: keras.Model, sparsity: float) -> keras.Model:
    """tensorflow-model-optimization's weight magnitude pruning at a constant `sparsity` of every
    kernel it supports, applied at once and stripped: same shapes, zeros in place of the smallest
    weights. (Importing tfmot needs tf_keras as the process's Keras, which `ondevice` selects.)"""
    import tensorflow_model_optimization as tfmot
    from tensorflow_model_optimization.python.core.sparsity.keras.pruning_wrapper import PruneLowMagnitude

    if not 0 <= sparsity < 1:
        raise ValueError(f"sparsity must be in [0, 1), got {sparsity}")
    schedule = tfmot.sparsity.keras.ConstantSparsity(sparsity, begin_step=0, frequency=1)
    wrapped = tfmot.sparsity.keras.prune_low_magnitude(keras.models.clone_model(model), pruning_schedule=schedule)
    for layer in wrapped.layers:  # copy the weights into the wrapped layers, then apply the masks once
        inner = getattr(layer, "layer", layer)
        if inner.weights:
            inner.set_weights(model.get_layer(inner.name).get_weights())
    for layer in wrapped.layers:
        if isinstance(layer, PruneLowMagnitude):
            layer.pruning_step.assign(0)  # the schedule's first pruning step
            layer.pruning_obj.conditional_mask_update()
            layer.pruning_obj.weight_mask_op()
    return tfmot.sparsity.keras.strip_pruning(wrapped)


def nonzero_parameters(model: keras.Model) -> int:
    return int(sum(int(np.count_nonzero(w.numpy())) for w in model.weights))
