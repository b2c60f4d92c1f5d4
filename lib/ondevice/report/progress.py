"""How long a reproduce run has left, estimated from the stages' recorded times.

The previous run of a scale left each notebook's per-cell wall times in results/<scale>/timings.csv
(report/timings.py). While a notebook runs, papermill saves its executed copy in the staging
directory after every cell, so the cells finished so far are known: a notebook's time left is the
recorded time of its unfinished cells, less what the running cell has spent already. A cell is
known by its stage and how many cells of that stage come before it (`timings.stage_of`), not by
its position, so a cell added to a notebook since the recorded run shifts no other cell's time. Overall, the
notebooks that run together share `at_once` lanes (their time left is divided by the lanes) and
those that measure time run afterwards, alone. A notebook with no recorded time has no estimate,
and the line says so rather than guessing; nor does a cell that the notebook has now and the
record lacks (a stage added since the recorded run), and the plan names such cells. A notebook
whose code (the notebook and its code files, `provenance.fingerprint`) differs from what made its
stored result is estimated all the same, and the plan says its record is of other code.

A run with global models to train takes longer than one that finds them in the model cache. The
record says which cells trained or reused which cache entries and how long each took to train
(`timings.cell_models`); the estimate counts a cell's recorded time without the training it did,
plus the training time of each entry it uses that is not in the cache now (once in the run: the
first notebook that needs a missing entry trains it, the others find it). So a cold run's estimate
holds after a warm run's record, and the other way round.

Before the run, `plan` lists each notebook's recorded time. This machine or this load may run
faster or slower than the recorded run: once the cells this run finished have at least
`PACE_BASIS_S` of recorded time, every estimate is scaled by their observed over recorded time.
"""

from __future__ import annotations

import json
import os
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from .provenance import fingerprint
from .timings import cell_models, resumed, stage_of

Cell = tuple[str, int]  # (stage, how many earlier code cells of the notebook have that stage)

PACE_BASIS_S = 30.0  # recorded seconds of finished cells before their pace scales the estimates:
# a few short set-up cells (imports vary by seconds with the disk cache) say little about the pace


def recorded(scale_dir: Path) -> dict[str, dict[Cell, float]]:
    """notebook -> {cell: seconds without the global-model training it did} from
    scale_dir/timings.csv; {} when there is none."""
    return {name: {c: s for c, (s, _) in cells.items()} for name, cells in _record(scale_dir).items()}


def recorded_models(scale_dir: Path) -> dict[str, dict[Cell, dict[str, float]]]:
    """notebook -> {cell: {model-cache entry: seconds its training took}} of the entries each cell used."""
    return {name: {c: m for c, (_, m) in cells.items() if m} for name, cells in _record(scale_dir).items()}


def _record(scale_dir: Path) -> dict[str, dict[Cell, tuple[float, dict[str, float]]]]:
    try:
        times = pd.read_csv(scale_dir / "timings.csv")
    except (OSError, ValueError):
        return {}
    if not {"notebook", "cell", "stage", "seconds"} <= set(times.columns):
        return {}
    trained = times.get("trained_s", pd.Series(0.0, index=times.index)).fillna(0.0)
    models = times.get("models", pd.Series("", index=times.index)).fillna("").astype(str)
    times = times.assign(warm=times.seconds - trained, models=models.map(_entries))
    out = {}
    for name, rows in times.sort_values(["notebook", "cell"]).groupby("notebook"):
        keys = _keys(rows.stage.astype(str).tolist())
        out[str(name)] = {k: (float(w), m) for k, w, m in zip(keys, rows.warm, rows.models) if w == w}
    return out


def _entries(text: str) -> dict[str, float]:
    """ "entry=seconds entry=seconds" (timings.csv's models column) as a dict."""
    pairs = (item.rpartition("=") for item in text.split())
    return {entry: float(s) for entry, _, s in pairs if entry and s.replace(".", "", 1).isdigit()}


def _keys(stages: list[str]) -> list[Cell]:
    seen: dict[str, int] = {}
    keys = []
    for stage in stages:
        keys.append((stage, seen.get(stage, 0)))
        seen[stage] = seen.get(stage, 0) + 1
    return keys


def unrecorded(notebook: Path, cells: dict[Cell, float]) -> list[Cell]:
    """The code cells of the `notebook` source that `cells` (its record) has no time for: added
    since the recorded run, so the estimate leaves them out. [] when the notebook cannot be read."""
    try:
        code = _code_cells(json.loads(notebook.read_text(encoding="utf-8"))["cells"])
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return [key for key in _keys([stage_of(_source(c)) for c in code]) if key not in cells]


def _code_cells(cells: list[dict]) -> list[dict]:
    return [c for c in cells if c.get("cell_type", "code") == "code"]


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def other_code(scale_dir: Path, name: str, notebook: Path) -> bool:
    """Whether `name`'s stored result (scale_dir/name/run.json) was made by other code than the
    `notebook` source and its code files have now; False when either cannot be read."""
    try:
        stored = json.loads((scale_dir / name / "run.json").read_text())["notebook"]["key"]["fingerprint"]
        return stored != fingerprint(notebook, scale=scale_dir.name)
    except (OSError, ValueError, KeyError, TypeError):
        return False


