"""What runs around every job, in whichever process runs it."""

from __future__ import annotations

import traceback

from ondevice.threads import limit_threads


def call(fn, shared, kwargs: dict, cpus: int | None):
    """Run one job in a worker process: limit threads, call it; `cpus` None leaves the process as
    it is (the in-process engine, where TensorFlow is already running)."""
    if cpus is not None:
        limit_threads(cpus)
    return fn(shared, **kwargs)


def error_text(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc)).rstrip()
