"""One job in a Python process of its own, started through `subprocess` and ended with the job.

A Dask worker started the ordinary way (`dask worker`, with its nanny, or a LocalCluster) is a
daemonic process, and `multiprocessing` refuses a daemonic process children; `subprocess` may
start any program. So the job's process is a new interpreter (`sys.executable`) with the worker's
`sys.path`, as a spawned process would have: the job's functions import there as they do in the
worker, and TensorFlow is imported there, never in the worker. The job and its result travel
through files in a temporary directory, pickled with cloudpickle (functions of a notebook or
script travel too).

What a process per job gives: the memory TensorFlow held is returned when the job ends, and a job
that kills its process (out of memory, a crash) fails alone, to be retried, while its worker lives
on. The job's standard input is a pipe the worker holds open while it waits: when the worker dies,
the job's process reads its end and exits, so no job outlives its worker.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import cloudpickle

from . import worker

# argv: the job's directory, then the worker's sys.path (set before anything of the job is imported)
_BOOT = "import sys; sys.path[:] = sys.argv[2:]; from ondevice.engine.process import main; main(sys.argv[1])"


class JobError(RuntimeError):
    """The job raised in its process; the message is that process's traceback, so its last line
    names the job's own exception."""


def run(fn, shared, kwargs: dict, cpus: int):
    """Run `fn(shared, **kwargs)` in a new process with `cpus` threads and return its result."""
    with tempfile.TemporaryDirectory(prefix="ondevice-job-") as tmp:
        Path(tmp, "job.pkl").write_bytes(cloudpickle.dumps((fn, shared, kwargs, cpus)))
        with subprocess.Popen([sys.executable, "-c", _BOOT, tmp, *sys.path], stdin=subprocess.PIPE) as job:
            code = job.wait()
        result = Path(tmp, "result.pkl")
        if code != 0 or not result.is_file():
            raise RuntimeError(f"the job's process {_ended(code)} before it returned a result")
        ok, value = pickle.loads(result.read_bytes())
    if not ok:
        raise JobError(value)
    return value


def _ended(code: int) -> str:
    if code < 0:
        name = signal.Signals(-code).name
        return f"was killed by {name}" + (" (out of memory?)" if -code == signal.SIGKILL else "")
    return f"exited with code {code}"


def main(tmp: str) -> None:
    """In the job's process: run the job, write (True, result) or (False, traceback text)."""
    threading.Thread(target=_exit_with_worker, daemon=True).start()
    try:
        fn, shared, kwargs, cpus = pickle.loads(Path(tmp, "job.pkl").read_bytes())
        data = cloudpickle.dumps((True, worker.call(fn, shared, kwargs, cpus)))
    except Exception as exc:  # noqa: BLE001  (the worker raises it as the job's failure)
        data = cloudpickle.dumps((False, worker.error_text(exc)))
    partial = Path(tmp, "result.pkl.partial")
    partial.write_bytes(data)
    partial.rename(Path(tmp, "result.pkl"))  # whole or absent, should the process die while writing
    sys.stdout.flush()
    sys.stderr.flush()


def _exit_with_worker() -> None:
    """Blocks on standard input (the raw descriptor: a buffered reader's lock would stall the
    interpreter's shutdown) until the worker closes it or dies, then ends this process."""
    while os.read(0, 4096):
        pass
    os._exit(1)
