"""Execute notebooks with papermill into results/<scale>/<notebook>/, atomically and resumably.

A notebook runs in results/<scale>/.staging-<name>-<pid>/ and is renamed into place only when
its executed copy, HTML and run.json are all written. A complete result for the same code
fingerprint and parameters is skipped (FORCE re-runs it). A failing notebook's executed copy,
with the error, goes to results/<scale>/<name>.failed/ and the command exits non-zero.

    python -m ondevice.reproduce --scale default [--notebook NAME] [--force] [--params JSON]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

from .. import REPO_ROOT
from ..params import SCALES
from .provenance import CODE_PATHS, git_state
from .record import atomic_write

NOTEBOOKS = REPO_ROOT / "notebooks"
RESULTS = Path(os.environ.get("ONDEVICE_RESULTS") or REPO_ROOT / "results")
KERNEL = "ondevice"
CODE_SUFFIXES = {".py", ".yaml"}


def fingerprint(notebook: Path) -> str:
    """Hash of everything a result depends on: the notebook and the code of report.CODE_PATHS."""
    files = [notebook]
    for name in CODE_PATHS:
        path = REPO_ROOT / name
        if path == NOTEBOOKS:
            continue  # other notebooks do not change this one's results
        files += sorted(p for p in path.rglob("*") if p.suffix in CODE_SUFFIXES) if path.is_dir() else [path]
    digest = hashlib.sha256()
    for f in files:
        digest.update(str(f.relative_to(REPO_ROOT)).encode())
        digest.update(f.read_bytes())
    return digest.hexdigest()


def is_up_to_date(final: Path, key: dict) -> bool:
    try:
        run = json.loads((final / "run.json").read_text())
    except (OSError, ValueError):
        return False
    return run.get("notebook", {}).get("status") == "complete" and run["notebook"].get("key") == key


def _remove_stale_staging(scale_dir: Path) -> None:
    for d in scale_dir.glob(".staging-*"):
        pid = d.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(d, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0 only checks; PermissionError means it exists under another user
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _replace_dir(src: Path, dest: Path) -> None:
    old = dest.with_name(f".old-{dest.name}-{os.getpid()}")
    if dest.exists():
        os.replace(dest, old)
    os.replace(src, dest)
    shutil.rmtree(old, ignore_errors=True)


def _html(executed: Path) -> None:
    import nbformat
    from nbconvert import HTMLExporter

    body, _ = HTMLExporter().from_notebook_node(nbformat.read(executed, as_version=4))
    atomic_write(executed.with_suffix(".html"), lambda p: p.write_text(body, encoding="utf-8"))


def run_notebook(notebook: Path, scale: str, params: dict, force: bool = False) -> str:
    """Execute one notebook; returns 'complete', 'skipped' or 'failed'."""
    import papermill

    name = notebook.stem
    scale_dir = RESULTS / scale
    scale_dir.mkdir(parents=True, exist_ok=True)
    _remove_stale_staging(scale_dir)
    final = scale_dir / name
    key = {"fingerprint": fingerprint(notebook), "scale": scale, "params": params}
    if not force and is_up_to_date(final, key):
        print(f"[reproduce] {name} ({scale}): complete results for this code and these parameters exist; "
              f"skipping (FORCE=1 re-runs)", flush=True)
        return "skipped"

    staging = scale_dir / f".staging-{name}-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    executed = staging / f"{name}.ipynb"
    print(f"[reproduce] {name} ({scale}): running", flush=True)
    start, error = time.perf_counter(), None
    try:
        papermill.execute_notebook(
            str(notebook), str(executed), kernel_name=KERNEL, cwd=str(notebook.parent), progress_bar=True,
            stdout_file=sys.stdout,  # the notebook's progress lines (epochs, users) as they happen
            parameters={"scale": scale, "out_dir": str(staging), **params},
        )
        _html(executed)
        if not (staging / "run.json").is_file():
            raise RuntimeError(f"{name} finished without writing run.json (did it call result.save(out_dir)?)")
    except Exception as exc:  # keep the executed copy for inspection, marked failed
        error = exc
        if executed.is_file():
            try:
                _html(executed)
            except Exception:
                pass
    run_path = staging / "run.json"
    run = json.loads(run_path.read_text()) if run_path.is_file() else {"experiment": name, "scale": scale}
    run["notebook"] = {
        "name": name, "status": "failed" if error else "complete", "key": key, "git": git_state(),
        "wall_time_s": round(time.perf_counter() - start, 2), "executed_by": "papermill",
        **({"error": f"{type(error).__name__}: {error}"[:2000]} if error else {}),
    }
    atomic_write(run_path, lambda p: p.write_text(json.dumps(run, indent=2, default=str)))
    if error:
        failed = scale_dir / f"{name}.failed"
        _replace_dir(staging, failed)
        print(f"[reproduce] {name} ({scale}): FAILED, executed copy in {failed}\n{error}", file=sys.stderr, flush=True)
        return "failed"
    shutil.rmtree(scale_dir / f"{name}.failed", ignore_errors=True)
    _replace_dir(staging, final)
    print(f"[reproduce] {name} ({scale}): complete in {run['notebook']['wall_time_s']:.0f}s -> {final}", flush=True)
    return "complete"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", default="default", choices=SCALES)
    ap.add_argument("--notebook", default="", help="run only this notebook (name without .ipynb)")
    ap.add_argument("--force", action="store_true", help="re-run even when complete results exist")
    ap.add_argument("--params", default="{}", help="JSON object of extra papermill parameters")
    ap.add_argument("--notebooks-dir", type=Path, default=NOTEBOOKS)
    args = ap.parse_args(argv)
    try:
        params = json.loads(args.params)
    except ValueError as exc:
        ap.error(f"--params is not valid JSON: {exc}")
    if not isinstance(params, dict):
        ap.error("--params must be a JSON object")
    notebooks = sorted(args.notebooks_dir.glob("*.ipynb"))
    if args.notebook:
        notebooks = [n for n in notebooks if n.stem == args.notebook.removesuffix(".ipynb")]
        if not notebooks:
            ap.error(f"no notebook named {args.notebook!r} in {NOTEBOOKS}")
    statuses = {n.stem: run_notebook(n, args.scale, params, args.force) for n in notebooks}
    failed = [n for n, s in statuses.items() if s == "failed"]
    print(f"[reproduce] {len(statuses)} notebook(s): " + ", ".join(f"{n}={s}" for n, s in statuses.items()), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
