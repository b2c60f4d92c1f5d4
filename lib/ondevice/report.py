"""Results as data: tidy tables, figures and run.json, written atomically; paper-vs-ours tables."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import pandas as pd

from . import REPO_ROOT

PACKAGES = ("tensorflow", "tf-keras", "tensorflow-model-optimization", "numpy", "pandas", "seaborn",
            "papermill", "ondevice")


@dataclass(frozen=True)
class PaperNumber:
    quantity: str
    value: float
    source: str


@dataclass(frozen=True)
class Effect:
    """A claimed direction: `better` should exceed `worse` (by the paper's account)."""

    claim: str
    better: str
    worse: str


@dataclass(frozen=True)
class Paper:
    citation: str
    numbers: tuple[PaperNumber, ...]
    effects: tuple[Effect, ...]


def paper_vs_ours(paper: Paper, ours: dict[str, float]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The paper's numbers beside ours (never instead), and whether each claimed effect holds here."""
    missing = [n.quantity for n in paper.numbers if n.quantity not in ours]
    if missing:
        raise KeyError(f"no measured value for {missing}")
    numbers = pd.DataFrame([
        {"quantity": n.quantity, "paper": n.value, "ours": ours[n.quantity],
         "ours / paper": ours[n.quantity] / n.value if n.value else float("nan"), "paper source": n.source}
        for n in paper.numbers
    ])
    paper_values = {n.quantity: n.value for n in paper.numbers}
    effects = pd.DataFrame([
        {"effect": e.claim, "holds in paper": paper_values[e.better] > paper_values[e.worse],
         "holds in ours": ours[e.better] > ours[e.worse],
         "paper change": paper_values[e.better] / paper_values[e.worse] - 1,
         "our change": ours[e.better] / ours[e.worse] - 1}
        for e in paper.effects
    ])
    return numbers, effects


CODE_PATHS = ("lib", "notebooks", "data_manifests", "requirements.lock", "pyproject.toml")


def git_state() -> dict:
    """The commit, and whether the code that makes results (CODE_PATHS) differs from it."""
    def git(*args):
        out = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True)
        return out.stdout.strip() if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--", *CODE_PATHS)
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def environment() -> dict:
    """Where a result came from: code version, package versions and hardware."""
    import tensorflow as tf

    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "git": git_state(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": versions,
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "gpus": [d.name for d in tf.config.list_physical_devices("GPU")],
    }


def atomic_write(path: Path, write) -> None:
    """write(tmp_path) then rename over path, so a reader never sees a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; results are meant to be read and published
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@dataclass
class Result:
    """What an experiment measured: tidy tables, figures, and the metadata of the run."""

    experiment: str
    params: dict
    tables: dict[str, pd.DataFrame]
    data: list[dict]
    stand_in_data: str | None
    wall_time_s: float
    figures: dict = field(default_factory=dict)
    notes: dict = field(default_factory=dict)
    models: dict[str, bytes] = field(default_factory=dict)  # exported files, e.g. trainable .tflite

    def add_figure(self, name: str, figure) -> None:
        self.figures[name] = figure

    def save(self, out_dir: str | Path) -> Path:
        """Write tables (CSV), figures (PNG+SVG), models and run.json, run.json last: it marks completeness."""
        out = Path(out_dir)
        for name, blob in self.models.items():
            atomic_write(out / "models" / name, lambda p, b=blob: p.write_bytes(b))
        for name, table in self.tables.items():
            atomic_write(out / "tables" / f"{name}.csv", lambda p, t=table: t.to_csv(p, index=False))
        for name, fig in self.figures.items():
            for ext in ("png", "svg"):
                atomic_write(out / "figures" / f"{name}.{ext}",
                             lambda p, f=fig, e=ext: f.savefig(p, format=e, dpi=150, bbox_inches="tight"))
        run = {
            "experiment": self.experiment,
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "scale": self.params.get("scale"),
            "seed": self.params.get("seed"),
            "params": self.params,
            "stand_in_data": self.stand_in_data,
            "data": self.data,
            "wall_time_s": round(self.wall_time_s, 2),
            "environment": environment(),
            "tables": sorted(self.tables),
            "figures": sorted(self.figures),
            "models": {name: len(blob) for name, blob in self.models.items()},
            "notes": self.notes,
        }
        atomic_write(out / "run.json", lambda p: p.write_text(json.dumps(run, indent=2, default=str)))
        return out


def verdict(result: Result) -> str:
    """A Markdown sentence per claimed effect: does it hold on our data, and on what data."""
    lines = []
    for _, row in result.tables["effects"].iterrows():
        ours, paper = bool(row["holds in ours"]), bool(row["holds in paper"])
        lines.append(f"- **{row['effect']}**: {'holds' if ours else 'does not hold'} in our measurement "
                     f"({'as in' if ours == paper else 'unlike'} the paper), with a change of "
                     f"{row['our change']:+.1%} against the paper's {row['paper change']:+.1%}.")
    if result.stand_in_data:
        lines.append(f"- Our data is **stand-in data** for {result.stand_in_data.strip()} "
                     "Absolute numbers are not comparable with the paper's; the direction of each effect is.")
    return "\n".join(lines)


def default_out_dir(experiment: str, out_dir: str) -> Path:
    """Where a notebook saves: the runner's staging directory, or results/interactive/<experiment>."""
    return Path(out_dir) if out_dir else REPO_ROOT / "results" / "interactive" / experiment
