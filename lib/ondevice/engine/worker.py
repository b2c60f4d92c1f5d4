"""What runs around every job, in whichever process runs it."""

from __future__ import annotations

import os
import sys
import traceback

THREAD_VARIABLES = ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "OMP_NUM_THREADS")


def limit_threads(cpus: int) -> None:
    """TensorFlow's intra- and inter-op pools (and OpenMP) sized to the CPUs the job was given:
    through the environment before TensorFlow starts, through tf.config when it is already
    imported but not yet initialised. Two jobs on two CPUs then do not fight over threads."""
    for name in THREAD_VARIABLES:
        os.environ[name] = str(cpus)
    if "tensorflow" in sys.modules:
        import tensorflow as tf

        try:
            tf.config.threading.set_intra_op_parallelism_threads(cpus)
            tf.config.threading.set_inter_op_parallelism_threads(cpus)
        except RuntimeError:
            pass  # TensorFlow already ran an op in this process: its pools keep the sizes they have


def call(fn, shared, kwargs: dict, cpus: int | None):
    """Run one job in a worker process: limit threads, call it; `cpus` None leaves the process as
    it is (the in-process engine, where TensorFlow is already running)."""
    if cpus is not None:
        limit_threads(cpus)
    return fn(shared, **kwargs)


def error_text(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc)).rstrip()
