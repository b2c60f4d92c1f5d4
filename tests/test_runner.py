"""The runner behind `make reproduce`/`make verify` and the provenance it records: what is skipped,
how numbers are compared with the published ones, and which files a notebook's results depend on."""

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import nbformat
import pytest

from ondevice import REPO_ROOT
from ondevice.report import provenance, runner


def headline(value, tolerance=None, resolution=0.0):
    return {"value": value, "per_seed": [value], "tolerance": tolerance, "resolution": resolution}


def has_git() -> bool:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True).returncode == 0
    except OSError:
        return False


# --- published vs this run ---------------------------------------------------------------------


def test_compare_headlines_verdicts():
    published = {
        "headline": {
            "top3": headline(0.50, 0.01),
            "far": headline(0.50, 0.01),
            "one_seed": headline(0.40),
            "gone": headline(0.30, 0.05),
        }
    }
    this = {
        "headline": {"top3": headline(0.505), "far": headline(0.52), "one_seed": headline(0.41), "extra": headline(1.0)}
    }
    rows = {r["name"]: r for r in runner.compare_headlines(published, this)}
    assert [r for r in rows] == ["top3", "far", "one_seed", "gone", "extra"]
    assert rows["top3"]["verdict"] == "agrees" and rows["top3"]["difference"] == pytest.approx(0.005)
    assert rows["far"]["verdict"] == "DIFFERS"
    assert rows["one_seed"]["verdict"] == "no tolerance" and rows["one_seed"]["tolerance"] is None
    assert rows["gone"]["verdict"] == "MISSING" and rows["gone"]["this"] is None  # this run lacks it
    assert rows["extra"]["verdict"] == "new" and rows["extra"]["published"] is None
    assert runner.differs(list(rows.values()))
    assert not runner.differs([rows["top3"], rows["one_seed"], rows["extra"]])


def test_tolerance_is_never_tighter_than_the_resolution_and_boundaries_agree():
    published = {"headline": {"a": headline(0.5, 0.0, resolution=0.01), "b": headline(0.461, 0.001)}}
    rows = runner.compare_headlines(published, {"headline": {"a": headline(0.51), "b": headline(0.460)}})
    assert [r["verdict"] for r in rows] == ["agrees", "agrees"]  # 0.461 - 0.460 is 0.0010000000000000009


def test_no_published_headline_gives_no_rows():
    assert runner.compare_headlines({}, {"headline": {}}) == []
    assert runner.compare_headlines({"headline": {}}, {}) == []


def test_table_and_summary_name_what_differs():
    rows = runner.compare_headlines(
        {"headline": {"top-3-eff": headline(0.5, 0.01)}}, {"headline": {"top-3-eff": headline(0.6)}}
    )
    table = runner.format_rows(rows)
    assert "published" in table and "this run" in table and "|difference|" in table and "DIFFERS" in table
    text = runner.summary({"nb_a": rows, "nb_b": None}, verify=False)
    assert "DIFFER" in text and "nb_a" in text and "make verify would fail" in text
    assert "nothing published" in text and "nb_b" in text


@pytest.mark.skipif(not has_git(), reason="needs a git checkout")
def test_published_is_the_run_json_at_git_head():
    final = REPO_ROOT / "results" / "default" / "deeptype_top3eff"
    committed = (
        subprocess.run(
            ["git", "cat-file", "-e", "HEAD:results/default/deeptype_top3eff/run.json"], cwd=REPO_ROOT
        ).returncode
        == 0
    )
    if not committed:
        pytest.skip("no committed default result")
    published, source = runner.published_run(final, replaced={"headline": {}})
    assert source == "git HEAD" and published["experiment"] == "deeptype_top3eff"


def test_published_falls_back_to_the_replaced_result_outside_git(tmp_path):
    assert runner.published_run(tmp_path / "nb", replaced={"x": 1}) == (
        {"x": 1},
        "the result this run replaced (not committed)",
    )
    assert runner.published_run(tmp_path / "nb", replaced=None) == (None, "")