def cells_done(executed: Path, now: datetime | None = None) -> tuple[dict[Cell, float], float] | None:
    """The finished code cells of a notebook papermill executed or is executing (cell -> seconds
    without the global-model training they did; NaN when papermill gave none, or when the cell read
    results back from an earlier run's stage file, `timings.resumed`), and the seconds the
    running cell has taken so far; None when the copy is missing or half-written (read it again later)."""
    try:
        cells = json.loads(executed.read_text(encoding="utf-8")).get("cells", [])
    except (OSError, ValueError):
        return None
    now = now or datetime.now(timezone.utc)
    code = _code_cells(cells)
    finished, running_for = {}, 0.0
    for key, cell in zip(_keys([stage_of(_source(c)) for c in code]), code):
        meta = cell.get("metadata", {}).get("papermill", {})
        if meta.get("status") == "completed":  # seconds without the global-model training it did
            given = meta.get("duration") is not None and not resumed(cell)
            duration = float(meta["duration"]) if given else float("nan")
            finished[key] = duration - min(cell_models(cell)[0], duration) if duration == duration else duration
        elif meta.get("status") == "running" and meta.get("start_time"):
            try:
                running_for = max(0.0, (now - datetime.fromisoformat(meta["start_time"])).total_seconds())
            except ValueError:
                pass
    return finished, running_for


def seconds_left(
    cells: dict[Cell, float] | None,
    progress: tuple[dict, float] | None,
    pace: float = 1.0,
    cold: dict[Cell, float] | None = None,
) -> float | None:
    """A notebook's estimated seconds left: its unfinished cells' recorded time, plus `cold` (the
    training of global models they need that the cache lacks), times `pace`, less the running
    cell's elapsed time (never below zero); None without a recorded time."""
    if not cells:
        return None
    finished, running_for = progress or ({}, 0.0)
    left = sum(s + (cold or {}).get(c, 0.0) for c, s in cells.items() if c not in finished)
    return max(0.0, pace * left - running_for)


def cold_seconds(order: list[str], models: dict[str, dict[Cell, dict[str, float]]], cached) -> dict:
    """notebook -> {cell: seconds of training of the entries it uses that `cached(entry)` says are
    missing}, each missing entry counted once, at its first use in `order`."""
    counted, out = set(), {}
    for name in order:
        for cell, entries in models.get(name, {}).items():
            missing = {e: s for e, s in entries.items() if e not in counted and not cached(e)}
            counted |= set(missing)
            if missing:
                out.setdefault(name, {})[cell] = sum(missing.values())
    return out


def in_cache(entry: str) -> bool:
    """Whether the model cache holds `entry` (a directory with a complete entry). Its root as
    `training.model_cache.cache_root` gives it, not imported: the training package imports this one."""
    root = Path(os.environ.get("ONDEVICE_MODEL_CACHE", Path.home() / ".cache" / "ondevice-models"))
    return (root / entry / "info.json").is_file()


def pace(recorded_cells: dict[str, dict[Cell, float]], finished: dict[str, dict[Cell, float]]) -> tuple[float, int]:
    """This run's observed over recorded seconds of the cells it finished that have both (None while
    their recorded time is under PACE_BASIS_S), and how many cells that is."""
    pairs = [
        (seconds, recorded_cells[name][cell])
        for name, cells in finished.items()
        for cell, seconds in cells.items()
        if cell in recorded_cells.get(name, {}) and seconds == seconds  # NaN: papermill gave no duration
    ]
    observed, basis = sum(o for o, _ in pairs), sum(r for _, r in pairs)
    return (observed / basis if basis >= PACE_BASIS_S else None), len(pairs)


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


