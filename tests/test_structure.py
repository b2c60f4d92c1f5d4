"""The shape of the code that a newcomer relies on (docs/adding-a-paper.md): shared packages never
import a paper, every paper folder has the same parts, every experiment module has its notebook and
stays short. Static checks: nothing is imported or executed."""

import ast
import json
import re
import tomllib
from pathlib import Path

import pytest

LIB = Path(__file__).resolve().parents[1] / "lib" / "ondevice"
NOTEBOOKS = LIB.parents[1] / "notebooks"
SHARED = ["data", "device", "engine", "models", "report", "tasks", "training", "metrics.py", "params.py", "streams.py"]
PAPERS = sorted(p for p in (LIB / "papers").iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))
EXPERIMENTS = sorted(m for p in PAPERS for m in (p / "experiments").glob("*.py") if m.name != "__init__.py")
MAX_LINES = 300
# Modules still above the limit, each to be split into its paper's protocol/techniques/report (issue
# 21); listed by name so that a new or a shrunk-and-regrown module fails.
OVER_LIMIT: set[str] = set()


def _imported_modules(path: Path, source: str | None = None) -> list[str]:
    """Absolute names of every module `path` (or `source`, as if it were at `path`) imports,
    relative imports resolved."""
    package = ".".join(path.relative_to(LIB.parent).with_suffix("").parts[:-1])
    names = []
    tree = ast.parse(path.read_text(encoding="utf-8") if source is None else source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            names += [module] + [f"{module}.{a.name}" for a in node.names]
    return names


@pytest.mark.parametrize("part", SHARED)
def test_shared_packages_import_nothing_from_papers(part):
    files = [LIB / part] if part.endswith(".py") else sorted((LIB / part).rglob("*.py"))
    assert files
    offenders = {
        f.relative_to(LIB).as_posix(): m for f in files for m in _imported_modules(f) if m.startswith("ondevice.papers")
    }
    assert not offenders, f"shared code imports a paper (dependencies point papers -> shared): {offenders}"


def test_the_import_scan_sees_relative_and_absolute_imports():
    """The scan above can fail: a paper imported from a shared module, either way, is seen."""
    probe = "from ..papers.deeptype import protocol\nimport ondevice.papers.moil\nfrom . import tflite\n"
    names = _imported_modules(LIB / "device" / "probe.py", probe)
    assert {"ondevice.papers.deeptype", "ondevice.papers.deeptype.protocol", "ondevice.papers.moil"} <= set(names)
    assert "ondevice.device.tflite" in names


@pytest.mark.parametrize("paper", PAPERS, ids=[p.name for p in PAPERS])
def test_every_paper_folder_has_the_skeleton_and_facts_name_its_experiments(paper):
    for part in ("__init__.py", "paper.toml", "experiments/__init__.py", "techniques/__init__.py"):
        assert (paper / part).is_file(), f"{paper.name}/ lacks {part}"
    with (paper / "paper.toml").open("rb") as f:
        facts = tomllib.load(f)
    assert {"short", "title", "authors", "venue"} <= set(facts["paper"]), f"{paper.name}/paper.toml [paper]"
    modules = {m.stem for m in (paper / "experiments").glob("*.py")} - {"__init__"}
    tools = {m.stem for m in paper.glob("*.py")}  # e.g. a benchmark beside the experiments (scaleout_bench)
    assert set(facts) - {"paper"} <= modules | tools, f"{paper.name}/paper.toml: sections that name no module"
    notebooks = {n.stem for n in (NOTEBOOKS / paper.name).glob("*.ipynb")}
    assert modules == notebooks, f"{paper.name}: experiment modules {sorted(modules)} vs notebooks {sorted(notebooks)}"


@pytest.mark.parametrize("module", EXPERIMENTS, ids=[m.stem for m in EXPERIMENTS])
def test_experiment_modules_stay_short(module):
    lines = len(module.read_text(encoding="utf-8").splitlines())
    if module.stem in OVER_LIMIT:
        assert lines > MAX_LINES, f"{module.stem} is down to {lines} lines: take it off OVER_LIMIT"
        pytest.xfail(f"{module.stem}: {lines} lines, still to be split (issue 21)")
    assert lines <= MAX_LINES, f"{module.relative_to(LIB)}: {lines} lines (at most {MAX_LINES})"


NOTEBOOK_FILES = sorted(n for n in NOTEBOOKS.rglob("*.ipynb") if not n.parent.name.startswith("_"))
TIME_TABLE = re.compile(r"tim|bench|laten|energ")  # timing_effects, phone_times, benchmark, latency, energy


@pytest.mark.parametrize("notebook", NOTEBOOK_FILES, ids=[n.stem for n in NOTEBOOK_FILES])
def test_notebooks_that_publish_time_run_alone(notebook):
    """`make reproduce` runs notebooks two at a time, except those marked `measures_time`
    (report/at_once.py): the mark is there exactly when the published results have a table of
    times, step-time benchmarks or energy built on them."""
    tables = LIB.parents[1] / "results" / "default" / notebook.stem / "tables"
    if not tables.is_dir():
        pytest.skip(f"no default results for {notebook.stem}")
    timed = sorted(t.name for t in tables.glob("*.csv") if TIME_TABLE.search(t.stem))
    meta = json.loads(notebook.read_text(encoding="utf-8"))["metadata"]
    marked = meta.get("ondevice", {}).get("measures_time", False)
    assert marked == bool(timed), f"{notebook.stem}: measures_time={marked}, time tables {timed}"


SMOKE_PRESETS = sorted(LIB.glob("papers/*/smoke_presets.py"))


def _readers(module: str) -> list[Path]:
    return [m for m in LIB.rglob("*.py") if module in _imported_modules(m)]


@pytest.mark.parametrize("presets", SMOKE_PRESETS, ids=lambda p: p.parent.name)
def test_smoke_presets_hold_values_only_and_only_a_smoke_entry_reads_them(presets):
    """`report.provenance.SMOKE_PRESETS` leaves these modules out of every default and paper result's
    code: sound only while they import nothing and every use of them is a "smoke" preset entry."""
    tree = ast.parse(presets.read_text(encoding="utf-8"))
    assert not [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))], presets
    module = ".".join(presets.relative_to(LIB.parent).with_suffix("").parts)
    readers = _readers(module)
    assert readers, f"{module} is read by no experiment"
    for reader in readers:
        tree = ast.parse(reader.read_text(encoding="utf-8"))
        imports = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and module in _imported_modules(reader)]
        names = {a.asname or a.name for n in imports for a in n.names if a.name == "smoke_presets"}
        assert names, f"{reader.name}: import the module itself (from ... import smoke_presets), not its names"
        in_smoke = {
            id(node)
            for d in ast.walk(tree)
            if isinstance(d, ast.Dict)
            for k, v in zip(d.keys, d.values)
            if isinstance(k, ast.Constant) and k.value == "smoke"
            for node in ast.walk(v)
        }
        uses = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id in names]
        assert uses and all(id(n) in in_smoke for n in uses), f"{reader.name} reads {module} outside a smoke entry"