@pytest.fixture
def fake_runs(tmp_path, monkeypatch):
    """main() over one notebook whose 'run' writes a run.json with the given headline."""
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    (notebooks / "nb.ipynb").write_text("{}")
    monkeypatch.setattr(runner, "RESULTS", tmp_path / "results")
    final = tmp_path / "results" / "smoke" / "nb"

    def publish(value):
        final.mkdir(parents=True, exist_ok=True)
        (final / "run.json").write_text(json.dumps({"headline": {"top3": headline(value, 0.01)}}))

    def main(value, *flags):
        def run_notebook(notebook, scale, params, force=False):
            final.mkdir(parents=True, exist_ok=True)
            (final / "run.json").write_text(json.dumps({"headline": {"top3": headline(value)}}))
            return "complete"

        monkeypatch.setattr(runner, "run_notebook", run_notebook)
        return runner.main(["--scale", "smoke", "--notebooks-dir", str(notebooks), *flags])

    return publish, main


def test_reproduce_reports_differences_but_verify_fails_on_them(fake_runs, capsys):
    publish, main = fake_runs
    publish(0.50)
    assert main(0.60) == 0
    out = capsys.readouterr().out
    assert "published vs this run" in out and "DIFFERS" in out and "NUMBERS DIFFER" in out and "nb" in out
    publish(0.50)
    assert main(0.60, "--verify") == runner.EXIT_DIFFERS
    publish(0.50)
    assert main(0.505, "--verify") == 0
    assert "agree" in capsys.readouterr().out


def test_nothing_published_is_said_and_verify_passes(fake_runs, capsys):
    _, main = fake_runs
    assert main(0.5, "--verify") == 0
    assert "nothing published for this scale" in capsys.readouterr().out


# --- completion marker: only results this checkout produced are skipped --------------------------


def tiny_notebook(path: Path, body: str, params: str = "", **metadata) -> None:
    """A notebook on the suite's kernel: a `parameters` cell (scale, out_dir and `params`), then `body`."""
    cell = nbformat.v4.new_code_cell('scale = "smoke"\nout_dir = ""' + (f"\n{params}" if params else ""))
    cell.metadata["tags"] = ["parameters"]
    nb = nbformat.v4.new_notebook(cells=[cell, nbformat.v4.new_code_cell(body)])
    nb.metadata["kernelspec"] = {"name": runner.KERNEL, "display_name": "Python (ondevice)", "language": "python"}
    nb.metadata.update(metadata)
    nbformat.write(nb, path)


def writing_notebook(path: Path, value: float) -> None:
    """A notebook that writes a run.json as result.save would, without the experiment code."""
    run = {"experiment": "tiny", "headline": {"x": headline(value)}}
    tiny_notebook(path, f"import json, pathlib\npathlib.Path(out_dir, 'run.json').write_text(json.dumps({run!r}))")


def test_only_results_this_checkout_completed_are_skipped(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "RESULTS", tmp_path / "results")
    notebook = tmp_path / "tiny.ipynb"
    writing_notebook(notebook, 0.5)
    final = tmp_path / "results" / "smoke" / "tiny"

    assert runner.run_notebook(notebook, "smoke", {}) == "complete"
    marker = json.loads((final / runner.MARKER).read_text())
    run = json.loads((final / "run.json").read_text())
    assert marker["key"] == run["notebook"]["key"] and run["notebook"]["status"] == "complete"
    assert (final / "tiny.html").is_file() and not list(final.parent.glob(".staging-*"))
    assert runner.run_notebook(notebook, "smoke", {}) == "skipped"

    # A fresh clone has the committed run.json, with the same key, but never the marker: it re-runs.
    (final / runner.MARKER).unlink()
    assert not runner.is_up_to_date(final, run["notebook"]["key"])
    assert runner.run_notebook(notebook, "smoke", {}) == "complete"
    assert runner.run_notebook(notebook, "smoke", {"value": 1}) == "complete"  # other parameters