class Progress:
    """The run's state for progress lines: which notebooks are done, which run, what is left."""

    def __init__(
        self,
        scale_dir: Path,
        together: list[str],
        alone: list[str],
        at_once: int,
        clock=time.monotonic,
        sources: dict[str, Path] | None = None,
    ):
        """`sources`: notebook -> its source .ipynb, to find cells the record lacks (`unrecorded`)
        and records of other code (`other_code`)."""
        self.scale_dir, self.at_once, self.clock = scale_dir, max(1, at_once), clock
        self.together, self.alone = list(together), list(alone)
        self.cells = recorded(scale_dir)  # read before this run rewrites timings.csv
        recorded_sources = {n: p for n, p in (sources or {}).items() if self.cells.get(n)}
        self.new = {n: unrecorded(p, self.cells[n]) for n, p in recorded_sources.items()}
        self.other_code = {n for n, p in recorded_sources.items() if other_code(scale_dir, n, p)}
        self.models = recorded_models(scale_dir)
        self.cached = in_cache
        self.done: set[str] = set()
        self.failed: set[str] = set()  # ended without a result: in `done`, counted apart
        self.ran: dict[str, dict[Cell, float]] = {}  # notebook this run completed -> its cells' seconds
        self.began = clock()
        self.began_at = time.time()  # wall clock, for the files this run writes

    def plan(self) -> list[str]:
        """Before the run: each notebook's recorded time ("no record" when it has none) and the total."""
        source, lines = f"{self.scale_dir.name}/timings.csv", []
        after = ", afterwards" if self.together else ""
        cold = cold_seconds(self.together + self.alone, self.models, self.cached)
        for group, how in ((self.together, f"{self.at_once} at a time"), (self.alone, f"alone{after}")):
            for name in group:
                cells, train = self.cells.get(name), sum(cold.get(name, {}).values())
                recorded_s = f"{_minutes(sum(cells.values()))} recorded" if cells else "no record"
                recorded_s += " (on code changed since)" if name in self.other_code else ""
                recorded_s += f" + {_minutes(train)} training global models not in the cache" if train else ""
                if new := self.new.get(name):
                    stages = ", ".join(stage if len(stage) <= 40 else stage[:39] + "…" for stage, _ in new)
                    recorded_s += f"; not counting {len(new)} cell(s) added since the record ({stages})"
                lines.append(f"[progress] plan: {name:<28} {recorded_s} ({how})")
        names = self.together + self.alone
        total, unknown = self._total({n: seconds_left(self.cells.get(n), None, cold=cold.get(n)) for n in names})
        if unknown == len(self.together) + len(self.alone):
            return [*lines, f"[progress] plan: no estimate: no recorded time in {source}"]
        return [*lines, f"[progress] plan: about {_minutes(total)} in all from {source}" + _unknown(unknown)]

    def finished(self, name: str, ran: bool = False) -> None:
        """`name` ended; with `ran`, this run completed it, and its cells' times set the pace. One
        that this run left as failed (results/<scale>/<name>.failed/, written since the run began:
        the runner's mark) is counted as failed, not done."""
        self.done.add(name)
        try:
            if not ran and (self.scale_dir / f"{name}.failed" / "run.json").stat().st_mtime >= self.began_at:
                self.failed.add(name)
        except OSError:
            pass
        done = cells_done(self.scale_dir / name / f"{name}.ipynb") if ran else None
        if done is not None:
            self.ran[name] = done[0]

    def _staged(self, name: str) -> Path | None:
        copies = sorted(self.scale_dir.glob(f".staging-{name}-*/{name}.ipynb"), key=lambda p: p.stat().st_mtime)
        return copies[-1] if copies else None

    def _total(self, left: dict[str, float | None]) -> tuple[float, int]:
        """The run's seconds left from each notebook's (together share the lanes; the timed ones
        run after, alone), and how many notebooks have no estimate."""
        known = lambda group: sum(left[n] for n in group if left.get(n) is not None)  # noqa: E731
        unknown = sum(1 for n in self.together + self.alone if n in left and left[n] is None)
        return known(self.together) / self.at_once + known(self.alone), unknown

    def line(self) -> str:
        """One line: notebooks done, time elapsed, each running one's time left, the run's time left."""
        running = {
            n: cells_done(c) for n in self.together + self.alone if n not in self.done and (c := self._staged(n))
        }
        speed, cells = pace(self.cells, self.ran | {n: p[0] for n, p in running.items() if p is not None})
        names = [n for n in self.together + self.alone if n not in self.done]
        cold = cold_seconds(names, self.models, self.cached)
        left = {n: seconds_left(self.cells.get(n), running.get(n), speed or 1.0, cold.get(n)) for n in names}
        parts = []
        for name in running:
            if left[name] is None:
                parts.append(f"{name} (no recorded time)")
            else:
                of = f" of {_minutes(sum(self.cells[name].values()))} recorded"
                parts.append(
                    f"{name} ~{_minutes(left[name])} left{of}" if left[name] > 0 else f"{name} past its recorded time"
                )
        n = len(self.together) + len(self.alone)
        failed = f", {len(self.failed)} failed" if self.failed else ""
        text = f"[progress] {len(self.done - self.failed)}/{n} notebooks done{failed}, "
        text += f"{_minutes(self.clock() - self.began)} elapsed"
        text += f"; running: {', '.join(parts)}" if parts else ""
        total, unknown = self._total(left)
        if left and unknown == len(left):
            return text + f"; no estimate: no recorded time in {self.scale_dir.name}/timings.csv for what is left"
        basis = (
            f"recorded times x{speed:.2f}, this run's pace over {cells} finished cells" if speed else "recorded times"
        )
        text += f"; about {_minutes(total)} left overall ({basis}, {self.scale_dir.name}/timings.csv)"
        return text + _unknown(unknown)


def _unknown(count: int) -> str:
    return f", not counting {count} with no recorded time" if count else ""


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
