"""Every notebook in notebooks/ runs under papermill at smoke scale, through the same runner as
`make reproduce`, and leaves complete, sane, reproducible results."""
import json
import math
import re
from pathlib import Path

import nbformat
import numpy as np
import pandas as pd
import pytest
from pytest_notebook.nb_regression import NBRegressionFixture
from pytest_notebook.post_processors import coalesce_streams

from ondevice import REPO_ROOT
from ondevice.results import runner as reproduce

NOTEBOOKS = sorted((REPO_ROOT / "notebooks").glob("*.ipynb"))
TIMING = re.compile(r"second|time", re.I)

pytestmark = pytest.mark.notebook


def deeptype_sanity(out: Path) -> None:
    users = pd.read_csv(out / "tables" / "users.csv")
    for col in ("top_k_eff_global", "top_k_eff_personalized"):
        assert users[col].between(0, 1).all(), col
    for col in ("perplexity_global", "perplexity_personalized"):
        assert (users[col] > 1).all(), col
    assert (users.train_words > users.test_words).all()


def energy_sanity(out: Path) -> None:
    energy = pd.read_csv(out / "tables" / "energy.csv")
    assert set(energy.label) <= {"measured", "modelled"} and (energy.energy_j > 0).all()
    assert (energy.label[energy.meter == "modelled"] == "modelled").all()
    base = energy[(energy.variant == "full") & (energy.governor == "default")]
    assert np.allclose(base.energy_norm, 1.0)
    assert pd.read_csv(out / "tables" / "summary.csv").label.notna().all()
    notes = json.loads((out / "run.json").read_text())["notes"]
    assert notes["primary_label"] in ("measured", "modelled")
    assert all(s.get("restored", True) for s in notes["cpufreq"]["settings"])
    acc = pd.read_csv(out / "tables" / "accuracy.csv")
    assert acc.drop(columns=["seed", "user"]).stack().between(0, 1).all()


# Checks that only make sense for one experiment; every notebook also gets the generic ones.
SANITY = {"deeptype_top3eff": deeptype_sanity, "energy_governors": energy_sanity}


@pytest.fixture(scope="module", params=NOTEBOOKS, ids=[n.stem for n in NOTEBOOKS])
def smoke_run(request, tmp_path_factory, smoke_data):
    results = tmp_path_factory.mktemp("results")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(reproduce, "RESULTS", results)
        # an empty model cache of its own: what this run prints (training or not) must not depend
        # on which notebooks ran before it; the determinism re-run starts from an empty one too
        mp.setenv("ONDEVICE_MODEL_CACHE", str(tmp_path_factory.mktemp("models")))
        status = reproduce.run_notebook(request.param, "smoke", {})
    return request.param, results, status


def test_committed_notebook_is_parameterised_and_has_no_outputs():
    assert NOTEBOOKS, "no notebooks found"
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        first_code = next(c for c in nb.cells if c.cell_type == "code")
        assert "parameters" in first_code.metadata.get("tags", []), path.name
        assert "scale" in first_code.source and "out_dir" in first_code.source, path.name
        assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), path.name


def test_smoke_run_writes_complete_results(smoke_run):
    notebook, results, status = smoke_run
    assert status == "complete"
    out = results / "smoke" / notebook.stem
    assert (out / f"{notebook.stem}.ipynb").is_file() and (out / f"{notebook.stem}.html").stat().st_size > 10_000
    run = json.loads((out / "run.json").read_text())
    assert run["notebook"]["status"] == "complete" and run["scale"] == "smoke"
    assert run["environment"]["packages"]["tensorflow"] == "2.19.1"
    assert all(d["artifacts"] and all(len(a["sha256"]) == 64 for a in d["artifacts"]) for d in run["data"])
    if any(d["stand_in_for"] for d in run["data"]):
        assert run["stand_in_data"], "stand-in data must be labelled in run.json"
    tables = {p.stem: pd.read_csv(p) for p in (out / "tables").glob("*.csv")}
    assert tables and all(len(t) for t in tables.values())
    assert set(run["tables"]) == set(tables)
    comparison = tables["paper_vs_ours"]
    assert {"paper", "ours"} <= set(comparison.columns) and all(map(math.isfinite, comparison.ours))
    effects = tables["effects"]
    assert set(effects.verdict) <= {"holds", "does not hold", "within noise"}
    assert (effects["ci low"] <= effects["our change"]).all() and (effects["our change"] <= effects["ci high"]).all()
    assert run["headline"] and all(math.isfinite(h["value"]) for h in run["headline"].values())
    for name in run.get("artifacts", []):
        assert json.loads((out / name).read_text())
    for name in run["figures"]:
        assert (out / "figures" / f"{name}.png").stat().st_size > 1000
        assert (out / "figures" / f"{name}.svg").is_file()
    executed = nbformat.read(out / f"{notebook.stem}.ipynb", as_version=4)
    text = json.dumps([c.get("outputs", []) for c in executed.cells])
    assert "stand-in data" in text.lower() or not run["stand_in_data"]
    SANITY.get(notebook.stem, lambda out: None)(out)


