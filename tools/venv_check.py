"""Check .venv against requirements.lock, and mend what an interrupted install left half-done.

    python tools/venv_check.py [--venv .venv] [--lock requirements.lock] [--fast] [--mend] [--kernel NAME]

pip trusts a dist-info directory: Ctrl-C while a wheel is unpacked can leave its metadata without its
files (TensorFlow's and numpy's wheels list their dist-info first), and the next install answers
"Requirement already satisfied" (issue 73). So the environment counts as whole only when, for every
pin of the lock:
  1. files: it is installed once, at the pinned version, with a RECORD (pip writes it last), and
     every file that RECORD gives a size is present at that size (about a second for the suite);
  2. `pip check` passes;
  3. its top-level packages import (in one child process, in the lock's order);
  4. with --kernel NAME, that Jupyter kernel starts and answers 1+1.
--fast checks 1 alone. --mend reinstalls the broken pins (--force-reinstall --no-deps; a dist-info
without RECORD, which pip cannot uninstall, is removed first), says so in one line, and checks again
in full. Exits 0 when whole, else 1 naming what is broken. Standard library only: it runs before
anything in the venv is known to work.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parents[1]
PIP = ["-m", "pip", "--disable-pip-version-check"]
# Run in the venv's python: one line before each import, so an import that kills the interpreter is
# still named.
IMPORTS = """
import importlib, json, sys
for name, module in json.load(sys.stdin):
    print("start", name, module, flush=True)
    try:
        importlib.import_module(module)
    except BaseException as e:
        print("fail", name, module, " ".join(f"{type(e).__name__}: {e}".split())[:300], flush=True)
print("done", flush=True)
"""
# Not imported beside TensorFlow, which registers the gs:// file system this package registers again
# (TensorFlow imports it itself under TF_USE_MODULAR_FILESYSTEM=1); its files are still checked.
NOT_IMPORTED = {"tensorflow_io_gcs_filesystem"}
KERNEL = """
import sys
from jupyter_client.manager import start_new_kernel
km, kc = start_new_kernel(kernel_name=sys.argv[1], startup_timeout=120)
try:
    out = []
    reply = kc.execute_interactive("1+1", timeout=60, output_hook=out.append)
    results = [m["content"]["data"].get("text/plain") for m in out if m["msg_type"] == "execute_result"]
    assert reply["content"]["status"] == "ok" and results == ["2"], (reply["content"], results)
finally:
    kc.stop_channels()
    km.shutdown_kernel(now=True)
"""


def norm(name: str) -> str:
    """PEP 503's form of a distribution name, so the lock's and METADATA's spellings meet."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path: Path) -> dict[str, str]:
    """Normalized name -> pinned version, from the lock's `name==version` lines."""
    pins = {}
    for line in path.read_text().splitlines():
        m = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;#]+)", line)
        if m:
            pins[norm(m[1])] = m[2]
    return pins


