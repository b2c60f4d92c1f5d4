"""Where a run's time went: per notebook and per stage, read from the executed notebooks.

papermill records each cell's wall time; a cell's stage is the first experiment function it calls
(e.g. `exp.train_globals` -> "train_globals"), so the breakdown needs no timing code in the
experiments and matches what the reader sees in the notebook.

    python -m ondevice.report.timings --scale default   # prints it, writes results/default/timings.csv
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import os
import platform
import re
from pathlib import Path

import pandas as pd

from .. import REPO_ROOT
from .record import atomic_write

RESULTS = Path(os.environ.get("ONDEVICE_RESULTS") or REPO_ROOT / "results")
MODULE_ALIASES = {"exp", "common", "protocol"}  # how notebooks name the experiment's modules


def stage_of(source: str) -> str:
    """The first `exp.f(...)`/`common.f(...)` call of a cell, else its first line (a set-up cell)."""
    try:
        tree = ast.parse("\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))))
    except SyntaxError:
        tree = None
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)] if tree else []
    calls.sort(key=lambda n: (n.lineno, n.col_offset))
    for call in calls:
        f = call.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in MODULE_ALIASES:
            return f.attr
    first = next(
        (line.strip() for line in source.splitlines() if line.strip() and not line.lstrip().startswith("#")), ""
    )
    return first[:60] or "(comment)"


# the model cache's lines (training/model_cache.py): an entry this cell trained, or one it reused
TRAINED = re.compile(r"^\[model cache\] \S+: trained in (\d+)s, stored in (\S+)\s*$", re.M)
REUSED = re.compile(r"^\[model cache\] \S+: reusing (\S+) \(trained [^)]*? in (\d+)s\)", re.M)
WAITED = re.compile(r"^\[model cache\] \S+: another process is training (\S+); waiting for it\s*$", re.M)


RESUMED = re.compile(r"^\[stage\] \S+: read back from ", re.M)

# What a stage's time is for, by its name; the seconds a cell spent training global models count as
# "global model" whatever the stage. The first kind whose pattern the stage matches; else "other"
# (set-up, data, reports, figures).
KINDS = (
    ("control or sensitivity", r"control|planted|sensitiv|ablation|remed|starts|forgetting|parity|scale ="),
    ("screen or choice", r"choose|choice|select|screen|rates?\b|step_size"),
    ("timing benchmark", r"bench|profile|time_|timing|latency|energy|on_device|compile"),
    ("global model", r"global|pretrain|train_sizes|models = starts.train|compress"),
    ("per-user training", r"personal|cycles|online|method|augment|fedavg|clients|devices|fit|lf_|gdm|fmc|user"),
    ("seed", r"seed"),
)


def kind_of(stage: str) -> str:
    return next((kind for kind, pattern in KINDS if re.search(pattern, stage)), "other")


def _stream_text(cell: dict) -> str:
    return "".join("".join(o.get("text", "")) for o in cell.get("outputs", []) if o.get("output_type") == "stream")


def resumed(cell: dict) -> bool:
    """Whether a cell read some of its results back from an earlier run's stage file
    (`engine.stage`): its time says nothing of how fast this run works."""
    return bool(RESUMED.search(_stream_text(cell)))


def cell_models(cell: dict) -> tuple[float, dict[str, float]]:
    """The seconds a cell spent training global models (entries it stored, and entries it waited
    for while another process trained them: at most their training time, so callers cap it at the
    cell's duration), and every model-cache entry it trained or reused -> the seconds its training
    took: a cold run's extra time is known even from a warm run's record (report/progress.py)."""
    text = _stream_text(cell)
    trained = {Path(p).name: float(s) for s, p in TRAINED.findall(text)}
    used = {Path(p).name: float(s) for p, s in REUSED.findall(text)} | trained
    waited = {name for name in WAITED.findall(text) if name in used and name not in trained}
    return sum(trained.values()) + sum(used[name] for name in waited), used


def notebook_stages(path: Path) -> list[dict]:
    """One row per code cell of an executed notebook: its stage, papermill's wall seconds, the
    seconds of global-model training in them and the model-cache entries it used (`cell_models`)."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    rows = []
    for index, cell in enumerate(nb.get("cells", [])):
        if cell.get("cell_type") != "code":
            continue
        seconds = cell.get("metadata", {}).get("papermill", {}).get("duration")
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else source
        rows.append(
            {
                "notebook": path.stem,
                "cell": index,
                "stage": (stage := stage_of(source)),
                "kind": kind_of(stage),
                "seconds": float(seconds) if seconds is not None else float("nan"),
                "trained_s": min((models := cell_models(cell))[0], float(seconds) if seconds is not None else math.inf),
                "models": " ".join(f"{entry}={s:.0f}" for entry, s in models[1].items()),
            }
        )
    return rows


def table(scale_dir: Path) -> pd.DataFrame:
    """Every completed notebook of a results tree (results/<scale>/<name>/<name>.ipynb)."""
    rows = [r for p in sorted(scale_dir.glob("*/*.ipynb")) if p.stem == p.parent.name for r in notebook_stages(p)]
    if not rows:
        return pd.DataFrame(columns=["notebook", "cell", "stage", "kind", "seconds", "trained_s", "models"])
    return pd.DataFrame(rows)


def machine() -> str:
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {platform.system()}"


def _at_once(run_json: Path) -> str:
    """How the notebook ran, from its run.json: beside how many others, on how many threads, and the
    machine's mean load while it ran (about its threads when nothing else ran beside it)."""
    try:
        notebook = json.loads(run_json.read_text())["notebook"]
        at_once = notebook["at_once"]
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    threads = f"{at_once['threads']} thread{'s' if at_once['threads'] != 1 else ''}"
    how = f"{at_once['notebooks']} at once, {threads}" if at_once["notebooks"] > 1 else f"alone, {threads}"
    load = notebook.get("load_average")
    return f"  ({how}" + (f", load {load['mean']:.1f} mean, {load['max']:.1f} max)" if load else ")")


def cold_seconds(times: pd.DataFrame) -> float:
    """A cold run's time from one notebook's stage rows: its cells less the global-model training
    they did, plus the recorded training time of every model-cache entry they used."""
    used = {}
    for models in times.models.fillna(""):
        for entry in str(models).split():
            name, _, seconds = entry.rpartition("=")
            used[name] = float(seconds)
    return float(times.seconds.sum() - times.trained_s.sum() + sum(used.values()))


def by_kind(times: pd.DataFrame) -> dict[str, float]:
    """Seconds by kind (KINDS) of one notebook's stages; training global models is its own kind."""
    rest = (times.seconds - times.trained_s).groupby(times.kind).sum()
    kinds = rest.to_dict() | {"global model": float(rest.get("global model", 0.0) + times.trained_s.sum())}
    return {k: v for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]) if v >= 3}


