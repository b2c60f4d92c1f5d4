"""Ctrl-C during `make reproduce` stops the runner, its Jupyter kernel (which runs in a session of
its own, so the terminal's SIGINT never reaches it) and every other child, and writes nothing that
looks like a result."""

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import nbformat
import psutil
import pytest

from ondevice import REPO_ROOT

STARTED = "kernel cell started"


def sleepy_notebook(path: Path) -> None:
    params = nbformat.v4.new_code_cell('scale = "smoke"\nout_dir = ""')
    params.metadata["tags"] = ["parameters"]
    loop = nbformat.v4.new_code_cell(
        f"import time\nprint({STARTED!r}, flush=True)\nfor _ in range(3000):\n    time.sleep(0.2)"
    )
    nb = nbformat.v4.new_notebook(cells=[params, loop])
    nb.metadata["kernelspec"] = {"name": "ondevice", "display_name": "Python (ondevice)", "language": "python"}
    nbformat.write(nb, path)


def start_runner(tmp_path: Path, names=("sleepy",), at_once: int = 1):
    """The runner on sleepy notebooks; `started` is set once every one of them is in its cell."""
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    for name in names:
        sleepy_notebook(notebooks / f"{name}.ipynb")
    env = {**os.environ, "ONDEVICE_RESULTS": str(tmp_path / "results"), "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "ondevice.report.runner", "--scale", "smoke", "--notebooks-dir", str(notebooks)]
    proc = subprocess.Popen(
        [*cmd, "--at-once", str(at_once)],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines, started = [], threading.Event()

    def read():
        for line in proc.stdout:
            lines.append(line)
            if sum(STARTED in seen for seen in lines) == len(names):
                started.set()

    threading.Thread(target=read, daemon=True).start()
    return proc, lines, started


@pytest.mark.parametrize(
    "signum, names, at_once",
    [(signal.SIGINT, ("sleepy",), 1), (signal.SIGTERM, ("sleepy",), 1), (signal.SIGINT, ("sleepy", "dozy"), 2)],
    ids=["SIGINT", "SIGTERM", "SIGINT, two notebooks at once"],
)
def test_signal_stops_kernel_and_leaves_no_result(tmp_path, signum, names, at_once):
    proc, lines, started = start_runner(tmp_path, names, at_once)
    try:
        assert started.wait(120), "the notebook's cell never started:\n" + "".join(lines)
        descendants = psutil.Process(proc.pid).children(recursive=True)
        assert descendants, "no kernel process found under the runner"
        scale_dir = tmp_path / "results" / "smoke"
        for name in names:
            assert list(scale_dir.glob(f".staging-{name}-*")), "the runner should be working in a staging dir"

        os.killpg(proc.pid, signum)  # what the terminal does to its foreground process group
        assert proc.wait(60) == 130, "".join(lines)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    gone, alive = psutil.wait_procs(descendants, timeout=5)
    alive = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"left running: {[(p.pid, p.cmdline()) for p in alive]}"
    assert not list(scale_dir.glob(".staging-*")) and not list(scale_dir.glob(".old-*"))
    for name in names:
        assert not (scale_dir / name).exists() and not (scale_dir / f"{name}.failed").exists()
    assert not list(scale_dir.rglob(".complete.json")) and not list(scale_dir.rglob("run.json"))
    assert "interrupted by " + signal.Signals(signum).name in "".join(lines)


def test_next_run_starts_cleanly_after_a_killed_runner(tmp_path):
    """A runner killed outright (SIGKILL, no cleanup) leaves a staging dir; the next run removes it."""
    scale_dir = tmp_path / "results" / "smoke"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = scale_dir / f".staging-sleepy-{dead.pid}"
    stale.mkdir(parents=True)
    (stale / "run.json").write_text(json.dumps({"half": "written"}))
    proc, lines, started = start_runner(tmp_path)
    try:
        assert started.wait(120), "".join(lines)
        assert not stale.exists()
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(60) == 130, "".join(lines)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
