"""A content-addressed cache of trained models, so a global model is trained once per machine.

The key is a hash of everything that decides the trained weights: the fields that configure the
model and its training, the checksums of the data it reads and the source of the code that
trains it (as a syntax tree: reformatting, comments and docstrings do not count). Any change to
one of them is a different key, so a stale model is never reused.
What training printed is stored with the model and printed again when the entry is reused, so a
run prints the same lines whether it trained its global models or found them (a published notebook
shows the training that made its model; a re-run can be compared line for line with the first).
Entries live in `ONDEVICE_MODEL_CACHE` (default ~/.cache/ondevice-models), one directory each,
written to a temporary directory and renamed into place, so an interrupted training leaves no
entry that looks complete; a lock file per entry keeps two processes from training the same key.
"""

from __future__ import annotations

import ast
import contextlib
import fcntl
import hashlib
import io
import json
import os
import shutil
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from .. import REPO_ROOT


def cache_root() -> Path:
    return Path(os.environ.get("ONDEVICE_MODEL_CACHE", Path.home() / ".cache" / "ondevice-models"))


def source_form(text: str) -> str:
    """Python source as what it computes: its syntax tree with docstrings dropped, so reformatting,
    comments and docstrings leave a cached model valid while any change to the code does not.
    Text that is not Python is returned unchanged."""
    try:
        tree = ast.parse(textwrap.dedent(text))
    except SyntaxError:
        return text
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            if isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


def code_digest(files: list[Path], extra: str = "") -> str:
    """Hash of source files (relative path and `source_form`), in sorted order, and of `extra` source."""
    digest = hashlib.sha256(source_form(extra).encode())
    for f in sorted(set(Path(p).resolve() for p in files)):
        try:
            name = str(f.relative_to(REPO_ROOT))
        except ValueError:
            name = f.name
        digest.update(name.encode() + b"\0" + source_form(f.read_text(encoding="utf-8")).encode())
    return digest.hexdigest()


def cache_key(name: str, fields: dict, data: list[str], code: str) -> str:
    blob = json.dumps({"name": name, "fields": fields, "data": sorted(data), "code": code}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


@dataclass
class Entry:
    """A cached model: its weights, what training reported (history, timings), and the key."""

    key: str
    path: Path
    weights: list[np.ndarray]
    info: dict
    hit: bool  # True when loaded from the cache, False when trained by this call


def _read(path: Path, key: str) -> Entry:
    with np.load(path / "weights.npz") as npz:
        weights = [npz[f"w{i}"] for i in range(len(npz.files))]
    info = json.loads((path / "info.json").read_text())
    return Entry(key, path, weights, info, hit=True)


def load_or_train(
    name: str, fields: dict, data: list[str], code: str, train: Callable[[], tuple[list[np.ndarray], dict]], log=print
) -> Entry:
    """The cached entry for this key, or `train()` -> (weights, info) stored under it.

    `info` must be JSON-serialisable (e.g. the training history); it is returned on every hit, so
    results report the training that made the model even when this run did not train it.
    """
    key = cache_key(name, fields, data, code)
    path = cache_root() / f"{name}-{key[:20]}"
    path.parent.mkdir(parents=True, exist_ok=True)
    with _training_lock(path, name, log):
        return _load_or_train(name, fields, data, code, train, log, key, path)


@contextlib.contextmanager
def _training_lock(path: Path, name: str, log):
    """One process trains a key; another that wants it (a notebook run beside this one, see
    report/at_once.py) waits, then reads the stored entry instead of training it twice."""
    with open(path.parent / f".{path.name}.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"[model cache] {name}: another process is training {path.name}; waiting for it")
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _load_or_train(name, fields, data, code, train, log, key: str, path: Path) -> Entry:
    if (path / "info.json").is_file():
        try:
            entry = _read(path, key)
            trained, seconds = entry.info.get("trained_at", "?"), entry.info.get("train_seconds")
            took = f" in {seconds:.0f}s" if isinstance(seconds, (int, float)) else ""
            log(f"[model cache] {name}: reusing {path} (trained {trained}{took}); its training printed:")
            sys.stdout.write(entry.info.get("printed", ""))
            return entry
        except (OSError, ValueError, KeyError) as exc:  # unreadable entry: train again, replace it
            log(f"[model cache] {name}: entry {path} is unreadable ({exc}); training again")
    start = time.perf_counter()
    printed = _Tee(sys.stdout)
    with contextlib.redirect_stdout(printed):
        weights, info = train()
    info = {
        **info,
        "printed": printed.text.getvalue(),
        "key": key,
        "fields": fields,
        "data": data,
        "code": code,
        "trained_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "train_seconds": time.perf_counter() - start,
    }
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}."))
    try:
        np.savez(tmp / "weights.npz", **{f"w{i}": w for i, w in enumerate(weights)})
        (tmp / "info.json").write_text(json.dumps(info, indent=1, default=str))
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"[model cache] {name}: trained in {info['train_seconds']:.0f}s, stored in {path}")
    return Entry(key, path, weights, info, hit=False)


class _Tee(io.TextIOBase):
    """Writes go to the stream as before and are kept, so the entry can print them again."""

    def __init__(self, stream):
        self.stream, self.text = stream, io.StringIO()

    def write(self, s: str) -> int:
        self.text.write(s)
        return self.stream.write(s)

    def flush(self) -> None:
        self.stream.flush()


def cached_train(
    name: str, fields: dict, data: list[str], modules: tuple[str, ...], train, log=print, sources: tuple = ()
) -> Entry:
    """The one way a cached model is keyed: `fields` (what configures the model and its training),
    `data` (checksums of what it reads), the source files of the `ondevice` `modules` that train it
    (transitively, with their imports) and the source of the functions in `sources` (e.g. the
    paper's own training function). Content and repository path both count, so moving a module
    retrains its models: a stale model is never reused."""
    import inspect

    from ..report import provenance

    files = [f for m in modules for f in provenance.module_files(m)]
    code = code_digest(files, extra="".join(inspect.getsource(f) for f in sources))
    return load_or_train(name, fields, data, code, train, log)
