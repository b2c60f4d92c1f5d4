"""Per-job resume: each finished job's result is stored at once, atomically, in a run directory,
and reused when the same job comes again. A stored result counts only for the same job key, code
and arguments: its file holds a digest of the key, the source of the job's module and of the
`ondevice` modules it imports, the pinned environment, the job's arguments and the shared object
(pickled), so changing any of them recomputes the job instead of reusing a stale result."""

from __future__ import annotations

import hashlib
import inspect
import pickle
import re
from pathlib import Path

from ondevice.report.provenance import ENVIRONMENT_FILES, module_files
from ondevice.report.record import atomic_write

from .. import REPO_ROOT
from ..training.model_cache import code_digest


def _pickled_digest(obj) -> str:
    return hashlib.sha256(pickle.dumps(obj, protocol=5)).hexdigest()


class Store:
    """The finished jobs of one run directory."""

    def __init__(self, root: Path, shared):
        self.root = root
        self._shared = _pickled_digest(shared)
        self._code: dict[str, str] = {}

    def _code_digest(self, fn) -> str:
        module = fn.__module__
        if module not in self._code:
            files = module_files(module) + [Path(inspect.getsourcefile(fn))]
            files += [REPO_ROOT / f for f in ENVIRONMENT_FILES if (REPO_ROOT / f).is_file()]
            self._code[module] = code_digest(files)
        return self._code[module]

    def digest(self, job) -> str:
        h = hashlib.sha256()
        for part in (
            job.key,
            f"{job.fn.__module__}.{job.fn.__qualname__}",
            self._code_digest(job.fn),
            _pickled_digest(job.kwargs),
            self._shared,
        ):
            h.update(part.encode() + b"\0")
        return h.hexdigest()

    def path(self, job) -> Path:
        """One file per job key (a readable name plus a hash, so distinct keys never collide)."""
        safe = re.sub(r"[^A-Za-z0-9_.=-]+", "_", job.key)[:80]
        return self.root / f"{safe}-{hashlib.sha256(job.key.encode()).hexdigest()[:12]}.pkl"

    def lookup(self, job) -> tuple[bool, object]:
        """(True, result) when this job finished before with the same digest, else (False, None)."""
        try:
            with open(self.path(job), "rb") as f:
                stored = pickle.load(f)
        except (OSError, pickle.UnpicklingError, EOFError):
            return False, None
        return (True, stored["result"]) if stored.get("digest") == self.digest(job) else (False, None)

    def save(self, job, result) -> None:
        doc = {"key": job.key, "digest": self.digest(job), "result": result}
        atomic_write(self.path(job), lambda p: p.write_bytes(pickle.dumps(doc, protocol=5)))
