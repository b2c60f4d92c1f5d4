"""AutLearn's long training in the model cache: the cloud baselines' runs (CloudTrain per seed,
every FedAvg run of the grid and of the seeds; `curve_run`) and every re-training pass of
autlearn_cost's compressions (`stored_pass`). Both notebooks take hours at default, more than one
sitting: with each finished run or pass stored, an interrupted notebook resumes from what it
finished, and a re-run with nothing changed trains nothing again.

A run is keyed by its setting (`fields`), the digests of its start weights, of its training data and
of the data its plateau watches, and the code that trains it (`cloud_baselines` and what it imports,
and the caller's functions that build the run, as FedAvg's client step); its entry holds the weights
the run leaves in the model (the kept epoch's or round's) and its convergence curve, and prints the
run's log again when reused."""

from __future__ import annotations

import hashlib
import inspect
from typing import Callable

import numpy as np

from ondevice.training import model_cache

CODE = ("ondevice.papers.autlearn.cloud_baselines",)


def digest(data) -> str:
    """sha256 of training data as the baselines hold it: a `Samples` set (its own digest), an
    array, a tuple or list of them, or a dict of them (by sorted key); shapes and dtypes count."""
    h = hashlib.sha256()
    _update(h, data)
    return h.hexdigest()


def _update(h, data) -> None:
    if hasattr(data, "digest"):
        h.update(b"samples" + data.digest().encode())
    elif isinstance(data, np.ndarray):
        h.update(f"array{data.shape}{data.dtype}".encode() + np.ascontiguousarray(data).tobytes())
    elif isinstance(data, dict):
        for key in sorted(data):
            h.update(f"key{key!r}".encode())
            _update(h, data[key])
    elif isinstance(data, (list, tuple)):
        h.update(f"seq{len(data)}".encode())
        for item in data:
            _update(h, item)
    else:
        raise TypeError(f"cannot digest {type(data).__name__}")


def model_fields(params, kind: str) -> dict:
    """What shapes a kind's model beyond its weights' shapes (which `digest` of the start covers):
    MobileNet's input size (its resizing layer has no weights); the LSTM has nothing else."""
    return {"image_size": params.image_size} if kind == "image" else {}


def _plain(value):
    """A curve value as JSON keeps it (numpy scalars as Python's: a numpy bool would come back a string)."""
    return value.item() if isinstance(value, np.generic) else value


def curve_run(name: str, fields: dict, data: list[str], model, run: Callable[[], list[dict]], sources, log=print):
    """`run()` (a convergence run that leaves its kept weights in `model` and returns its curve),
    or its stored entry: the model is left with the run's weights either way; returns the curve and
    whether it came from the cache. `fields` must hold every setting of the run, `data` the digests
    of its start weights and data (`digest`), `sources` the caller's functions that build the run
    (outside `CODE`: the caller and what it calls to make the trainer)."""

    def train():
        curve = run()
        return model.get_weights(), {"curve": [{k: _plain(v) for k, v in p.items()} for p in curve]}

    entry = model_cache.cached_train(name, fields, data, CODE, train, log, sources=tuple(sources))
    model.set_weights(entry.weights)
    return entry.info["curve"], entry.hit


def stored_pass(
    name: str, fields: dict, data: list[str], modules: tuple[str, ...], retrain: Callable, helpers: tuple = ()
) -> Callable:
    """`retrain(model, rate, tag)`, one re-training pass in place (a fresh optimizer each pass, so
    its result depends only on the model's weights, `rate`, `tag`, `fields` and `data`), with every
    pass stored under those and the code a pass runs: `modules`, `retrain` and the `helpers` it
    calls. Scoring and reporting code is not in the key, so changing it keeps the stored passes. A
    resumed run replays the passes it finished. Quiet: the passes are the caller's to report."""
    from ondevice.report import provenance

    files = [f for m in modules for f in provenance.module_files(m)]
    sources = "".join(inspect.getsource(f) for f in (retrain, *helpers))
    code = model_cache.code_digest(files, extra=sources)  # once, not per pass

    def stored(model, rate: float, tag: str = "") -> None:
        def train():
            retrain(model, rate, tag)
            return model.get_weights(), {}

        keyed = fields | dict(rate=rate, tag=tag, start=digest(model.get_weights()))
        entry = model_cache.load_or_train(name, keyed, data, code, train, log=lambda *_, **__: None)
        model.set_weights(entry.weights)

    return stored
