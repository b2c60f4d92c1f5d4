"""Provenance: which code, packages and hardware a result came from.

A notebook's results depend on the `ondevice` modules it imports (followed transitively), the data
manifests those modules name, and the pinned environment; `code_files` finds exactly those, so
work on one paper's modules does not mark another paper's results out of date.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Iterable

from ondevice import REPO_ROOT

PACKAGES = (
    "tensorflow",
    "tf-keras",
    "tensorflow-model-optimization",
    "numpy",
    "pandas",
    "seaborn",
    "papermill",
    "ondevice",
)
PACKAGE = "ondevice"
ENVIRONMENT_FILES = ("requirements.lock", "pyproject.toml")
# A paper's smoke presets (`papers/<paper>/smoke_presets.py`): values an experiment reads only at smoke
# scale, whose results are never committed. They are code of smoke results alone, so a smoke run is
# trimmed there without making a default or paper result stale (tests/test_structure.py checks that only
# a "smoke" preset entry reads them).
SMOKE_PRESETS = "smoke_presets"
# Everything that can make results; the dirty flag falls back to it when the notebook is unknown.
CODE_PATHS = ("lib", "notebooks", "data_manifests", *ENVIRONMENT_FILES)
# Code that does not measure, outside every result's code fingerprint, so a change to it makes no
# result stale and re-runs nothing: the judging (the pages re-judge every stored measurement at
# publish with report/judge.py; claims.py holds the paper's numbers and the rules; pages/cells.py
# formats their text), provenance (it describes a run), and where a job runs (the Dask transport:
# test_engine and test_engine_cluster check that it gives the sequential engine's rows exactly).
NOT_MEASURING = (
    "ondevice.report.claims",
    "ondevice.report.curves",
    "ondevice.report.judge",
    "ondevice.report.pages.cells",
    "ondevice.report.provenance",
    "ondevice.engine.dask_backend",
    "ondevice.engine.cluster",
    "ondevice.engine.process",
)
# CPU features that decide which kernels oneDNN runs, and so the low bits of every result.
ONEDNN_CPU_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)


def _imported_modules(tree: ast.AST, package: str | None) -> set[str]:
    """Dotted names an ast imports; for `from a import b` both a and a.b (b may be a submodule).
    `package` resolves relative imports (None: there are none, as in a notebook)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".") if package else []
                if node.level > len(parts):
                    continue
                base = ".".join(parts[: len(parts) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names if alias.name != "*")
    return {n for n in names if n == PACKAGE or n.startswith(PACKAGE + ".")}


def _module_file(lib: Path, module: str) -> Path | None:
    base = lib.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _walk(modules: Iterable[str], lib: Path, scale: str = "default") -> tuple[list[Path], set[str]]:
    """The files of these modules, their parent packages and everything they import, and the
    string literals in them (to find the data manifests they name); smoke presets at smoke only."""
    files, strings, todo = {}, set(), list(modules)
    while todo:
        parts = todo.pop().split(".")
        for i in range(1, len(parts) + 1):  # importing a.b.c runs a/__init__.py and a/b/__init__.py too
            module = ".".join(parts[:i])
            if module in NOT_MEASURING or (parts[i - 1] == SMOKE_PRESETS and scale != "smoke"):
                continue
            path = _module_file(lib, module)
            if path is None or path in files:
                continue
            files[path] = module
            tree = ast.parse(path.read_bytes(), str(path))
            package = module if path.name == "__init__.py" else module.rpartition(".")[0]
            todo.extend(_imported_modules(tree, package))
            strings |= _strings(tree)
    return sorted(files), strings


def _strings(tree: ast.AST) -> set[str]:
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def _notebook_trees(notebook: Path) -> list[ast.AST]:
    """The notebook's code cells as ast, without IPython magics and shell lines."""
    trees = []
    for cell in json.loads(notebook.read_text(encoding="utf-8")).get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else source
        lines = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]
        try:
            trees.append(ast.parse("\n".join(lines)))
        except SyntaxError:
            continue  # a cell that does not parse cannot import anything either
    return trees


def module_files(module: str, root: Path = REPO_ROOT) -> list[Path]:
    """Source files of an `ondevice` module and of the `ondevice` modules it imports, transitively."""
    return _walk([module], root / "lib")[0]


def code_files(notebook: Path, root: Path = REPO_ROOT, scale: str = "default") -> list[Path]:
    """Every file besides the notebook that its results at `scale` depend on: the `ondevice` modules
    it imports (transitively, with their packages' __init__.py; smoke presets at smoke only),
    data_manifests/<name>.yaml for each manifest named by a string literal in them, and the pinned
    environment. `root` is the repository root (tests pass a fake one)."""
    trees = _notebook_trees(notebook)
    imported = set().union(*(_imported_modules(t, None) for t in trees))
    files, strings = _walk(sorted(imported), root / "lib", scale)
    strings |= set().union(*(_strings(t) for t in trees))
    manifests = [m for m in sorted((root / "data_manifests").glob("*.yaml")) if m.stem in strings]
    return files + manifests + [root / f for f in ENVIRONMENT_FILES if (root / f).is_file()]


