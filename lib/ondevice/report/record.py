"""Results as data: tidy tables, figures and run.json, written atomically."""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from ondevice import REPO_ROOT
from ondevice.report.provenance import environment


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
    headline: dict[str, dict] = field(default_factory=dict)  # claims.headline(...) per number
    artifacts: dict[str, dict] = field(default_factory=dict)  # JSON files beside run.json, e.g. the split

    def add_figure(self, name: str, figure) -> None:
        self.figures[name] = figure

    def save(self, out_dir: str | Path) -> Path:
        """Write tables (CSV), figures (PNG+SVG), models, artifacts and run.json, run.json last: it
        marks completeness."""
        out = Path(out_dir)
        for name, doc in self.artifacts.items():
            atomic_write(out / name, lambda p, d=doc: p.write_text(json.dumps(d, indent=1)))
        for name, blob in self.models.items():
            atomic_write(out / "models" / name, lambda p, b=blob: p.write_bytes(b))
        for name, table in self.tables.items():
            atomic_write(out / "tables" / f"{name}.csv", lambda p, t=table: t.to_csv(p, index=False))
        for name, fig in self.figures.items():
            for ext in ("png", "svg"):
                atomic_write(
                    out / "figures" / f"{name}.{ext}",
                    lambda p, f=fig, e=ext: f.savefig(p, format=e, dpi=150, bbox_inches="tight"),
                )
        run = {
            "experiment": self.experiment,
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "scale": self.params.get("scale"),
            "seed": self.params.get("seed"),
            "params": self.params,
            "stand_in_data": self.stand_in_data,
            "data": self.data,
            "wall_time_s": round(self.wall_time_s, 2),
            "headline": self.headline,
            "environment": environment(self.experiment),
            "tables": sorted(self.tables),
            "figures": sorted(self.figures),
            "models": {name: len(blob) for name, blob in self.models.items()},
            "artifacts": sorted(self.artifacts),
            "notes": self.notes,
        }
        atomic_write(out / "run.json", lambda p: p.write_text(json.dumps(run, indent=2, default=str)))
        return out


def default_out_dir(experiment: str, out_dir: str) -> Path:
    """Where a notebook saves: the runner's staging directory, or results/interactive/<experiment>."""
    return Path(out_dir) if out_dir else REPO_ROOT / "results" / "interactive" / experiment