def test_rerun_with_same_code_and_parameters_is_skipped(smoke_run):
    notebook, results, _ = smoke_run
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(reproduce, "RESULTS", results)
        assert reproduce.run_notebook(notebook, "smoke", {}) == "skipped"


def test_same_seed_gives_the_same_outputs_and_tables(smoke_run, tmp_path, monkeypatch):
    """Re-execute the executed notebook with pytest-notebook and diff it against the first run."""
    notebook, results, _ = smoke_run
    out = results / "smoke" / notebook.stem
    executed = nbformat.read(out / f"{notebook.stem}.ipynb", as_version=4)
    rerun_dir = tmp_path / "rerun"
    for cell in executed.cells:
        if "injected-parameters" in cell.metadata.get("tags", []):
            cell.source = re.sub(r'out_dir = ".*"', f'out_dir = "{rerun_dir}"', cell.source)
    executed, _ = coalesce_streams(executed, {})  # as the fixture does to the new run
    path = tmp_path / notebook.name
    nbformat.write(executed, path)
    text = ("/cells/*/outputs/*/text", "/cells/*/outputs/*/data/text/plain")
    volatile = [
        r"(?m)^.*(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d|[EWI]0000 |absl::InitializeLog).*\n?",  # TF start-up logs
        r"\(\d+\.\d+ steps/s\)", r"\d+\.\ds\)", r"written to \S+", r"(?m)^\[model cache\].*\n?",
    ]
    # a fresh model cache, so the re-run trains (and prints) exactly what the first run did
    monkeypatch.setenv("ONDEVICE_MODEL_CACHE", str(tmp_path / "models"))
    fixture = NBRegressionFixture(
        exec_timeout=900, exec_cwd=str(REPO_ROOT / "notebooks"),
        diff_ignore=("/metadata", "/cells/*/metadata", "/cells/*/execution_count",
                     "/cells/*/outputs/*/data/image/png", "/cells/*/outputs/*/data/image/svg+xml"),
        diff_replace=tuple((p, rx, "") for p in text for rx in volatile),
    )
    fixture.check(str(path))
    for first in (out / "tables").glob("*.csv"):
        a, b = pd.read_csv(first), pd.read_csv(rerun_dir / "tables" / first.name)
        keep = [c for c in a.columns if not TIMING.search(c)]
        pd.testing.assert_frame_equal(a[keep], b[keep], check_exact=True)


def test_bad_parameter_fails_clearly_and_keeps_the_previous_result(smoke_run):
    notebook, results, _ = smoke_run
    out = results / "smoke" / notebook.stem
    before = (out / "run.json").read_bytes()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(reproduce, "RESULTS", results)
        status = reproduce.run_notebook(notebook, "smoke", {"no_such_parameter": 1}, force=True)
    assert status == "failed"
    failed = results / "smoke" / f"{notebook.stem}.failed"
    run = json.loads((failed / "run.json").read_text())
    assert run["notebook"]["status"] == "failed" and "no_such_parameter" in run["notebook"]["error"]
    executed = nbformat.read(failed / f"{notebook.stem}.ipynb", as_version=4)
    errors = [o for c in executed.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert errors and "ParameterError" in errors[0]["ename"]
    assert (out / "run.json").read_bytes() == before  # the complete result is untouched
    assert not list((results / "smoke").glob(".staging-*"))
