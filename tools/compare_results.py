"""Compare two results trees table by table, and run.json number by number, ignoring what depends on the clock.

    python tools/compare_results.py results/smoke OTHER/results/smoke [--notebook NAME ...]
                                    [--rename 'OLD_REGEX=NEW' ...]

For every notebook present in both trees, every tables/*.csv is compared cell by cell; columns
whose name says time (seconds, time, steps/s, throughput, speed-up, ratio of times) and the
model cache's provenance columns (`key`: a hash that includes the code; `from_cache`: whether this
run trained the model or an earlier one did) are left out. Columns present on one side only are
listed as layout changes; the shared columns are compared. Exits 1 and lists every differing value
when one differs beyond --rtol (default 0: bit-identical). Each run.json is compared
value by value (every number, string and list) except where the run's clock, machine or code
speaks: the creation and start dates, wall times, the environment, git state, fingerprints and
cache provenance (keys matching the clock pattern above, or in RUN_PROVENANCE). A parameter that
moved (e.g. /params/trace_wake -> /params/trace/wake) is matched with --rename, a regular
expression over the before side's paths and its replacement."""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

import pandas as pd

CLOCK = re.compile(
    r"second|time|_s$|per_s|steps/s|throughput|speed|latency|\bms\b|wall|rate_hz|energy|joule|power|watt|duration|elapsed|peak_rss|memory",
    re.I,
)


PROVENANCE = {"key", "from_cache"}
RUN_PROVENANCE = re.compile(
    r"^(created_at|started_at|environment|git|commit|dirty|fingerprint|key|at_once|executed_by|.*from_cache.*)$"
)


def _leaves(doc, path: str = ""):
    """(path, value) of every leaf of a JSON document, skipping provenance and clock keys."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            if not (RUN_PROVENANCE.match(str(k)) or CLOCK.search(str(k))):
                yield from _leaves(v, f"{path}/{k}")
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _leaves(v, f"{path}[{i}]")
    else:
        yield path, doc


def compare_runs(a: Path, b: Path, rtol: float, renames: tuple = ()) -> list[str]:
    """Every number and string of two run.json files, path by path (the before side's paths renamed)."""
    la, lb = (dict(_leaves(json.loads(p.read_text()))) for p in (a, b))
    for old, new in renames:
        la = {re.sub(old, new, k): v for k, v in la.items()}
    out = [f"run.json: {k} on one side only" for k in sorted(set(la) ^ set(lb))]
    for k in [k for k in la if k in lb]:
        x, y = la[k], lb[k]
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (x, y))
        if not (x == y or numbers and (math.isnan(x) and math.isnan(y) or math.isclose(x, y, rel_tol=rtol))):
            out.append(f"run.json: {k}: {x!r} vs {y!r}")
    return out


def compare_tables(a: Path, b: Path, rtol: float, layout: list[str]) -> list[str]:
    da, db = pd.read_csv(a), pd.read_csv(b)
    if set(da.columns) != set(db.columns):
        layout.append(f"{a.name}: columns on one side only: {sorted(set(da.columns) ^ set(db.columns))}")
    if len(da) != len(db):
        return [f"{a.name}: {len(da)} rows vs {len(db)}"]
    out = []
    for col in [c for c in da.columns if c in db.columns]:
        if CLOCK.search(str(col)) or col in PROVENANCE:
            continue
        for i, (x, y) in enumerate(zip(da[col], db[col])):
            same = x == y or (
                isinstance(x, float)
                and isinstance(y, float)
                and (math.isnan(x) and math.isnan(y) or math.isclose(x, y, rel_tol=rtol))
            )
            if not same:
                out.append(f"{a.name}: row {i} column {col!r}: {x!r} vs {y!r}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--notebook", nargs="+", action="extend", default=None, help="repeatable; names add up")
    ap.add_argument("--rtol", type=float, default=0.0)
    ap.add_argument("--rename", action="append", default=[], help="OLD_REGEX=NEW over the before run.json's paths")
    args = ap.parse_args(argv)
    renames = tuple(tuple(r.split("=", 1)) for r in args.rename)
    names = args.notebook or sorted(p.name for p in args.before.iterdir() if (p / "tables").is_dir())
    failures, layout, checked = [], [], 0
    for name in names:
        ta, tb = args.before / name / "tables", args.after / name / "tables"
        if not tb.is_dir():
            failures.append(f"{name}: no tables in {tb}")
            continue
        missing = sorted({p.name for p in ta.glob("*.csv")} ^ {p.name for p in tb.glob("*.csv")})
        if missing:
            failures.append(f"{name}: tables only on one side: {missing}")
        for csv in sorted(ta.glob("*.csv")):
            if (tb / csv.name).is_file():
                checked += 1
                before = len(layout)
                failures += [f"{name}/{d}" for d in compare_tables(csv, tb / csv.name, args.rtol, layout)]
                layout[before:] = [f"{name}/{d}" for d in layout[before:]]
        if (args.before / name / "run.json").is_file():
            if (args.after / name / "run.json").is_file():
                failures += [
                    f"{name}/{d}"
                    for d in compare_runs(
                        args.before / name / "run.json", args.after / name / "run.json", args.rtol, renames
                    )
                ]
            else:
                failures.append(f"{name}: no run.json in {args.after / name}")
    print(
        f"{checked} tables and the run.json files compared over {len(names)} notebooks; "
        f"{len(failures)} differences in values"
    )
    for f in failures:
        print("  " + f)
    for change in layout:
        print("  layout: " + change)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
