"""Thread pools sized to the CPUs a process is given, for a job in a worker process
(`engine.worker`) or a notebook run beside others (`report.at_once`): TensorFlow's intra- and
inter-op pools and OpenMP read these variables when they start."""

from __future__ import annotations

import os
import sys

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
