"""Fan out independent jobs (per user, per seed, per config) and gather their rows.

One small interface for every experiment: build `Job`s (a key that names what the job belongs
to, a module-level function, its arguments) and call `run_jobs`. Where they run is one setting,
never the notebook's code:

    ONDEVICE_ENGINE=sequential              in this process, one after another (the default; tests)
    ONDEVICE_ENGINE=dask ONDEVICE_WORKERS=2 a local Dask with 2 worker processes
    ONDEVICE_CLUSTER=tcp://host:8786        a running Dask cluster's scheduler (implies dask)

Every job is called as `fn(shared, **kwargs)`: `shared` (e.g. the global model's weights) is
shipped once per run, not once per job. Jobs must not depend on process-global state (draw from
`streams.rng`, build models with explicit seeds), so every engine gives the same rows.

A failing job (an exception, a killed worker) is retried once, then reported with its key; the
run raises `JobsFailed` after every other job has finished, so nothing is dropped silently. With
a run directory, each finished job's result is stored at once (`resume.py`) and reused when the
run starts again with the same key, code and arguments.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from . import resume

ENGINES = ("sequential", "dask")
RETRIES = 1  # a failing job runs at most 1 + RETRIES times


@dataclass(frozen=True)
class Job:
    """One independent piece of work: `fn(shared, **kwargs)`, named by `key` (e.g.
    "seed=0/user=hamlet/Hamlet") in logs, failure reports and the run directory."""

    key: str
    fn: Callable[..., Any]
    kwargs: dict = field(default_factory=dict)


class JobsFailed(RuntimeError):
    """Jobs that failed on every attempt: {key: error text}. Raised after all other jobs ran."""

    def __init__(self, failures: dict[str, str]):
        self.failures = failures
        lines = "\n".join(
            f"  {key}: {error.strip().splitlines()[-1] if error.strip() else error}" for key, error in failures.items()
        )
        super().__init__(f"{len(failures)} job(s) failed after {1 + RETRIES} attempts each:\n{lines}")


@dataclass(frozen=True)
class EngineSpec:
    """Which engine runs the jobs: `name` in ENGINES, local `workers`, or a `cluster` address;
    `cpus_per_job` is what each job may use (TensorFlow's intra/inter-op threads are set to it)."""

    name: str = "sequential"
    workers: int = 2
    cluster: str = ""
    cpus_per_job: int = 1

    def __post_init__(self):
        if self.name not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES} (ONDEVICE_ENGINE), got {self.name!r}")
        for name in ("workers", "cpus_per_job"):
            if getattr(self, name) < 1:
                raise ValueError(f"engine setting {name!r} must be at least 1, got {getattr(self, name)!r}")
        if self.cluster and self.name != "dask":
            raise ValueError(f"a cluster address ({self.cluster!r}) needs the dask engine, not {self.name!r}")

    @classmethod
    def from_env(cls, environ=os.environ) -> "EngineSpec":
        """ONDEVICE_ENGINE, ONDEVICE_WORKERS, ONDEVICE_CLUSTER, ONDEVICE_CPUS_PER_JOB; unset
        means the in-process sequential engine."""

        def number(name, default):
            value = environ.get(name, "") or str(default)
            if not value.isdigit():
                raise ValueError(f"environment variable {name} must be a positive integer, got {value!r}")
            return int(value)

        cluster = environ.get("ONDEVICE_CLUSTER", "")
        name = environ.get("ONDEVICE_ENGINE", "") or ("dask" if cluster else "sequential")
        return cls(name, number("ONDEVICE_WORKERS", 2), cluster, number("ONDEVICE_CPUS_PER_JOB", 1))

    def describe(self) -> str:
        if self.name == "sequential":
            return "sequential (in this process)"
        where = f"cluster {self.cluster}" if self.cluster else f"{self.workers} local workers"
        return f"{self.name}, {where}, {self.cpus_per_job} CPU(s) per job, a new process per job"


def open_engine(spec: EngineSpec | None = None):
    """The backend for `spec` (default: from the environment); use it as a context manager to
    run several batches of jobs on one engine (starting one takes seconds)."""
    spec = spec or EngineSpec.from_env()
    if spec.name == "dask":
        from .dask_backend import DaskBackend

        return DaskBackend(spec)
    from .sequential import SequentialBackend

    return SequentialBackend(spec)


def jobs_dir(name: str) -> Path | None:
    """Where a run named `name` keeps its finished jobs: $ONDEVICE_JOBS_DIR/name (the runner
    sets it outside the staging directory so it survives an interrupted notebook), else None."""
    root = os.environ.get("ONDEVICE_JOBS_DIR", "")
    return Path(root) / name if root else None


def run_jobs(
    jobs: Sequence[Job], shared: Any = None, engine=None, run_dir: str | Path | None = None, log=print
) -> list[Any]:
    """Run every job and return their results in the order of `jobs`.

    `engine`: an open backend (see `open_engine`), else one is opened from the environment for
    this call. `run_dir`: finished jobs are stored there and reused on a restart.
    """
    keys = [job.key for job in jobs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"job keys must be unique, repeated: {sorted({k for k in keys if keys.count(k) > 1})}")
    if engine is None:
        with open_engine() as opened:
            return run_jobs(jobs, shared, opened, run_dir, log)
    store = resume.Store(Path(run_dir), shared) if run_dir else None
    results: dict[int, Any] = {}
    for i, job in enumerate(jobs):
        found, result = store.lookup(job) if store is not None else (False, None)
        if found:
            results[i] = result
    if results:
        log(f"[engine] {len(results)} of {len(jobs)} jobs reused from {run_dir}")
    todo = [i for i in range(len(jobs)) if i not in results]
    if not todo:
        return [results[i] for i in range(len(jobs))]
    log(f"[engine] {len(todo)} jobs on {engine.spec.describe()}")
    handle = engine.share(shared)
    attempts = {i: 1 for i in todo}
    pending = {engine.submit(jobs[i].fn, handle, jobs[i].kwargs): i for i in todo}
    failures: dict[str, str] = {}
    while pending:
        for future, ok, value in engine.wait(list(pending)):
            i = pending.pop(future)
            job = jobs[i]
            if ok:
                results[i] = value
                if store is not None:
                    store.save(job, value)
                log(f"[engine] {len(results)}/{len(jobs)} done: {job.key}")
            elif attempts[i] <= RETRIES:
                attempts[i] += 1
                log(f"[engine] job {job.key} failed ({_last_line(value)}); retrying")
                pending[engine.submit(job.fn, handle, job.kwargs)] = i
            else:
                log(f"[engine] job {job.key} failed again ({_last_line(value)}); giving up on it")
                failures[job.key] = value
    if failures:
        raise JobsFailed(failures)
    return [results[i] for i in range(len(jobs))]


def _last_line(error: str) -> str:
    lines = error.strip().splitlines()
    return lines[-1] if lines else "no message"
