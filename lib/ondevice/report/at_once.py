"""Several notebooks at a time, so `make reproduce` uses every core of the machine.

Most of a notebook's time is small TensorFlow steps (an LSTM at batch 16, a MobileNet head) that
two threads barely speed up: on the 2-core machine of the speed issue, one personal LSTM step took
8.7 ms with two threads and 10.2 ms with one, while two one-thread processes each stepped in
11.0 ms (1.59x the work per second; at batch 128, 1.14x). So notebooks run in `at_once` child
runners, each with its share of the CPUs as TensorFlow's thread pools, longest first (by the last
completed run's wall time) so the long ones do not end alone.

Measured on that machine with warm caches: deeptype_online and autlearn_augment_online took 621 s
one after the other and 492 s at once (1.26x), with identical results. Where one notebook trains a
global model at batch 128 with little beside it, one thread costs more than the overlap saves: a
cold deeptype_data_size beside deeptype_ngram and deeptype_online took 1,027 s at once against
931 s one after the other (0.91x; its largest model 479 s on one thread, alone at the end). In
the whole suite the two lanes stay busy (DeepType's top-3-eff notebook is about half of the work
that can run at once), which is where running at once pays.

Notebooks that measure time (notebook metadata `ondevice.measures_time`: a timing claim, a
step-time benchmark, an energy model built on step times) run afterwards, one at a time, with the
whole machine: a notebook beside them would slow their timed steps. Every run.json records how many
notebooks ran at once and the threads it had (`notebook.at_once`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from ondevice.threads import THREAD_VARIABLES

EXIT_SKIPPED = 4  # a child runner's exit status when this checkout had completed the notebook


def measures_time(notebook: Path) -> bool:
    """Whether the notebook's metadata says it measures time (it must then run alone)."""
    try:
        meta = json.loads(notebook.read_text(encoding="utf-8")).get("metadata", {})
    except (OSError, ValueError):
        return False
    return bool(meta.get("ondevice", {}).get("measures_time", False))


def longest_first(notebooks: list[Path], scale_dir: Path) -> list[Path]:
    """Notebooks by the wall time of their last completed run, longest first; never-run ones first."""

    def last_wall(nb: Path) -> float:
        try:
            run = json.loads((scale_dir / nb.stem / "run.json").read_text())
            return float(run["notebook"]["wall_time_s"])
        except (OSError, ValueError, KeyError, TypeError):
            return float("inf")

    return sorted(notebooks, key=lambda nb: -last_wall(nb))


def child_env(at_once: int, results: Path) -> dict[str, str]:
    """The environment of a child runner: its share of the CPUs for TensorFlow, the results dir."""
    threads = max(1, (os.cpu_count() or 1) // at_once)
    env = {**os.environ, "ONDEVICE_RESULTS": str(results), "ONDEVICE_AT_ONCE": str(at_once)}
    env.update({name: str(threads) for name in THREAD_VARIABLES})
    return env


def _pump(name: str, stream) -> None:
    """Copy a child's output to ours, each line prefixed with its notebook's name."""
    for line in stream:
        print(f"[{name}] {line}", end="", flush=True)


def run(notebooks: list[Path], scale: str, params: dict, force: bool, at_once: int, results: Path, on_done) -> dict:
    """Run `notebooks` in child runners, at most `at_once` at a time; call `on_done(notebook,
    status)` as each one ends (in this thread) and return {name: status}. Status: 'complete',
    'skipped', 'failed' or 'interrupted'."""
    queue, running, statuses = list(notebooks), {}, {}
    env = child_env(at_once, results)
    while queue or running:
        while queue and len(running) < at_once:
            nb = queue.pop(0)
            cmd = [sys.executable, "-m", "ondevice.report.runner", "--child", "--scale", scale]
            cmd += ["--notebooks-dir", str(nb.parent), "--notebook", nb.stem, "--params", json.dumps(params)]
            cmd += ["--force"] if force else []
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
            pump = threading.Thread(target=_pump, args=(nb.stem, proc.stdout), daemon=True)
            pump.start()
            running[nb] = (proc, pump)
        time.sleep(0.2)
        for nb, (proc, pump) in list(running.items()):
            code = proc.poll()
            if code is None:
                continue
            pump.join(timeout=5)
            del running[nb]
            statuses[nb.stem] = {0: "complete", EXIT_SKIPPED: "skipped", 130: "interrupted"}.get(code, "failed")
            on_done(nb, statuses[nb.stem])
    return statuses
