"""A notebook stage's result kept with the run's finished jobs, so that a run longer than one sitting
resumes stage by stage. `resumable(name)` wraps a stage function: with a jobs directory (the runner's
ONDEVICE_JOBS_DIR, which survives an interrupted run and is removed by a completed one), the stage's
result and what it printed are stored there when it ends, and a run that starts again with the same
inputs and code reads them back (and prints the same lines) instead of computing the stage again.
Without a jobs directory (tests, plain Python) the stage simply runs.

Inputs count by content (`fingerprint`): arrays by shape, type and bytes, containers item by item,
dataclasses field by field, `Samples` by their digest, a model-cache entry by its key. Two things do
not count: callables (a `log`) and Keras models, whose weights in use a stage receives as arrays
(e.g. `GlobalModels.weights`). The code that counts is the stage function's module and every
`ondevice` module it imports."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import os
import pickle
import sys
from pathlib import Path

import numpy as np

from ..report.provenance import module_files
from ..report.record import atomic_write
from ..training.model_cache import Entry, _Tee, code_digest


def fingerprint(obj) -> str:
    """sha256 of what a stage reads (see the module's docstring for what counts)."""
    h = hashlib.sha256()
    _update(h, obj)
    return h.hexdigest()


def _update(h, obj) -> None:
    if obj is None or isinstance(obj, (bool, int, float, str, bytes, Path)):
        h.update(f"{type(obj).__name__}:{obj!r};".encode())
    elif isinstance(obj, np.ndarray):
        h.update(f"array{obj.shape}{obj.dtype};".encode() + np.ascontiguousarray(obj).tobytes())
    elif isinstance(obj, np.generic):
        h.update(f"{obj.dtype}:{obj!r};".encode())
    elif isinstance(obj, Entry):
        h.update(f"entry:{obj.key};".encode())
    elif isinstance(obj, dict):
        h.update(f"dict{len(obj)};".encode())
        for key in sorted(obj, key=repr):
            _update(h, key)
            _update(h, obj[key])
    elif isinstance(obj, (list, tuple)):
        if obj and all(isinstance(x, str) for x in obj):  # a sentence: one update, not one per word
            h.update(("strs:" + "\x1f".join(obj) + ";").encode())
            return
        h.update(f"{type(obj).__name__}{len(obj)};".encode())
        for item in obj:
            _update(h, item)
    elif callable(getattr(obj, "digest", None)):
        h.update(f"digest:{obj.digest()};".encode())
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        h.update(f"{type(obj).__qualname__};".encode())
        for f in dataclasses.fields(obj):
            h.update(f.name.encode())
            _update(h, getattr(obj, f.name))
    elif callable(obj) or _is_keras_model(obj):
        h.update(b"skipped;")
    else:
        h.update(pickle.dumps(obj, protocol=5))


def _is_keras_model(obj) -> bool:
    return any(c.__name__ in ("Model", "Layer") and "keras" in c.__module__ for c in type(obj).__mro__)


def resumable(name: str, part=None):
    """Decorate a stage function so that its result is kept and reused as the module's docstring says.
    `part(*args, **kwargs)`, when given, names the call's own file (e.g. a kind and a seed), so a
    stage called once per part resumes part by part."""

    def wrap(fn):
        @functools.wraps(fn)
        def run(*args, **kwargs):
            root = os.environ.get("ONDEVICE_JOBS_DIR", "")
            if not root:
                return fn(*args, **kwargs)
            path = Path(root) / f"stage-{name}{f'-{part(*args, **kwargs)}' if part else ''}.pkl"
            code = code_digest(module_files(fn.__module__))
            kept = lambda v: not callable(v) and not _is_keras_model(v)  # noqa: E731 (a log passed or not)
            digest = fingerprint(
                (name, code, [a for a in args if kept(a)], {k: v for k, v in kwargs.items() if kept(v)})
            )
            try:
                stored = pickle.loads(path.read_bytes())
            except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError):
                stored = {}
            if stored.get("digest") == digest:
                print(f"[stage] {path.stem[6:]}: read back from {path} (this run's inputs and code)")
                sys.stdout.write(stored["printed"])
                return stored["result"]
            printed = _Tee(sys.stdout)  # as the model cache keeps what training printed
            with contextlib.redirect_stdout(printed):
                result = fn(*args, **kwargs)
            doc = {"digest": digest, "result": result, "printed": printed.text.getvalue()}
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, lambda p: p.write_bytes(pickle.dumps(doc, protocol=5)))
            return result

        return run

    return wrap
