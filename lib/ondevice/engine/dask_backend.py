"""Dask distributed: a local engine with N worker processes, or a running cluster by its
scheduler's address.

Dask starts its workers as fresh (spawned) processes but has no per-task recycling, so each job
runs in a process of its own that the worker spawns (never forks) and that ends with the job:
the memory TensorFlow holds goes with it, no idle process outlives its worker, and a job that
kills its process (out of memory, a crash) fails alone, to be retried. The Dask worker itself
never imports TensorFlow; it must not be daemonic to have a child (`distributed.worker.daemon:
False`). Retries are ours (`run_jobs`): the scheduler gives up on a task at once
(allowed-failures 0) instead of re-running it unseen.
"""

from __future__ import annotations

import logging
import multiprocessing
from concurrent.futures import ProcessPoolExecutor

import cloudpickle

from . import worker


def _call_pickled(payload: bytes):
    return worker.call(*cloudpickle.loads(payload))


def run_job(fn, shared, kwargs: dict, cpus: int):
    """A Dask task: run one job in a new spawned process and return its result. The job goes
    there through cloudpickle, as it came here, so functions of a notebook or script travel too."""
    payload = cloudpickle.dumps((fn, shared, kwargs, cpus))
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as job_process:
        return job_process.submit(_call_pickled, payload).result()


class DaskBackend:
    def __init__(self, spec):
        import dask
        from distributed import Client, LocalCluster

        self.spec = spec
        self._config = dask.config.set(
            {"distributed.scheduler.allowed-failures": 0, "distributed.worker.daemon": False}
        )
        self._config.__enter__()
        if spec.cluster:
            self.cluster, self.client = None, Client(spec.cluster)
        else:
            self.cluster = LocalCluster(
                n_workers=spec.workers,
                threads_per_worker=1,
                processes=True,
                dashboard_address=None,
                silence_logs=logging.ERROR,
            )
            self.client = Client(self.cluster)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()
        self._config.__exit__(None, None, None)

    def share(self, obj):
        """Sent to every worker once; jobs receive it as an argument."""
        return self.client.scatter(obj, broadcast=True, hash=False)

    def submit(self, fn, shared, kwargs):
        return self.client.submit(run_job, fn, shared, kwargs, self.spec.cpus_per_job, pure=False)

    def wait(self, futures: list) -> list[tuple[object, bool, object]]:
        """The jobs finished by now (at least one): (future, True, result) or (future, False, error)."""
        from distributed import wait

        done, _ = wait(futures, return_when="FIRST_COMPLETED")
        out = []
        for future in done:
            if future.status == "finished":
                out.append((future, True, future.result()))
            else:  # "error": the job raised, its process died, or its worker was lost (KilledWorker)
                exc = future.exception()
                out.append((future, False, worker.error_text(exc) if exc is not None else f"job {future.status}"))
            future.release()
        return out