def site_packages(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python3*/site-packages"))
    if len(found) != 1:
        raise SystemExit(f"[setup] {venv}: expected one lib/python3*/site-packages, found {len(found)}")
    return found[0]


def installed(site: Path) -> dict[str, list[tuple[Path, str]]]:
    """Normalized name -> (dist-info directory, version) of each copy; the directory's own name
    stands in when METADATA was never written."""
    out: dict[str, list[tuple[Path, str]]] = {}
    for info in site.glob("*.dist-info"):
        meta = info / "METADATA"
        text = meta.read_text(errors="replace")[:4000] if meta.is_file() else ""
        name = re.search(r"^Name: *(\S+)", text, re.M)
        version = re.search(r"^Version: *(\S+)", text, re.M)
        stem_name, _, stem_version = info.name.removesuffix(".dist-info").partition("-")
        key = norm(name[1] if name else stem_name)
        out.setdefault(key, []).append((info, version[1] if version else f"{stem_version} (no METADATA)"))
    return out


def record_rows(info: Path) -> list[list[str]]:
    return [row for row in csv.reader((info / "RECORD").read_text().splitlines()) if row]


def file_problems(pins: dict[str, str], site: Path) -> dict[str, str]:
    """Pins that are missing, doubled, at another version, without RECORD, or short of a file."""
    found, problems = installed(site), {}
    for name, pin in pins.items():
        copies = found.get(name, [])
        if len(copies) != 1:
            problems[name] = f"installed {len(copies)} times" if copies else "not installed"
            continue
        info, version = copies[0]
        if version != pin:
            problems[name] = f"{version} installed, the lock pins {pin}"
        elif not (info / "RECORD").is_file():
            problems[name] = "no RECORD: its install was cut short"
        else:
            # .pyc files are caches Python rewrites at will (numpy ships one)
            sized = [(p, int(size)) for p, _, size, *_ in record_rows(info) if size and not p.endswith(".pyc")]
            bad = 0
            for p, size in sized:
                try:
                    bad += os.stat(site / p).st_size != size
                except OSError:
                    bad += 1
            if bad:
                problems[name] = f"{bad} of its {len(sized)} files missing or cut short"
    return problems


def pip_problems(python: str, pins: dict[str, str]) -> dict[str, str]:
    """`pip check`'s complaints, each put on the pinned package it names (the requirement first)."""
    run = subprocess.run([python, *PIP, "check"], capture_output=True, text=True)
    problems = {}
    for line in (run.stdout + run.stderr).splitlines() if run.returncode else []:
        m = re.match(r"(\S+) \S+ (?:requires|has requirement) ([A-Za-z0-9._-]+)", line)
        names = [norm(m[2]), norm(m[1])] if m else []
        blamed = next((n for n in names if n in pins), names[0] if names else "pip check")
        problems[blamed] = f"pip check: {line.strip()}"
    return problems


def import_names(info: Path) -> list[str]:
    """The top-level packages and modules a distribution installs, by its RECORD (a namespace
    package by the packages inside it, e.g. google.protobuf)."""
    paths = [PurePosixPath(row[0]) for row in record_rows(info)]
    names = {p.parent.parts for p in paths if p.name == "__init__.py" and ".." not in p.parts}
    names |= {(p.name.split(".")[0],) for p in paths if len(p.parts) == 1 and p.suffix in (".py", ".so")}
    roots = {n for n in names if n and not any(n[:k] in names for k in range(1, len(n)))}
    return sorted(".".join(n) for n in roots if all(part.isidentifier() for part in n))


def import_problems(python: str, pins: dict[str, str], site: Path) -> dict[str, str]:
    found = installed(site)
    todo = [(name, m) for name in pins for m in import_names(found[name][0][0]) if m not in NOT_IMPORTED]
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2", MPLBACKEND="Agg")
    try:
        run = subprocess.run(
            [python, "-c", IMPORTS], input=json.dumps(todo), capture_output=True, text=True, env=env, timeout=900
        )
        lines, end = run.stdout.splitlines(), f"exit code {run.returncode}"
    except subprocess.TimeoutExpired as e:
        lines, end = (e.stdout or b"").decode().splitlines(), "no answer in 900 s"
    problems, pending = {}, None
    for line in lines:
        word, *rest = line.split(" ", 3)
        if word == "start":
            pending = rest
        elif word == "fail":
            problems[rest[0]], pending = f"import {rest[1]}: {rest[2]}", None
    if pending and (not lines or lines[-1] != "done"):
        problems[pending[0]] = f"import {pending[1]} stopped the interpreter ({end})"
    return problems


def check(venv: Path, pins: dict[str, str], fast: bool) -> dict[str, str]:
    """Broken pin (or 'pip check') -> why. Imports are tried only when every file is in place, since
    one package cut short fails the imports of all that need it."""
    site = site_packages(venv)
    problems = file_problems(pins, site)
    if problems or fast:
        return problems
    python = str(venv / "bin" / "python")
    return pip_problems(python, pins) | import_problems(python, pins, site)


def mend(venv: Path, pins: dict[str, str], problems: dict[str, str]) -> bool:
    """Reinstall the broken pins; False when none of the problems is a pin of the lock."""
    names = [name for name in problems if name in pins]
    if not names:
        return False
    listed = ", ".join(f"{name} ({problems[name]})" for name in names)
    print(f"[setup] {venv} was left half-installed (an interrupted install?): reinstalling {listed}", flush=True)
    for name in names:
        for info, _ in installed(site_packages(venv)).get(name, []):
            if not (info / "RECORD").is_file():
                shutil.rmtree(info)
    pins_ = [f"{name}=={pins[name]}" for name in names]
    cmd = [str(venv / "bin" / "python"), *PIP, "install", "-q", "--force-reinstall", "--no-deps", *pins_]
    return subprocess.run(cmd).returncode == 0


def kernel_problems(venv: Path, kernel: str) -> dict[str, str]:
    """Nothing when the Jupyter kernel `kernel` starts and answers 1+1, else why not."""
    try:
        run = subprocess.run([str(venv / "bin" / "python"), "-c", KERNEL, kernel], capture_output=True, timeout=300)
    except subprocess.TimeoutExpired:
        return {f"kernel {kernel}": "no answer in 300 s"}
    if run.returncode == 0:
        return {}
    last = (run.stderr.decode(errors="replace").strip().splitlines() or [f"exit code {run.returncode}"])[-1]
    return {f"kernel {kernel}": f"did not start or answer 1+1: {last}"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--venv", type=Path, default=Path(".venv"))
    ap.add_argument("--lock", type=Path, default=ROOT / "requirements.lock")
    ap.add_argument("--fast", action="store_true", help="files and versions only (a full check follows a mend)")
    ap.add_argument("--mend", action="store_true", help="reinstall the broken pins, then check in full")
    ap.add_argument("--kernel", help="also start this Jupyter kernel and run 1+1 in it")
    args = ap.parse_args(argv)
    pins = read_lock(args.lock)
    problems = check(args.venv, pins, args.fast)
    if problems and args.mend and mend(args.venv, pins, problems):
        problems = check(args.venv, pins, fast=False)
    if not problems and args.kernel:
        problems = kernel_problems(args.venv, args.kernel)
    for name, why in problems.items():
        print(f"[setup] {args.venv}: {name} is broken: {why}", file=sys.stderr)
    if problems:
        print(f"[setup] {args.venv} is not usable; `rm -rf {args.venv} && make setup` rebuilds it", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
