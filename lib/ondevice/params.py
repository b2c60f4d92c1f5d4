"""Experiment parameters: one preset per scale, every field overridable, checked before any work.

An experiment declares a frozen dataclass deriving from `Params`, its `PRESETS` (scale -> field
values) and a `check()` for impossible values. Notebooks build it with `from_notebook(globals())`
so a papermill parameter with an unknown name stops the run instead of being silently ignored.

A field may be a group: another frozen dataclass (e.g. `trace: SyntheticModel`), given as a dict
of some of its fields; a preset's dict and an override's are merged name by name, and an unknown
name in a group is an error that names the group. `require` takes a group's field as "group.name".
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, ClassVar

SCALES = ("smoke", "default", "paper")
# Names a notebook's parameters cell may define besides the Params fields.
NOTEBOOK_NAMES = {"scale", "seed", "overrides", "out_dir"}
_IPYTHON_NAMES = {"In", "Out", "exit", "quit", "get_ipython", "open"}


class ParameterError(ValueError):
    """A parameter has an unknown name, a wrong type or an impossible value."""


@dataclasses.dataclass(frozen=True)
class Params:
    scale: str
    seed: int

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {}

    @classmethod
    def for_scale(cls, scale: str, seed: int = 0, **overrides) -> "Params":
        if scale not in cls.PRESETS:
            raise ParameterError(f"parameter 'scale' must be one of {sorted(cls.PRESETS)}, got {scale!r}")
        names = {f.name for f in dataclasses.fields(cls)} - {"scale", "seed"}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise ParameterError(f"unknown parameter(s) {unknown} for {cls.__module__}; known: {sorted(names)}")
        hints = typing.get_type_hints(cls)
        preset = cls.PRESETS[scale]
        values = {**preset, **overrides, "scale": scale, "seed": seed}
        for name, value in overrides.items():  # a group's override changes only the fields it names
            if dataclasses.is_dataclass(hints[name]) and isinstance(value, dict) and isinstance(preset.get(name), dict):
                values[name] = {**preset[name], **value}
        for name, value in values.items():
            values[name] = _coerce(name, value, hints[name])
        params = cls(**values)
        params.check()
        return params

    @classmethod
    def from_notebook(cls, namespace: dict) -> "Params":
        """Build from a notebook's globals: scale, seed, overrides, plus any field set directly."""
        direct = {}
        for name, value in namespace.items():
            if name.startswith("_") or name in _IPYTHON_NAMES or name in NOTEBOOK_NAMES:
                continue
            if isinstance(value, types.ModuleType) or callable(value):
                continue
            direct[name] = value
        overrides = dict(namespace.get("overrides") or {})
        both = sorted(set(direct) & set(overrides))
        if both:
            raise ParameterError(f"parameter(s) {both} given both directly and in 'overrides'")
        return cls.for_scale(namespace.get("scale", "default"), namespace.get("seed", 0), **direct, **overrides)

    @property
    def seed_list(self) -> list[int]:
        """The training repeats: seed, seed + 1, ... for an experiment with a `seeds` field, else [seed]."""
        return [self.seed + i for i in range(getattr(self, "seeds", 1))]

    def check(self) -> None:
        """Raise ParameterError naming the parameter when a value is impossible."""

    def value(self, name: str) -> Any:
        """A field's value by name, or a group's field by "group.field"."""
        value = self
        for part in name.split("."):
            value = getattr(value, part)
        return value

    def require(self, condition: bool, name: str, message: str) -> None:
        """Raise ParameterError unless `condition`; `name` is a field, or "group.field"."""
        if not condition:
            raise ParameterError(f"parameter '{name}' {message}, got {self.value(name)!r}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def presets(*layers: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """One experiment's presets from layers of scale -> field values (e.g. the paper's model sizes,
    the data split, the experiment's own fields); a later layer wins. Every layer names every scale
    or a subset of them; the first layer decides which scales exist."""
    scales = list(layers[0])
    for layer in layers:
        unknown = sorted(set(layer) - set(scales))
        if unknown:
            raise ValueError(f"preset layer names unknown scale(s) {unknown}; scales: {scales}")
    return {scale: {k: v for layer in layers for k, v in layer.get(scale, {}).items()} for scale in scales}


def _group(name: str, value: Any, hint: type) -> Any:
    """A group's dataclass from a dict of some of its fields (the others keep their defaults)."""
    if isinstance(value, hint):
        return value
    fields = {f.name for f in dataclasses.fields(hint)}
    if not isinstance(value, dict):
        raise ParameterError(
            f"parameter '{name}' must be a dict of {hint.__name__} fields {sorted(fields)}, got {value!r}"
        )
    unknown = sorted(set(value) - fields)
    if unknown:
        raise ParameterError(f"unknown parameter(s) {unknown} in '{name}' ({hint.__name__}); known: {sorted(fields)}")
    hints = typing.get_type_hints(hint)
    return hint(**{k: _coerce(f"{name}.{k}", v, hints[k]) for k, v in value.items()})


def _coerce(name: str, value: Any, hint: Any) -> Any:
    if dataclasses.is_dataclass(hint):
        return _group(name, value, hint)
    if typing.get_origin(hint) is tuple:  # tuple[float, ...]: a grid of values, e.g. learning rates
        item = typing.get_args(hint)[0]
        if not isinstance(value, (list, tuple)):
            raise ParameterError(f"parameter '{name}' must be a list of {item.__name__}, got {value!r}")
        return tuple(_coerce(name, v, item) for v in value)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint in (int, float, str, bool):
        if type(value) is not hint:
            raise ParameterError(f"parameter '{name}' must be {hint.__name__}, got {type(value).__name__} {value!r}")
        return value
    raise TypeError(f"unsupported parameter type {hint} for '{name}'")
