"""The import graph of lib/ondevice: no paper imports another paper (what two papers share lives in a
shared package), and neither modules nor packages import each other in a circle. Every import
counts, also one inside a function: it runs when the function does, and it ties the two modules'
code together all the same (a result's fingerprint and a cached model's key follow it). Static
checks with ast: nothing is imported or executed."""

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIB = ROOT / "lib"


def modules(lib: Path) -> dict[str, Path]:
    """Dotted name -> file of every module under `lib` (a package by its __init__.py)."""
    out = {}
    for path in sorted(lib.rglob("*.py")):
        parts = path.relative_to(lib).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of `known` that module `name` imports anywhere in its file, relative imports
    resolved; `from a import b` is a.b when that is a module, else a."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            found |= {f"{module}.{a.name}" if f"{module}.{a.name}" in known else module for a in node.names}
    return {m for m in found if m in known and m != name}


def graph(lib: Path) -> dict[str, set[str]]:
    known = modules(lib)
    return {name: imports(name, path, known) for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected parts of more than one node (Tarjan), each a set of nodes."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                part.add(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(frozenset(part))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def package_of(module: str) -> str:
    """The unit a package circle is counted in: ondevice.<package> (ondevice.papers.<paper> for a
    paper); a top-level module (ondevice.params) is its own unit."""
    parts = module.split(".")
    return ".".join(parts[:3] if len(parts) > 2 and parts[1] == "papers" else parts[:2])


def package_graph(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for a, targets in edges.items():
        out.setdefault(package_of(a), set()).update(package_of(b) for b in targets if package_of(b) != package_of(a))
    return out


def paper_crossings(edges: dict[str, set[str]]) -> list[str]:
    """`a -> b` for every import of one paper's module by another paper's."""
    paper = lambda m: m.split(".")[2] if m.startswith("ondevice.papers.") and m.count(".") >= 2 else None  # noqa: E731
    return sorted(f"{a} -> {b}" for a, bs in edges.items() for b in bs if paper(a) and paper(b) not in (None, paper(a)))


def describe(part: frozenset[str], edges: dict[str, set[str]]) -> str:
    return "; ".join(f"{a} -> {sorted(edges[a] & part)}" for a in sorted(part))


# ---- the suite's own code ----------------------------------------------------------------------


GRAPH = graph(LIB)


def test_no_paper_imports_another_paper():
    assert not paper_crossings(GRAPH), "a paper imports another paper; move what both use to a shared package"


def test_no_circle_of_modules():
    found = cycles(GRAPH)
    assert not found, "import circles: " + " | ".join(describe(p, GRAPH) for p in found)


def test_no_circle_of_packages():
    packages = package_graph(GRAPH)
    found = cycles(packages)
    assert not found, "package circles: " + " | ".join(describe(p, packages) for p in found)


# ---- third-party packages ---------------------------------------------------------------------

# Imported only when installed (each names its install command); not in the venv, so not in its metadata.
NOT_INSTALLED = {"pynvml": "nvidia-ml-py", "zeus": "zeus", "ray": "ray"}


def third_party(lib: Path) -> dict[str, set[str]]:
    """Top-level module -> files under `lib` that import it, for modules outside the standard
    library and `ondevice`."""
    found: dict[str, set[str]] = {}
    for path in sorted(lib.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else []
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != "ondevice":
                    found.setdefault(top, set()).add(path.relative_to(lib).as_posix())
    return found


def _name(requirement: str) -> str:
    """A requirement's distribution name, normalised (PEP 503)."""
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9_.-]+", requirement.strip())[0]).lower()


def test_pyproject_lists_every_package_lib_imports_and_the_lock_pins_each():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    required = {_name(r) for r in project["dependencies"]}
    optional = {_name(r) for extra in project["optional-dependencies"].values() for r in extra}
    installed = packages_distributions()
    missing = {}
    for module, files in third_party(LIB).items():
        dist = installed[module][0] if module in installed else NOT_INSTALLED.get(module)
        assert dist, f"{module} (imported by {sorted(files)}) is neither installed nor a known optional package"
        if _name(dist) not in required | optional:
            missing[_name(dist)] = sorted(files)
    assert not missing, f"imported by lib/ but not in pyproject.toml's dependencies: {missing}"
    lock = {_name(line) for line in (ROOT / "requirements.lock").read_text().splitlines() if re.match(r"\w", line)}
    assert not required - lock, f"pyproject.toml's dependencies not pinned in requirements.lock: {required - lock}"
    assert {_name(NOT_INSTALLED[m]) for m in NOT_INSTALLED} <= optional


# ---- the checks themselves can fail --------------------------------------------------------------


def _lib(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, source in files.items():
        path = tmp_path / "ondevice" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return tmp_path


def test_a_paper_importing_another_is_found_relative_or_absolute_or_in_a_function(tmp_path):
    lib = _lib(
        tmp_path,
        {
            "__init__.py": "",
            "papers/__init__.py": "",
            "papers/a/__init__.py": "",
            "papers/a/x.py": "def f():\n    from ...papers.b import y\n",
            "papers/a/z.py": "import ondevice.papers.b.y\nfrom . import x\n",
            "papers/b/__init__.py": "",
            "papers/b/y.py": "from ondevice.training import t\n",
            "training/__init__.py": "",
            "training/t.py": "",
        },
    )
    crossings = paper_crossings(graph(lib))
    assert crossings == ["ondevice.papers.a.x -> ondevice.papers.b.y", "ondevice.papers.a.z -> ondevice.papers.b.y"]


def test_a_circle_is_found_through_a_function_level_import_and_between_packages(tmp_path):
    lib = _lib(
        tmp_path,
        {
            "__init__.py": "",
            "engine/__init__.py": "",
            "engine/resume.py": "from ondevice.report.record import write\n",
            "report/__init__.py": "",
            "report/record.py": "",
            "report/at_once.py": "from ..engine import resume\n",
            "device/__init__.py": "",
            "device/a.py": "from . import b\n",
            "device/b.py": "def g():\n    from ondevice.device import a\n",
        },
    )
    edges = graph(lib)
    assert cycles(edges) == [frozenset({"ondevice.device.a", "ondevice.device.b"})]
    assert cycles(package_graph(edges)) == [frozenset({"ondevice.engine", "ondevice.report"})]


def test_the_package_scan_sees_imports_inside_functions_and_leaves_out_the_standard_library(tmp_path):
    lib = _lib(tmp_path, {"a.py": "import os\nimport numpy as np\ndef f():\n    from sklearn.cluster import KMeans\n"})
    assert set(third_party(lib)) == {"numpy", "sklearn"}
    assert _name("scikit_learn>=1.0") == "scikit-learn" and _name("PyYAML") == "pyyaml"
