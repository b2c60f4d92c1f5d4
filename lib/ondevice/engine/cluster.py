"""A running Dask cluster, checked before any work: can each worker run a job of this suite, with
the client's suite?

A cluster's workers are started by hand or by a launcher, each from an environment of its own.
Without this check a worker that cannot import the suite fails every job (after a retry each),
and one with other code or other packages gives other numbers without a word. So one probe job
per worker goes the way every job goes (a Dask task, then a job process, `process.py`) and returns
what the job's process sees: its Python, the suite's version and a digest of its files, and the
version of every package the client's requirements.lock pins. Anything that differs from the
client stops the run before it starts, with the worker, what differs and how to fix it.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import re
import sys
from pathlib import Path

WAIT_FOR_WORKERS_S = 60.0  # a scheduler with no worker yet (a launcher still starting them)
PROBE_S = 120.0  # a worker's probe job: a new Python importing the suite (more on a loaded machine)
FIX = (
    "Every worker needs the client's environment: a clone of this repository at the same commit, set up "
    "with `make setup`, and the worker started from it (`.venv/bin/dask worker {address}`); see README.md, "
    "'Starting a cluster'. Workers need no data: jobs receive theirs."
)


class ClusterError(RuntimeError):
    """The cluster cannot run this suite's jobs as the client would; nothing was run."""


def connect(address: str):
    """A Client of the scheduler at `address`, once every worker passed `check`."""
    from distributed import Client

    try:
        client = Client(address)
    except OSError as exc:
        raise ClusterError(
            f"cannot reach a Dask scheduler at {address} ({exc}); start one there (`dask scheduler`) "
            f"and check the address (README.md, 'Starting a cluster')"
        ) from exc
    try:
        check(client, address)
    except BaseException:
        client.close()
        raise
    return client


def check(client, address: str, wait_s: float = WAIT_FOR_WORKERS_S, probe_s: float = PROBE_S) -> None:
    """Raise ClusterError naming each worker that cannot run a job or differs from this client."""
    from distributed import wait

    from .process import run as run_job  # what dask_backend's task calls: the same path as a real job

    try:
        client.wait_for_workers(1, timeout=wait_s)
    except TimeoutError:
        raise ClusterError(
            f"no worker joined the scheduler at {address} in {wait_s:.0f} s: start some, e.g. "
            f"`.venv/bin/dask worker {address}` (README.md, 'Starting a cluster')"
        ) from None
    # First in the worker itself, out of band: a task the worker cannot unpickle would close its
    # connection (the worker would stop); a function run this way fails alone, with the reason.
    ready = client.run(_importable, on_error="return")
    problems = [
        f"worker {w} cannot import the suite ({_reason(e)})"
        for w, e in sorted(ready.items())
        if isinstance(e, BaseException)
    ]
    packages = locked_packages()
    mine = environment(None, packages)
    probes = {
        client.submit(run_job, environment, None, {"packages": packages}, 1, workers=[w], pure=False): w
        for w, e in sorted(ready.items())
        if not isinstance(e, BaseException)
    }
    try:
        wait(list(probes), timeout=probe_s)
    except TimeoutError:
        pass  # reported below, worker by worker
    seen = {mine["files"], environment(None, [])["files"]}  # a file saved during the check is no difference
    for future, name in probes.items():
        if future.status == "finished":
            theirs = future.result()
            theirs["files"] = mine["files"] if theirs["files"] in seen else theirs["files"]
            problems += [f"worker {name}: {d}" for d in differences(mine, theirs)]
        elif future.status == "error":
            problems.append(f"worker {name} cannot run a job: {_reason(future.exception())}")
        else:
            problems.append(f"worker {name} ran no probe job in {probe_s:.0f} s (busy, or stuck starting one)")
        future.cancel()
    if problems:
        raise ClusterError(
            f"the cluster at {address} cannot run this suite's jobs as this client would; nothing was run:\n  "
            + "\n  ".join(problems)
            + "\n"
            + FIX.format(address=address)
        )


def _importable() -> bool:
    """Unpickled in the worker by reference: only where `ondevice.engine` imports."""
    from . import process  # noqa: F401  (what every job's task needs there)

    return True


def _reason(exc: BaseException | None) -> str:
    """An exception's last line (a job's traceback ends with its own exception); Dask wraps what
    a worker raised out of band in a bare Exception."""
    text = str(exc) if type(exc) is Exception else f"{type(exc).__name__}: {exc}"
    lines = text.strip().splitlines() if exc is not None else []
    return lines[-1] if lines else "no message"


def locked_packages() -> list[str]:
    """The packages the client's requirements.lock pins; [] without one."""
    from .. import REPO_ROOT

    try:
        text = (REPO_ROOT / "requirements.lock").read_text()
    except OSError:
        return []
    return sorted({m.group(1) for m in re.finditer(r"^([A-Za-z0-9._-]+)==", text, re.M)})


def environment(_shared, packages: list[str]) -> dict:
    """What a process sees of the suite: Python, the suite's version and files, and the installed
    version of each of `packages` (None when missing). A probe job on the workers; the client
    computes its own the same way."""
    import ondevice

    root = Path(ondevice.__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return {
        "python": ".".join(map(str, sys.version_info[:2])),
        "executable": sys.executable,
        "ondevice": ondevice.__version__,
        "files": digest.hexdigest(),
        "packages": {name: _version(name) for name in packages},
    }


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def differences(mine: dict, theirs: dict) -> list[str]:
    """How a worker's `environment` differs from the client's, one sentence each ([] when alike)."""
    where = f" (its job process runs {theirs.get('executable')})"
    out = []
    if theirs["python"] != mine["python"]:
        out.append(f"Python {theirs['python']}, the client has {mine['python']}{where}")
    if theirs["ondevice"] != mine["ondevice"]:
        out.append(f"ondevice {theirs['ondevice']}, the client has {mine['ondevice']}")
    elif theirs["files"] != mine["files"]:
        out.append("the suite's files (lib/ondevice) differ from the client's: another commit, or edited")
    packages = [
        f"{name} {theirs['packages'].get(name) or 'missing'} (client {version or 'missing'})"
        for name, version in mine["packages"].items()
        if theirs["packages"].get(name) != version
    ]
    if packages:
        shown = ", ".join(packages[:5]) + (f" and {len(packages) - 5} more" if len(packages) > 5 else "")
        out.append(f"packages of requirements.lock at other versions than the client's{where}: {shown}")
    return out
