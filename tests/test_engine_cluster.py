"""The engine on a Dask cluster started the ordinary way (issue 71): `dask scheduler` and `dask
worker --nworkers 2` as separate processes with Dask's default configuration, so the workers are
daemonic processes under a nanny. Through ONDEVICE_CLUSTER (make's CLUSTER=), the smoke
personalization jobs give the same rows there as in this process, each in a process of its own; a
job that kills its process fails alone and its worker lives on; a worker that cannot import the
suite is named before any work."""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from ondevice import engine
from ondevice.engine import EngineSpec, Job, run_jobs
from ondevice.engine.cluster import ClusterError
from test_engine import _table, smoke_jobs  # noqa: F401  (the same smoke jobs, a fixture)

DASK = Path(sys.executable).parent / "dask"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _cluster(tmp: Path, workers: int, pythonpath: str = ""):
    """A scheduler and a `dask worker` with `workers` processes, each in a process group of its own
    (killed whole at the end, job processes included); Dask's defaults: no DASK_* variables and an
    empty config directory. Yields the scheduler's address."""
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DASK_") and k != "PYTHONPATH"}
    (tmp / "dask-config").mkdir(exist_ok=True)
    env["DASK_CONFIG"] = str(tmp / "dask-config")
    commands = [
        [DASK, "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
        [DASK, "worker", address, "--nworkers", str(workers), "--nthreads", "1"],
    ]
    started = []
    try:
        for i, command in enumerate(commands):
            log = open(tmp / f"{Path(command[1]).name}-{port}.log", "w")  # closed with its process, below
            extra = {"PYTHONPATH": pythonpath} if pythonpath and i == 1 else {}
            started.append(
                (subprocess.Popen(command, cwd=tmp, env=env | extra, stderr=log, start_new_session=True), log)
            )
        yield address
    finally:
        for process, _ in reversed(started):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        for process, log in started:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            log.close()


def _wait_for_workers(address: str, n: int) -> None:
    from distributed import Client

    with Client(address, timeout=60) as client:
        client.wait_for_workers(n, timeout=60)


@pytest.mark.slow(reason="a scheduler, two workers and a job process per user, each importing TensorFlow")
def test_smoke_jobs_on_a_default_dask_cluster_give_the_sequential_rows(smoke_jobs, tmp_path, monkeypatch):  # noqa: F811
    jobs, shared = smoke_jobs
    with engine.open_engine(EngineSpec("sequential")) as eng:
        sequential = run_jobs(jobs, shared, eng, log=lambda *_: None)
    with _cluster(tmp_path, workers=2) as address:
        _wait_for_workers(address, 2)
        monkeypatch.setenv("ONDEVICE_CLUSTER", address)
        start = time.perf_counter()
        on_cluster = run_jobs(jobs, shared)  # the engine from the environment, as a notebook opens it
        print(f"{len(jobs)} jobs on the cluster in {time.perf_counter() - start:.1f} s (its check included)")

        def crashes_once(shared, marker: str) -> int:  # nested: travels by value to the workers
            if not os.path.exists(marker):
                open(marker, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)
            return os.getpid()

        with engine.open_engine() as eng:
            daemonic = eng.client.run(lambda: __import__("multiprocessing").current_process().daemon)
            workers = eng.client.run(os.getpid)
            log = []
            [pid] = run_jobs(
                [Job("crash", crashes_once, {"marker": str(tmp_path / "crashed")})], None, eng, log=log.append
            )
            assert eng.client.run(os.getpid) == workers  # both workers lived through the crash
    assert list(daemonic.values()) == [True, True]  # Dask's default: the case of issue 71
    assert any("killed by SIGKILL" in line and "retrying" in line for line in log) and pid not in workers.values()
    pd.testing.assert_frame_equal(_table(sequential), _table(on_cluster), check_exact=True)
    pids = {r["pid"] for r in on_cluster}  # a process per job: none is this one or a worker
    assert len(pids) == len(jobs) and not pids & {os.getpid(), *workers.values()}


def test_a_worker_that_cannot_import_the_suite_is_named_before_any_work(tmp_path):
    fake = tmp_path / "elsewhere" / "ondevice"  # an unrelated package of the same name shadows the suite
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('__version__ = "0.0.9"\n')
    with _cluster(tmp_path, workers=1, pythonpath=str(fake.parent)) as address:
        _wait_for_workers(address, 1)
        with pytest.raises(ClusterError) as err:
            engine.open_engine(EngineSpec("dask", cluster=address))
    message = str(err.value)
    assert f"the cluster at {address} cannot run this suite's jobs" in message and "nothing was run" in message
    assert "cannot import the suite (ModuleNotFoundError" in message and "No module named 'ondevice.engine'" in message
    assert "make setup" in message and f"dask worker {address}" in message