def fingerprint(notebook: Path, root: Path = REPO_ROOT, scale: str = "default") -> str:
    """Hash of the notebook and its code_files at `scale` (relative path and bytes): equal
    fingerprints mean the same code made the results."""
    notebook = Path(notebook).resolve()
    digest = hashlib.sha256()
    for path in [notebook, *code_files(notebook, root, scale)]:
        name = path.relative_to(root) if path.is_relative_to(root) else Path(path.name)
        data = path.read_bytes()
        digest.update(f"{name.as_posix()}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


RUN_GIT = "ONDEVICE_RUN_GIT"  # the git state a runner started a notebook at (JSON), set by report.runner


def git_state(paths: Iterable[str | Path] | None = None) -> dict:
    """The commit, and whether `paths` (default CODE_PATHS) have uncommitted changes. Inside a run the
    runner started (RUN_GIT set), the commit is the one the run started at, the code it imported,
    and `paths` count as dirty also when a commit made during the run changed them."""

    def git(*args):
        try:
            out = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True)
        except OSError:
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    specs = []
    for p in CODE_PATHS if paths is None else paths:
        p = Path(p)
        if not p.is_absolute():
            specs.append(p.as_posix())
        elif p.is_relative_to(REPO_ROOT):
            specs.append(p.relative_to(REPO_ROOT).as_posix())
    commit = git("rev-parse", "HEAD")
    # no pathspec would mean the whole tree, so paths all outside the repository give "unknown"
    status = git("status", "--porcelain", "--", *specs) if specs else None
    dirty = bool(status) if status is not None else None
    try:
        started = json.loads(os.environ.get(RUN_GIT) or "{}")
    except ValueError:
        started = {}
    first = started.get("commit") if isinstance(started, dict) else None
    if first and commit and specs:
        if first != commit:  # committed during the run: the run's code is the first commit's, if these paths agree
            changed = git("diff", "--name-only", first, commit, "--", *specs)
            dirty = None if changed is None or dirty is None else dirty or bool(changed)
            commit = first
        dirty = None if dirty is None else dirty or bool(started.get("dirty"))
    return {"commit": commit, "dirty": dirty}


def cpu_info(text: str) -> dict:
    """Model name and oneDNN-relevant flags from the text of /proc/cpuinfo (first processor)."""
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    flags = set(fields.get("flags", "").split())
    return {"model": fields.get("model name"), "flags": [f for f in ONEDNN_CPU_FLAGS if f in flags]}


def onednn_enabled() -> bool | None:
    """Whether TensorFlow uses oneDNN: TF_ENABLE_ONEDNN_OPTS if set, else TF's default (on for
    x86 Linux); None where the default is not known to us."""
    value = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
    if value is not None:
        return value.strip().lower() in ("1", "true")
    if sys.platform.startswith("linux") and platform.machine().lower() in ("x86_64", "amd64"):
        return True
    return None


def determinism() -> dict:
    """What decides whether a re-run can match bit for bit: the CPU and whether oneDNN is on."""
    try:
        cpu = cpu_info(Path("/proc/cpuinfo").read_text())
    except OSError:
        cpu = {"model": platform.processor() or None, "flags": []}
    return {
        "cpu": cpu["model"],
        "cpu_flags": cpu["flags"],
        "onednn": onednn_enabled(),
        "TF_ENABLE_ONEDNN_OPTS": os.environ.get("TF_ENABLE_ONEDNN_OPTS"),
        "note": "bit-exact results only on the same machine: oneDNN picks ISA-specific kernels",
    }


def environment(experiment: str | None = None) -> dict:
    """Where a result came from: code version, package versions and hardware. With the experiment
    (the notebook's name), the dirty flag covers only the code that notebook uses."""
    import tensorflow as tf

    notebook = next((REPO_ROOT / "notebooks").rglob(f"{experiment}.ipynb"), None) if experiment else None
    paths = [notebook, *code_files(notebook)] if notebook and notebook.is_file() else None
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    info = determinism()
    return {
        "git": git_state(paths),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": versions,
        "cpu": info["cpu"] or platform.processor(),
        "cpu_count": os.cpu_count(),
        "gpus": [d.name for d in tf.config.list_physical_devices("GPU")],
        "determinism": info,
    }


def notebook_of(experiment: str, root: Path = REPO_ROOT) -> Path | None:
    """notebooks/<paper>/<experiment>.ipynb, or None."""
    return next((root / "notebooks").rglob(f"{experiment}.ipynb"), None)


def changed_since(git: dict, experiment: str, root: Path = REPO_ROOT) -> dict:
    """Whether the code that measures a result has changed since the run that made it: its notebook
    and code_files (judging code excluded) diffed from the run's commit to the working tree. Returns
    {"stale": True/False/None, "files": [{"path", "added", "removed"}], "why": text}; None when git
    cannot tell (no commit recorded, a commit this clone lacks, or a run from uncommitted code)."""
    commit = (git or {}).get("commit")
    notebook = notebook_of(experiment, root)
    if notebook is None:
        return {"stale": None, "files": [], "why": f"no notebook named {experiment}"}
    if not commit:
        return {"stale": None, "files": [], "why": "the run recorded no commit"}
    if (git or {}).get("dirty"):
        return {"stale": None, "files": [], "why": f"the run was made from uncommitted changes on {commit[:12]}"}
    paths = [p.relative_to(root).as_posix() for p in [notebook, *code_files(notebook, root)] if p.is_relative_to(root)]
    try:
        out = subprocess.run(
            ["git", "diff", "--numstat", commit, "--", *paths], cwd=root, capture_output=True, text=True
        )
    except OSError:
        return {"stale": None, "files": [], "why": "git is not available"}
    if out.returncode != 0:
        return {"stale": None, "files": [], "why": f"this clone lacks the run's commit {commit[:12]}"}
    files = []
    for line in out.stdout.splitlines():
        added, removed, path = line.split("\t", 2)
        files.append(
            {
                "path": path,
                "added": int(added) if added.isdigit() else 0,
                "removed": int(removed) if removed.isdigit() else 0,
            }
        )
    return {"stale": bool(files), "files": files, "why": f"measuring code diffed from {commit[:12]}"}
