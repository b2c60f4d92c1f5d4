"""Dask distributed: a local engine with N worker processes, or a running cluster by its
scheduler's address.

Dask has no per-task recycling, so each job runs in a process of its own that the worker starts
through `subprocess` and that ends with the job (`process.py`): the memory TensorFlow holds goes
with it, and a job that kills its process (out of memory, a crash) fails alone, to be retried.
Workers need no settings for it: a default `dask worker` (daemonic, under its nanny) may start
such a process, and the Dask worker itself never imports TensorFlow. A running cluster is checked
before any work (`cluster.py`). Retries are ours (`run_jobs`): the local scheduler gives up on a
task at once (allowed-failures 0) instead of re-running it unseen.
"""

from __future__ import annotations

import logging

from . import process, worker


def run_job(fn, shared, kwargs: dict, cpus: int):
    """A Dask task: run one job in a new process (`process.run`) and return its result."""
    return process.run(fn, shared, kwargs, cpus)


class DaskBackend:
    def __init__(self, spec):
        import dask
        from distributed import Client, LocalCluster

        self.spec = spec
        self._config = dask.config.set({"distributed.scheduler.allowed-failures": 0})
        self._config.__enter__()
        if spec.cluster:
            from . import cluster

            try:  # checked before any work
                self.cluster, self.client = None, cluster.connect(spec.cluster)
            except BaseException:
                self._config.__exit__(None, None, None)
                raise
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
