"""Each notebook's smoke run, once per test session, shared by every test that reads it.

tests/test_notebooks.py runs every notebook through the runner at smoke scale (papermill, results
in a temporary directory, an empty model cache of its own). A paper's own test file reads that same
run's files (tables/*.csv, run.json, artifacts, models) through `Saved` instead of starting a whole
run of its own. Such a test takes a fixture parametrised by `reading(<notebook>)`, so its node id
ends in `[smoke-<notebook>]`: conftest's xdist scheduler puts it on the worker that runs that
notebook's tests in test_notebooks.py, where the notebook runs once (the registry is per process)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

from ondevice import REPO_ROOT
from ondevice.report import runner

# as the runner: folders starting with _ or . (the new-paper skeleton, checkpoints) are not experiments
NOTEBOOKS = sorted(
    (p for p in (REPO_ROOT / "notebooks").rglob("*.ipynb") if not p.parent.name.startswith(("_", "."))),
    key=lambda p: p.stem,
)
BY_NAME = {p.stem: p for p in NOTEBOOKS}


class Saved:
    """A saved `record.Result` read back from its files: tables as read from their CSV files, and
    params, notes, headline, data and artifacts as run.json and the JSON files beside it hold them."""

    def __init__(self, out: Path):
        self.out = out
        self.run = json.loads((out / "run.json").read_text())
        for name in ("params", "notes", "headline", "data", "stand_in_data"):
            setattr(self, name, self.run[name])
        self.tables = {name: pd.read_csv(out / "tables" / f"{name}.csv") for name in self.run["tables"]}
        self.artifacts = {name: json.loads((out / name).read_text()) for name in self.run["artifacts"]}

    def params_as(self, cls):
        """The run's parameters as the experiment's `Params`: its preset at the run's scale and seed
        (the runner passes no others), checked against the ones run.json records."""
        params = cls.for_scale(self.params["scale"], self.params["seed"])
        assert json.loads(json.dumps(params.to_dict(), default=str)) == self.params
        return params


@dataclass(frozen=True)
class SmokeRun:
    notebook: Path
    results: Path  # the runner's results folder: the run is in results / "smoke" / notebook.stem
    status: str  # the runner's: complete, skipped or failed
    models: Path  # the model cache the run started empty and filled

    @property
    def out(self) -> Path:
        return self.results / "smoke" / self.notebook.stem

    def saved(self) -> Saved:
        assert self.status == "complete", f"{self.notebook.stem}'s smoke run: {self.status}"
        return Saved(self.out)


class SmokeRuns:
    """The registry: `runs(name)` runs the notebook the first time it is asked for, then returns that run."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory):
        self._tmp, self._runs = tmp_path_factory, {}

    def __call__(self, name: str) -> SmokeRun:
        if name not in self._runs:
            notebook = BY_NAME[name]
            results, models = self._tmp.mktemp(f"results-{name}"), self._tmp.mktemp(f"models-{name}")
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(runner, "RESULTS", results)
                # an empty model cache of its own, so this run trains every global model it uses
                mp.setenv("ONDEVICE_MODEL_CACHE", str(models))
                status = runner.run_notebook(notebook, "smoke", {})
            self._runs[name] = SmokeRun(notebook, results, status, models)
        return self._runs[name]


def reading(*names: str) -> list:
    """Parameters of a fixture (or an indirect parametrisation) that reads these notebooks' smoke
    runs: ids `smoke-<notebook>`, so conftest's scheduler puts each test on its notebook's worker;
    marked `notebook`, as test_notebooks' tests, since the first to ask runs the notebook."""
    return [pytest.param(name, id=f"smoke-{name}", marks=pytest.mark.notebook) for name in names]


def notebook_of(nodeid: str) -> str | None:
    """The notebook whose smoke run a test reads: test_notebooks.py's tests end in `[<notebook>]`,
    the paper files' in `[smoke-<notebook>]` (`reading`); other ids that end in a notebook's name
    (test_structure's, say) run no notebook."""
    if not nodeid.endswith("]"):
        return None
    param = nodeid.rsplit("[", 1)[1][:-1]
    if nodeid.startswith("tests/test_notebooks.py::") and param in BY_NAME:
        return param
    name = param.removeprefix("smoke-")
    return name if param.startswith("smoke-") and name in BY_NAME else None