def report(scale_dir: Path, top: int = 12, log=print) -> pd.DataFrame:
    """Write scale_dir/timings.csv and print per-notebook totals and the slowest stages."""
    times = table(scale_dir)
    atomic_write(scale_dir / "timings.csv", lambda p: times.to_csv(p, index=False))
    if times.empty:
        log(f"[timings] no executed notebooks in {scale_dir}")
        return times
    per_notebook = times.groupby("notebook").seconds.sum().sort_values(ascending=False)
    trained = times.groupby("notebook").trained_s.sum()
    share = lambda s, t: f", {t / s:.0%} training global models" if t and s else ""  # noqa: E731
    cold = sum(cold_seconds(g) for _, g in times.groupby("notebook"))
    log(
        f"[timings] {scale_dir.name} on {machine()}: {per_notebook.sum() / 60:.1f} min in {len(per_notebook)} notebooks"
        f"{share(per_notebook.sum(), trained.sum())}, {cold / 60:.1f} min cold (a model two notebooks use counts in "
        "each; notebooks run at once overlap: the wall time is less)"
    )
    for name, seconds in per_notebook.items():
        how = _at_once(scale_dir / name / "run.json")
        mine = times[times.notebook == name]
        log(
            f"[timings]   {name:<28} {seconds / 60:6.1f} min (cold {cold_seconds(mine) / 60:.1f})"
            f"{share(seconds, trained[name])}{how}"
        )
        log("[timings]     by kind: " + ", ".join(f"{k} {v / 60:.1f} min" for k, v in by_kind(mine).items()))
    log(f"[timings] slowest stages (all in {scale_dir / 'timings.csv'}):")
    for row in times.nlargest(top, "seconds").itertuples():
        log(f"[timings]   {row.notebook:<28} {row.stage:<32} {row.seconds / 60:6.1f} min")
    return times


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="per-notebook and per-stage wall time of a results tree")
    ap.add_argument("--scale", default="default")
    args = ap.parse_args(argv)
    report(RESULTS / args.scale)


if __name__ == "__main__":
    main()
