"""Execute notebooks with papermill into results/<scale>/<notebook>/, atomically and resumably.

A notebook runs in results/<scale>/.staging-<name>-<pid>/ and is renamed into place only when its
executed copy, HTML, run.json and the git-ignored completion marker .complete.json are all written.
A notebook is skipped only when this checkout completed it for the same code fingerprint and
parameters (the marker is never committed, so a fresh clone re-runs everything; FORCE re-runs).
A failing notebook's executed copy, with the error, goes to results/<scale>/<name>.failed/ and the
command exits 1. After each notebook the headline numbers of its run.json are printed beside the
published ones (git HEAD); with --verify a number outside the published tolerance exits 3.
SIGINT or SIGTERM stops the kernel and every other child, removes the staging directory and exits
130. Per-user / per-seed engine jobs that finished survive a failed or interrupted run in
results/<scale>/.jobs/<name>/ (ONDEVICE_JOBS_DIR for the kernel) and are reused by the next run
of the same code and arguments; a completed run removes them. ONDEVICE_RESULTS moves results/
(tests use it).

With --at-once N, N notebooks run at a time in child runners, then those that measure time run
alone (report/at_once.py).

    python -m ondevice.report.runner --scale default [--notebook NAME] [--force] [--params JSON] [--verify]
                                     [--at-once N]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from ondevice import REPO_ROOT
from ondevice.params import SCALES
from ondevice.report import at_once, timings
from ondevice.report.progress import Progress, Ticker
from ondevice.report.provenance import RUN_GIT, changed_since, code_files, fingerprint, git_state
from ondevice.report.record import atomic_write

NOTEBOOKS = REPO_ROOT / "notebooks"
RESULTS = Path(os.environ.get("ONDEVICE_RESULTS") or REPO_ROOT / "results")
KERNEL = "ondevice"
MARKER = ".complete.json"  # git-ignored: only results this checkout produced are skipped
JOBS = ".jobs"  # results/<scale>/.jobs/<notebook>/: finished engine jobs of an unfinished run (git-ignored)
EXIT_FAILED, EXIT_DIFFERS, EXIT_STALE, EXIT_INTERRUPTED = 1, 3, 4, 130


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived; a KeyboardInterrupt so asyncio and nbclient let it through."""


_signal: int | None = None  # the first signal received; nothing is committed once it is set


def _on_signal(signum, frame) -> None:
    """Stop the children at once (the kernel runs in its own session and never sees the terminal's
    Ctrl-C, and papermill might swallow the exception), then unwind to the cleanup."""
    global _signal
    if _signal is not None:
        return  # already stopping; a second Ctrl-C must not cut the cleanup short
    _signal = signum
    stop_children()
    raise Interrupted(signal.Signals(signum).name)


def stop_children(wait_s: float = 3.0) -> None:
    """Terminate every descendant of this process (the kernel and anything it started), then kill
    what is left after wait_s, and reap them."""
    procs = psutil.Process().children(recursive=True)
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(procs, timeout=wait_s)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=wait_s)


