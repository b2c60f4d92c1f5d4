"""How long a reproduce run has left, estimated from the stages' recorded times.

The previous run of a scale left each notebook's per-cell wall times in results/<scale>/timings.csv
(report/timings.py). While a notebook runs, papermill saves its executed copy in the staging
directory after every cell, so the cells finished so far are known: a notebook's time left is the
recorded time of its unfinished cells, less what the running cell has spent already. Overall, the
notebooks that run together share `at_once` lanes (their time left is divided by the lanes) and
those that measure time run afterwards, alone. A notebook with no recorded time has no estimate,
and the line says so rather than guessing.
"""

from __future__ import annotations

import json
import threading
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd


def recorded(scale_dir: Path) -> dict[str, dict[int, float]]:
    """notebook -> {cell index: seconds} from scale_dir/timings.csv; {} when there is none."""
    try:
        times = pd.read_csv(scale_dir / "timings.csv")
    except (OSError, ValueError):
        return {}
    if not {"notebook", "cell", "seconds"} <= set(times.columns):
        return {}
    times = times.dropna(subset=["seconds"])
    return {
        str(name): {int(c): float(s) for c, s in zip(rows.cell, rows.seconds)}
        for name, rows in times.groupby("notebook")
    }


def cells_done(executed: Path, now: datetime | None = None) -> tuple[set[int], float] | None:
    """The finished code cells of a notebook papermill is executing, and the seconds the running
    cell has taken so far; None when the copy is missing or half-written (read it again later)."""
    try:
        cells = json.loads(executed.read_text(encoding="utf-8")).get("cells", [])
    except (OSError, ValueError):
        return None
    now = now or datetime.now(timezone.utc)
    finished, running_for = set(), 0.0
    for index, cell in enumerate(cells):
        meta = cell.get("metadata", {}).get("papermill", {})
        if meta.get("status") == "completed":
            finished.add(index)
        elif meta.get("status") == "running" and meta.get("start_time"):
            try:
                running_for = max(0.0, (now - datetime.fromisoformat(meta["start_time"])).total_seconds())
            except ValueError:
                pass
    return finished, running_for


def seconds_left(cells: dict[int, float] | None, progress: tuple[set[int], float] | None) -> float | None:
    """A notebook's estimated seconds left: its unfinished cells' recorded time less the running
    cell's elapsed time (never below zero); None without a recorded time."""
    if not cells:
        return None
    finished, running_for = progress or (set(), 0.0)
    return max(0.0, sum(s for c, s in cells.items() if c not in finished) - running_for)


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


class Progress:
    """The run's state for progress lines: which notebooks are done, which run, what is left."""

    def __init__(self, scale_dir: Path, together: list[str], alone: list[str], at_once: int):
        self.scale_dir, self.at_once = scale_dir, max(1, at_once)
        self.together, self.alone = list(together), list(alone)
        self.cells = recorded(scale_dir)  # read before this run rewrites timings.csv
        self.done: set[str] = set()

    def finished(self, name: str) -> None:
        self.done.add(name)

    def _staged(self, name: str) -> Path | None:
        copies = sorted(self.scale_dir.glob(f".staging-{name}-*/{name}.ipynb"), key=lambda p: p.stat().st_mtime)
        return copies[-1] if copies else None

    def _left(self, name: str) -> tuple[float | None, bool]:
        """(seconds left or None, whether it is running now)."""
        staged = None if name in self.done else self._staged(name)
        if name in self.done:
            return 0.0, False
        return seconds_left(self.cells.get(name), cells_done(staged) if staged else None), staged is not None

    def line(self) -> str:
        """One line: notebooks done, each running one's time left, and the run's time left."""
        parts, unknown, total = [], [], 0.0
        for group, lanes in ((self.together, self.at_once), (self.alone, 1)):
            group_left = 0.0
            for name in group:
                left, running = self._left(name)
                if left is None:
                    unknown.append(name)
                    if running:
                        parts.append(f"{name} (no recorded time)")
                    continue
                group_left += left
                if running:
                    parts.append(f"{name} ~{_minutes(left)} left" if left > 0 else f"{name} past its recorded time")
            total += group_left / (lanes if group is self.together else 1)
        n = len(self.together) + len(self.alone)
        text = f"[progress] {len(self.done)}/{n} notebooks done"
        text += f"; running: {', '.join(parts)}" if parts else ""
        if len(unknown) == n - len(self.done):
            return text + f"; no estimate: no recorded time in {self.scale_dir.name}/timings.csv for what is left"
        source = f"{self.scale_dir.name}/timings.csv"
        text += f"; about {_minutes(total)} left overall (from the stage times recorded in {source})"
        return text + (f", not counting {len(unknown)} with no recorded time" if unknown else "")


class Ticker:
    """Prints `progress.line()` every `every` seconds from a daemon thread until stopped."""

    def __init__(self, progress: Progress, every: float, log=print):
        self.progress, self.every, self.log = progress, every, log
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            self.log(self.progress.line(), flush=True)

    def __enter__(self) -> Ticker:
        if self.every > 0:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.every)