def test_finished_jobs_survive_a_failed_run_and_go_with_a_completed_one(tmp_path, monkeypatch):
    """The kernel gets a jobs directory outside staging: what a failed run stored there is seen
    by the next run, and a completed run removes it."""
    monkeypatch.setattr(runner, "RESULTS", tmp_path / "results")
    body = (
        "import json, os, pathlib\n"
        "jobs = pathlib.Path(os.environ['ONDEVICE_JOBS_DIR'])\n"
        "jobs.mkdir(parents=True, exist_ok=True)\n"
        "resumed = (jobs / 'user-1.pkl').is_file()\n"
        "(jobs / 'user-1.pkl').write_text('finished')\n"
        "assert not fail, 'stopped after user 1'\n"
        "pathlib.Path(out_dir, 'run.json').write_text(json.dumps({'experiment': 'jobs', 'resumed': resumed}))"
    )
    notebook = tmp_path / "jobs.ipynb"
    tiny_notebook(notebook, body, params="fail = False")
    jobs = tmp_path / "results" / "smoke" / runner.JOBS / "jobs"

    assert runner.run_notebook(notebook, "smoke", {"fail": True}) == "failed"
    assert (jobs / "user-1.pkl").is_file()
    assert runner.run_notebook(notebook, "smoke", {}) == "complete"
    assert json.loads((tmp_path / "results" / "smoke" / "jobs" / "run.json").read_text())["resumed"] is True
    assert not jobs.exists()


@pytest.mark.skipif(not has_git(), reason="needs a git checkout")
def test_completion_marker_is_git_ignored():
    for path in ("results/default/some_notebook/.complete.json", "results/default/.jobs/some_notebook/x.pkl"):
        assert subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=REPO_ROOT).returncode == 0
    assert (
        subprocess.run(
            ["git", "check-ignore", "-q", "--no-index", "results/default/some_notebook/run.json"], cwd=REPO_ROOT
        ).returncode
        == 1
    )


# --- which files a notebook's results depend on -------------------------------------------------


def test_code_files_of_the_deeptype_notebook():
    notebook = REPO_ROOT / "notebooks" / "deeptype" / "deeptype_top3eff.ipynb"
    files = {p.relative_to(REPO_ROOT).as_posix() for p in provenance.code_files(notebook)}
    assert {
        "lib/ondevice/__init__.py",
        "lib/ondevice/papers/deeptype/experiments/__init__.py",
        "lib/ondevice/papers/deeptype/experiments/deeptype_top3eff.py",
        "lib/ondevice/params.py",
        "data_manifests/shakespeare.yaml",
        "requirements.lock",
        "pyproject.toml",
    } <= files
    assert "lib/ondevice/report/runner.py" not in files and "lib/ondevice/data/__main__.py" not in files
    experiment = REPO_ROOT / "lib" / "ondevice" / "papers" / "deeptype" / "experiments" / "deeptype_top3eff.py"
    assert set(provenance.module_files("ondevice.papers.deeptype.experiments.deeptype_top3eff")) <= set(
        provenance.code_files(notebook)
    )
    assert experiment in provenance.module_files("ondevice.papers.deeptype.experiments.deeptype_top3eff")


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture
def fake_repo(tmp_path):
    """A repository root with a small `ondevice` package, manifests and a notebook."""
    lib = tmp_path / "lib" / "ondevice"
    write(lib / "__init__.py", "")
    write(lib / "a" / "__init__.py", "")
    write(lib / "a" / "used.py", "from ..b import helper\nfrom . import sibling\nfrom .. import pkg\nDATASET = 'toy'\n")
    write(lib / "a" / "sibling.py", "def f():\n    from ondevice.lazy import thing\n")
    write(lib / "b" / "__init__.py", "")
    write(lib / "b" / "helper.py", "from .deep import x\n")
    write(lib / "b" / "deep.py", "x = 1\n")
    write(lib / "pkg" / "__init__.py", "from .inner import *\n")
    write(lib / "pkg" / "inner.py", "")
    write(lib / "lazy.py", "thing = 1\n")
    write(lib / "unrelated" / "__init__.py", "")
    write(lib / "unrelated" / "colla.py", "import numpy\nNAME = 'other'\n")
    write(tmp_path / "data_manifests" / "toy.yaml", "name: toy\n")
    write(tmp_path / "data_manifests" / "other.yaml", "name: other\n")
    write(tmp_path / "requirements.lock", "numpy==1\n")
    write(tmp_path / "pyproject.toml", "[project]\n")
    cells = [nbformat.v4.new_code_cell("%matplotlib inline\n!ls\nimport numpy\nfrom ondevice.a import used")]
    (tmp_path / "notebooks").mkdir()
    nbformat.write(nbformat.v4.new_notebook(cells=cells), tmp_path / "notebooks" / "nb.ipynb")
    return tmp_path


