"""Layer freezing, LF(n) (thesis Sec. 4.2): only the last n "layers" of the model train; the
rest keeps the pre-trained weights, which saves their backward pass and preserves global
knowledge. What a "layer" is depends on the model, so each model module defines
`units(model) -> list[list[Layer]]` (its layers as the thesis counts them, in order) and LF(n)
keeps the last n units. `split` cuts the model at the first trainable unit, for feature-map
caching (eq. 4.3: M = M_R(M_F(x))).

The frozen layers are also marked non-trainable on the model, so that their batch normalisation
runs with its moving statistics during training: a frozen unit is then a fixed function of its
input, as eq. 4.3 and feature-map caching need. Build a fresh model for each configuration.
"""

from __future__ import annotations

from functools import partial
from typing import Callable

import tf_keras as keras

from ondevice.training.fine_tune import FineTune

Units = Callable[[keras.Model], list]


def _checked(model: keras.Model, n: int, units: Units) -> list:
    found = units(model)
    if not 1 <= n <= len(found):
        raise ValueError(f"LF(n): n must lie in [1, {len(found)}] (the units of {model.name}), got {n}")
    return found


def freeze(model: keras.Model, n: int, units: Units) -> list:
    """Mark every layer outside the last n units non-trainable; returns the trainable layers."""
    found = _checked(model, n, units)
    for unit in found[:-n]:
        for layer in unit:
            layer.trainable = False
    return [layer for unit in found[-n:] for layer in unit]


def lf_hook(n: int, units: Units) -> FineTune:
    """LF(n) as a training hook: only the variables of the last n units train (`freeze` marks the rest)."""
    return FineTune(partial(freeze, n=n, units=units))


def split(model: keras.Model, n: int, units: Units) -> tuple[keras.Model, keras.Model]:
    """(frozen, head): frozen maps the model's input to the input of the first trainable unit,
    head maps that feature map to the model's outputs. Both share the model's layers and weights.
    The units must be cut points: nothing may skip past the boundary (a residual connection)."""
    found = _checked(model, n, units)
    if n == len(found):
        raise ValueError(f"LF({n}) trains every unit of {model.name}: there is no frozen part to split off")
    boundary = found[-n][0].input
    if isinstance(boundary, (list, tuple)):
        raise ValueError(f"unit {found[-n][0].name!r} takes several inputs; a split needs one feature map")
    frozen = keras.Model(model.inputs, boundary, name=f"{model.name}_frozen")
    head = keras.Model(boundary, model.outputs, name=f"{model.name}_head")
    return frozen, head