@contextlib.contextmanager
def _signals_deferred():
    """Hold SIGINT/SIGTERM while a result is committed, so a rename is never cut in half; a signal
    that arrives meanwhile is handled right after."""
    held = {signal.SIGINT, signal.SIGTERM}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        if _signal is not None:  # interrupted, but something swallowed the exception
            raise Interrupted(signal.Signals(_signal).name)
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def is_up_to_date(final: Path, key: dict) -> bool:
    """True when this checkout completed `final` for this key (the marker is never committed)."""
    try:
        marker = json.loads((final / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return marker.get("key") == key and (final / "run.json").is_file()


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


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def run_notebook(notebook: Path, scale: str, params: dict, force: bool = False) -> str:
    """Execute one notebook; returns 'complete', 'skipped' or 'failed'. On KeyboardInterrupt
    (SIGINT/SIGTERM under main) stops the kernel, removes the staging dir and re-raises."""
    import papermill

    name = notebook.stem
    scale_dir = RESULTS / scale
    scale_dir.mkdir(parents=True, exist_ok=True)
    _remove_stale_staging(scale_dir)
    final = scale_dir / name
    key = {"fingerprint": fingerprint(notebook, scale=scale), "scale": scale, "params": params}
    if not force and is_up_to_date(final, key):
        print(
            f"[reproduce] {name} ({scale}): this checkout completed it for this code and these parameters; "
            f"skipping (FORCE=1 re-runs)",
            flush=True,
        )
        return "skipped"

    staging = scale_dir / f".staging-{name}-{os.getpid()}"
    # Finished per-user / per-seed jobs (ondevice.engine) are kept here, outside the staging
    # directory, so a failed or interrupted run resumes from them; a completed run removes them.
    os.environ["ONDEVICE_JOBS_DIR"] = str(scale_dir / JOBS / name)
    try:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        return _execute(papermill, notebook, scale, params, key, staging, final)
    except KeyboardInterrupt:
        stop_children()
        shutil.rmtree(staging, ignore_errors=True)
        raise


class LoadSampler:
    """The machine's 1-minute load average every `every` seconds while a notebook runs: a timing is
    idle only when the load stays near the notebook's own threads (run.json says both)."""

    def __init__(self, every: float = 15.0):
        self.every, self.samples, self._stop = every, [os.getloadavg()[0]], threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            self.samples.append(os.getloadavg()[0])

    def stop(self) -> dict:
        self._stop.set()
        self.samples.append(os.getloadavg()[0])
        return {"mean": round(sum(self.samples) / len(self.samples), 2), "max": round(max(self.samples), 2)}


def _execute(papermill, notebook: Path, scale: str, params: dict, key: dict, staging: Path, final: Path) -> str:
    name, scale_dir = notebook.stem, final.parent
    executed = staging / f"{name}.ipynb"
    print(f"[reproduce] {name} ({scale}): running", flush=True)
    start, error, load = time.perf_counter(), None, LoadSampler()
    started_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    # the code the notebook imports is the code at its start: its kernel records that commit (provenance.git_state)
    os.environ.pop(RUN_GIT, None)
    os.environ[RUN_GIT] = json.dumps(git_state([notebook, *code_files(notebook, scale=scale)]))
    try:
        papermill.execute_notebook(
            str(notebook),
            str(executed),
            kernel_name=KERNEL,
            cwd=str(notebook.parent),
            progress_bar=True,
            stdout_file=sys.stdout,  # the notebook's progress lines (epochs, users) as they happen
            parameters={"scale": scale, "out_dir": str(staging), **params},
        )
        _html(executed)
        if not (staging / "run.json").is_file():
            raise RuntimeError(f"{name} finished without writing run.json (did it call result.save(out_dir)?)")
    except Exception as exc:  # keep the executed copy for inspection, marked failed
        error = exc
        if executed.is_file() and _signal is None:
            try:
                _html(executed)
            except Exception:
                pass
    run_path = staging / "run.json"
    run = _read_json(run_path) or {"experiment": name, "scale": scale}
    run["notebook"] = {
        "name": name,
        "status": "failed" if error else "complete",
        "key": key,
        "git": git_state([notebook, *code_files(notebook, scale=scale)]),
        "wall_time_s": round(time.perf_counter() - start, 2),
        "started_at": started_at,
        # how many notebooks ran at once (report/at_once.py) and the CPU threads this one had
        "at_once": {
            "notebooks": int(os.environ.get("ONDEVICE_AT_ONCE") or 1),
            "threads": int(os.environ.get("TF_NUM_INTRAOP_THREADS") or os.cpu_count() or 1),
        },
        "load_average": load.stop(),
        "executed_by": "papermill",
        **({"error": f"{type(error).__name__}: {error}"[:2000]} if error else {}),
    }
    os.environ.pop(RUN_GIT, None)
    with _signals_deferred():
        atomic_write(run_path, lambda p: p.write_text(json.dumps(run, indent=2, default=str)))
        if error:
            failed = scale_dir / f"{name}.failed"
            _replace_dir(staging, failed)
        else:
            marker = {"key": key, "completed_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
            atomic_write(staging / MARKER, lambda p: p.write_text(json.dumps(marker, indent=2)))
            shutil.rmtree(scale_dir / f"{name}.failed", ignore_errors=True)
            _replace_dir(staging, final)
            shutil.rmtree(scale_dir / JOBS / name, ignore_errors=True)
    if error:
        print(f"[reproduce] {name} ({scale}): FAILED, executed copy in {failed}\n{error}", file=sys.stderr, flush=True)
        return "failed"
    print(f"[reproduce] {name} ({scale}): complete in {run['notebook']['wall_time_s']:.0f}s -> {final}", flush=True)
    return "complete"


# --- published vs this run -------------------------------------------------------------------


def compare_headlines(published: dict, this: dict) -> list[dict]:
    """One row per headline number of two run.json dicts. Verdicts: 'agrees' (|difference| within
    the published tolerance, never tighter than its resolution), 'DIFFERS', 'no tolerance'
    (published from one seed), 'MISSING' (published, absent from this run), 'new' (not published)."""
    pub, ours = published.get("headline") or {}, this.get("headline") or {}
    rows = []
    for name in [*pub, *(n for n in ours if n not in pub)]:
        p, t = pub.get(name), ours.get(name)
        row = {
            "name": name,
            "published": p and p["value"],
            "this": t and t["value"],
            "difference": None,
            "tolerance": p and p.get("tolerance"),
        }
        if p is None:
            row["verdict"] = "new"
        elif t is None:
            row["verdict"] = "MISSING"
        else:
            row["difference"] = diff = abs(t["value"] - p["value"])
            if row["tolerance"] is None:
                row["verdict"] = "no tolerance"
            else:
                bound = max(row["tolerance"], p.get("resolution") or 0.0)
                within = diff <= bound or math.isclose(diff, bound, rel_tol=1e-9, abs_tol=1e-12)
                row["verdict"] = "agrees" if within else "DIFFERS"
        rows.append(row)
    return rows


def differs(rows: list[dict]) -> bool:
    """True when a published number was not reproduced: outside its tolerance, or missing."""
    return any(r["verdict"] in ("DIFFERS", "MISSING") for r in rows)


def format_rows(rows: list[dict]) -> str:
    def num(x):
        return "-" if x is None else f"{x:.6g}"

    header = ("headline", "published", "this run", "|difference|", "tolerance", "")
    lines = [
        (r["name"], num(r["published"]), num(r["this"]), num(r["difference"]), num(r["tolerance"]), r["verdict"])
        for r in rows
    ]
    widths = [max(len(line[i]) for line in [header, *lines]) for i in range(len(header))]
    return "\n".join(
        "  "
        + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(line[:-1], widths)))
        + "  "
        + line[-1]
        for line in [header, *lines]
    )


def published_run(final: Path, replaced: dict | None) -> tuple[dict | None, str]:
    """The published run.json: the one at git HEAD, else the one this run replaced; and which."""
    try:
        rel = (final / "run.json").resolve().relative_to(REPO_ROOT).as_posix()
        out = subprocess.run(["git", "show", f"HEAD:{rel}"], cwd=REPO_ROOT, capture_output=True, text=True)
        if out.returncode == 0:
            return json.loads(out.stdout), "git HEAD"
    except (ValueError, OSError):  # results outside the repository, no git, or not JSON
        pass
    if replaced is not None:
        return replaced, "the result this run replaced (not committed)"
    return None, ""


def show_comparison(name: str, scale: str, final: Path, replaced: dict | None) -> list[dict] | None:
    """Print published vs this run for one notebook; the rows, or None when nothing is published."""
    published, source = published_run(final, replaced)
    this = _read_json(final / "run.json") or {}
    if published is None or not published.get("headline"):
        what = (
            "nothing published for this scale"
            if published is None
            else "the published run.json has no headline numbers"
        )
        print(f"[reproduce] {name} ({scale}): published vs this run: {what}", flush=True)
        return None
    rows = compare_headlines(published, this)
    print(
        f"[reproduce] {name} ({scale}): published vs this run (published = {source})\n{format_rows(rows)}", flush=True
    )
    if published.get("params") != this.get("params"):
        changed = sorted(
            k
            for k in {*published.get("params", {}), *this.get("params", {})}
            if published.get("params", {}).get(k) != this.get("params", {}).get(k)
        )
        print(
            f"[reproduce] {name} ({scale}): note: this run's parameters differ from the published run's "
            f"({', '.join(changed)}), so differences are expected",
            flush=True,
        )
    return rows


def summary(comparisons: dict[str, list[dict] | None], verify: bool) -> str:
    """The closing lines: which notebooks' numbers differ from the published ones."""
    differ = [n for n, rows in comparisons.items() if rows and differs(rows)]
    untolerated = [n for n, rows in comparisons.items() if rows and any(r["verdict"] == "no tolerance" for r in rows)]
    unpublished = [n for n, rows in comparisons.items() if rows is None]
    lines = []
    if differ:
        consequence = "verify fails" if verify else "make reproduce still succeeds; make verify would fail"
        lines.append(
            f"NUMBERS DIFFER from the published ones (beyond tolerance, or missing) in: "
            f"{', '.join(differ)} ({consequence})"
        )
    elif any(comparisons.values()):
        lines.append("headline numbers agree with the published ones where a tolerance is published")
    if untolerated:
        lines.append(f"published from one seed, so no tolerance to judge by, in: {', '.join(untolerated)}")
    if unpublished:
        lines.append(f"nothing published to compare with for: {', '.join(unpublished)}")
    return "\n".join(f"[reproduce] {line}" for line in lines)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", default="default", choices=SCALES)
    ap.add_argument("--notebook", default="", help="run only this notebook (name without .ipynb)")
    ap.add_argument("--force", action="store_true", help="re-run even when complete results exist")
    ap.add_argument("--params", default="{}", help="JSON object of extra papermill parameters")
    ap.add_argument(
        "--verify",
        action="store_true",
        help=f"exit {EXIT_DIFFERS} when a headline number is outside the published tolerance, {EXIT_STALE} when a "
        "result was measured by code that has changed since",
    )
    ap.add_argument("--notebooks-dir", type=Path, default=NOTEBOOKS, help="where the notebooks are")
    ap.add_argument(
        "--at-once",
        type=int,
        default=1,
        help="notebooks run at the same time, each with its share of the CPUs; those that measure time "
        "run afterwards, alone (report/at_once.py)",
    )
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # one notebook for --at-once
    return ap


def _notebooks(folder: Path, name: str) -> list[Path]:
    """The notebooks under `folder` by name (those in folders starting with . or _ are not run), or
    only the one called `name`."""
    found = sorted(
        (
            p
            for p in folder.rglob("*.ipynb")
            if not any(part.startswith((".", "_")) for part in p.relative_to(folder).parts)
        ),
        key=lambda p: p.stem,
    )
    return [n for n in found if n.stem == name.removesuffix(".ipynb")] if name else found


def main(argv=None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    if args.at_once < 1:
        ap.error(f"--at-once must be at least 1, got {args.at_once}")
    try:
        params = json.loads(args.params)
    except ValueError as exc:
        ap.error(f"--params is not valid JSON: {exc}")
    if not isinstance(params, dict):
        ap.error("--params must be a JSON object")
    notebooks = _notebooks(args.notebooks_dir, args.notebook)
    if args.notebook and not notebooks:
        ap.error(f"no notebook named {args.notebook!r} in {args.notebooks_dir}")

    global _signal
    _signal, began = None, time.perf_counter()
    previous = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    statuses, comparisons, current = {}, {}, None
    # the fallback "published" results, read before any is replaced
    replaced = {nb.stem: _read_json(RESULTS / args.scale / nb.stem / "run.json") for nb in notebooks}

    def done(notebook: Path, status: str) -> None:
        statuses[notebook.stem] = status
        if progress is not None:
            progress.finished(notebook.stem, ran=status == "complete")
            print(progress.line(), flush=True)
        if status in ("complete", "skipped"):
            final, before = RESULTS / args.scale / notebook.stem, replaced[notebook.stem]
            comparisons[notebook.stem] = show_comparison(
                notebook.stem, args.scale, final, before if status == "complete" else None
            )

    progress = None
    try:
        if args.child:
            status = run_notebook(notebooks[0], args.scale, params, args.force)
            return {"complete": 0, "skipped": at_once.EXIT_SKIPPED}.get(status, EXIT_FAILED)
        together, alone = [], notebooks
        if args.at_once > 1 and len(notebooks) > 1:
            together = [nb for nb in notebooks if not at_once.measures_time(nb)]
            alone = [nb for nb in notebooks if at_once.measures_time(nb)]
        progress = Progress(
            RESULTS / args.scale,
            [n.stem for n in together],
            [n.stem for n in alone],
            args.at_once,
            sources={n.stem: n for n in notebooks},
        )
        print("\n".join(progress.plan()), flush=True)
        with Ticker(progress, float(os.environ.get("ONDEVICE_PROGRESS_EVERY") or 60)):
            if together:
                current = f"{len(together)} notebooks run {args.at_once} at a time"
                print(f"[reproduce] {current}; then, alone, the {len(alone)} that measure time", flush=True)
                order = at_once.longest_first(together, RESULTS / args.scale)
                at_once.run(order, args.scale, params, args.force, args.at_once, RESULTS, done)
            for notebook in alone:
                current = notebook.stem
                done(notebook, run_notebook(notebook, args.scale, params, args.force))
    except KeyboardInterrupt:
        what = signal.Signals(_signal).name if _signal else "KeyboardInterrupt"
        print(
            f"\n[reproduce] interrupted by {what} during {current or 'start-up'}: kernel stopped, staging "
            f"directory removed, nothing half-written kept (earlier results are untouched)",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_INTERRUPTED
    finally:
        _signal = None
        for s, handler in previous.items():
            signal.signal(s, handler)
    wall = time.perf_counter() - began
    print(
        f"[reproduce] {len(statuses)} notebook(s) in {wall / 60:.1f} min wall: "
        + ", ".join(f"{n}={s}" for n, s in statuses.items()),
        flush=True,
    )
    if comparisons:
        print(summary(comparisons, args.verify), flush=True)
    timings.report(RESULTS / args.scale)  # per notebook and stage, also in results/<scale>/timings.csv
    if {"failed", "interrupted"} & set(statuses.values()):
        return EXIT_FAILED
    if args.verify and any(rows and differs(rows) for rows in comparisons.values()):
        return EXIT_DIFFERS
    if args.verify and (stale := stale_results(RESULTS / args.scale, notebooks)):
        print(f"[reproduce] STALE: the code that measured {', '.join(stale)} has changed since (verify fails)")
        return EXIT_STALE
    return 0


def stale_results(scale_dir: Path, notebooks: list[Path]) -> list[str]:
    """The notebooks whose stored result was measured by code that has changed since its run
    (`provenance.changed_since`; judging code aside)."""
    stale = []
    for nb in notebooks:
        run = _read_json(scale_dir / nb.stem / "run.json") or {}
        if changed_since((run.get("environment") or {}).get("git") or {}, nb.stem)["stale"]:
            stale.append(nb.stem)
    return stale


if __name__ == "__main__":
    sys.exit(main())