def test_code_files_follow_imports_transitively(fake_repo):
    files = {
        p.relative_to(fake_repo).as_posix()
        for p in provenance.code_files(fake_repo / "notebooks" / "nb.ipynb", fake_repo)
    }
    lib = "lib/ondevice/"
    assert files == {
        lib + f
        for f in (
            "__init__.py",
            "a/__init__.py",
            "a/used.py",
            "a/sibling.py",
            "b/__init__.py",
            "b/helper.py",
            "b/deep.py",
            "pkg/__init__.py",
            "pkg/inner.py",
            "lazy.py",
        )
    } | {"data_manifests/toy.yaml", "requirements.lock", "pyproject.toml"}


def test_smoke_presets_are_code_of_smoke_results_only(fake_repo):
    """A paper's smoke_presets module: in the files and the fingerprint of a smoke run, outside those
    of a default result (the hook's and the pages' staleness read code_files), so trimming a smoke run
    stales no committed result and still re-runs a smoke run that this checkout completed."""
    notebook, lib = fake_repo / "notebooks" / "nb.ipynb", fake_repo / "lib" / "ondevice"
    write(lib / "a" / "smoke_presets.py", "USED = dict(n=1)\n")
    write(lib / "a" / "used.py", (lib / "a" / "used.py").read_text() + "from . import smoke_presets\n")
    default, smoke = (set(provenance.code_files(notebook, fake_repo, scale)) for scale in ("default", "smoke"))
    assert smoke - default == {lib / "a" / "smoke_presets.py"} and lib / "a" / "used.py" in default
    before = {s: provenance.fingerprint(notebook, fake_repo, s) for s in ("default", "smoke", "paper")}
    write(lib / "a" / "smoke_presets.py", "USED = dict(n=2)\n")
    after = {s: provenance.fingerprint(notebook, fake_repo, s) for s in before}
    assert after["default"] == before["default"] and after["paper"] == before["paper"]
    assert after["smoke"] != before["smoke"]


def test_fingerprint_changes_only_with_what_the_notebook_uses(fake_repo):
    notebook = fake_repo / "notebooks" / "nb.ipynb"
    lib = fake_repo / "lib" / "ondevice"
    before = provenance.fingerprint(notebook, fake_repo)
    write(lib / "unrelated" / "colla.py", "NAME = 'changed'\n")
    write(lib / "unrelated" / "new_module.py", "x = 2\n")
    write(fake_repo / "data_manifests" / "other.yaml", "name: other, changed\n")
    assert provenance.fingerprint(notebook, fake_repo) == before
    for changed in (lib / "b" / "deep.py", fake_repo / "data_manifests" / "toy.yaml", fake_repo / "requirements.lock"):
        original = changed.read_text()
        changed.write_text(original + "# changed\n")
        assert provenance.fingerprint(notebook, fake_repo) != before, changed
        changed.write_text(original)
    assert provenance.fingerprint(notebook, fake_repo) == before


# --- git state and the machine ------------------------------------------------------------------


@pytest.mark.skipif(not has_git(), reason="needs a git checkout")
def test_git_state_covers_only_the_given_paths(tmp_path):
    assert provenance.git_state(["lib/ondevice/no_such_module.py"])["dirty"] is False
    assert provenance.git_state([tmp_path / "outside.py"])["dirty"] is None
    untracked = REPO_ROOT / "tests" / "_untracked_by_test_runner.py"
    try:
        untracked.write_text("")
        state = provenance.git_state([untracked])
        assert state["dirty"] is True and len(state["commit"]) == 40
    finally:
        untracked.unlink()


def test_environment_takes_the_dirty_flag_from_the_notebooks_code(monkeypatch):
    seen = []
    monkeypatch.setattr(
        provenance, "git_state", lambda paths=None: seen.append(paths) or {"commit": None, "dirty": None}
    )
    fake_tf = types.SimpleNamespace(config=types.SimpleNamespace(list_physical_devices=lambda kind: []))
    monkeypatch.setitem(sys.modules, "tensorflow", fake_tf)
    env = provenance.environment("deeptype_top3eff")
    notebook = REPO_ROOT / "notebooks" / "deeptype" / "deeptype_top3eff.ipynb"
    assert seen[-1] == [notebook, *provenance.code_files(notebook)]
    provenance.environment("no_such_notebook")
    assert seen[-1] is None  # falls back to CODE_PATHS
    assert {"cpu_flags", "onednn", "note"} <= set(env["determinism"])


def test_cpu_flags_and_onednn(monkeypatch):
    info = provenance.cpu_info(
        "processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu sse4_2 avx avx2 fma avx512f "
        "amx_tile\n\nprocessor\t: 1\nmodel name\t: Other\n"
    )
    assert info == {"model": "Some CPU", "flags": ["sse4_2", "avx", "avx2", "fma", "avx512f", "amx_tile"]}
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")
    assert provenance.onednn_enabled() is False and provenance.determinism()["onednn"] is False
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "1")
    assert provenance.onednn_enabled() is True


# --- notebooks at once ---------------------------------------------------------------------------


def timing_notebook(path: Path, measures_time: bool) -> None:
    """A notebook that sleeps 3 s and records when it ran, in a run.json as result.save would."""
    body = (
        "import json, os, pathlib, time\n"
        "began = time.time()\n"
        "time.sleep(3)\n"
        "ran = {'began': began, 'ended': time.time(), 'threads': os.environ.get('TF_NUM_INTRAOP_THREADS')}\n"
        "pathlib.Path(out_dir, 'run.json').write_text(json.dumps({'experiment': 'tiny', 'ran': ran}))"
    )
    tiny_notebook(path, body, **({"ondevice": {"measures_time": True}} if measures_time else {}))


def test_notebooks_run_at_once_and_those_that_measure_time_run_alone_after(tmp_path, monkeypatch, capsys):
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    for name, timed in (("first", False), ("second", False), ("timed", True)):
        timing_notebook(notebooks / f"{name}.ipynb", timed)
    monkeypatch.setattr(runner, "RESULTS", tmp_path / "results")
    assert runner.main(["--scale", "smoke", "--notebooks-dir", str(notebooks), "--at-once", "2"]) == 0
    out = capsys.readouterr().out
    runs = {n: json.loads((tmp_path / "results" / "smoke" / n / "run.json").read_text()) for n in ("first", "second")}
    runs["timed"] = json.loads((tmp_path / "results" / "smoke" / "timed" / "run.json").read_text())
    first, second, timed = (runs[n]["ran"] for n in ("first", "second", "timed"))
    assert first["began"] < second["ended"] and second["began"] < first["ended"], "the two should overlap"
    assert timed["began"] > max(first["ended"], second["ended"]), "the timed notebook should run alone, after"
    threads = max(1, (os.cpu_count() or 1) // 2)
    assert first["threads"] == second["threads"] == str(threads)  # each child its share of the CPUs
    assert runs["first"]["notebook"]["at_once"] == {"notebooks": 2, "threads": threads}
    assert runs["timed"]["notebook"]["at_once"]["notebooks"] == 1
    assert "[first] [reproduce] first (smoke): running" in out and "3 notebook(s) in" in out
    # run again: each child sees this checkout completed its notebook and says so
    assert runner.main(["--scale", "smoke", "--notebooks-dir", str(notebooks), "--at-once", "2"]) == 0
    out = capsys.readouterr().out
    assert all(f"{name}=skipped" in out for name in ("first", "second", "timed"))


def test_a_failing_notebook_run_beside_another_fails_the_run_and_keeps_the_other(tmp_path, monkeypatch):
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    timing_notebook(notebooks / "good.ipynb", False)
    (notebooks / "bad.ipynb").write_text("not a notebook")
    monkeypatch.setattr(runner, "RESULTS", tmp_path / "results")
    assert runner.main(["--scale", "smoke", "--notebooks-dir", str(notebooks), "--at-once", "2"]) == runner.EXIT_FAILED
    assert (tmp_path / "results" / "smoke" / "good" / "run.json").is_file()


def test_at_once_rejects_less_than_one():
    with pytest.raises(SystemExit):
        runner.main(["--scale", "smoke", "--at-once", "0"])
