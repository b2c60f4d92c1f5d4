"""Judging at publish: what a stored measurement says about the paper's claim.

A notebook stores what it measured (our change and its interval, per effect); the pages judge it
here, every time they are built. So a change to these rules re-renders every page in seconds and
makes no measurement stale (`provenance.NOT_MEASURING` keeps this module and `claims` out of a result's
code fingerprint).

- **Intervals drawn here.** A row that stores its paired values (`claims.PAIRED`) gets its change,
  interval, user counts and sign test recomputed by `recomputed`, at `LEVEL`, with the bootstrap
  generator's stored state: under unchanged rules the stored interval comes back to the last digit.
- **Four verdicts.** holds / does not hold: the interval excludes zero; within noise: it contains
  zero and excludes the paper's change; inconclusive: it contains both.
- **The paper's precision.** A paper's number carries the range its printed digits allow (half a
  unit of its last digit, 0.617 is 0.6165 to 0.6175); a number the paper defines (a reference,
  `exact = true`) has none. An interval that overlaps the paper's range agrees with it.
- **Agreement in size** ("agrees within 3x", and the ratio) only where the interval excludes zero.
- **The paper's unit.** Where a claim's "+1%" reads as a relative change or as points, paper.toml
  names the reading that leads (`[[<experiment>.claims.readings]]`, fixed before our numbers were
  read: the paper's tables decide where they can); the other reading's verdict stands beside it.
- **Our own protocols.** Where paper.toml declares an experiment's sensitivity runs of a claim
  (`[[<experiment>.claims.protocols]]`), a diagnosis that names a cause outside our implementation
  reads open when one of those runs gives the claim's change the other sign: the cause may be ours.
  A run is a row of a sensitivity table (its change stored), or two conditions of a per-user table
  (`paired`: the change drawn here as the rows' own, a relative change of medians over users).
- **A measured link.** A diagnosis of kind data or scale keeps its kind only where a curve over the
  quantity it names, declared in paper.toml (`[[<experiment>.claims.curves]]`), moves our change
  toward the paper's as that quantity moves toward the paper's value (`curves`); else it reads open.
"""

from __future__ import annotations

import functools
import json
import tomllib
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import numpy as np

from ondevice.report import curves
from ondevice.report.claims import FACTOR, PAIRED, Kind, agrees_in_size, finite, generator, paired_effect

PAPERS = Path(__file__).resolve().parents[1] / "papers"
VERDICTS = ("holds", "does not hold", "within noise", "inconclusive")
INCONCLUSIVE = "inconclusive: the interval contains both zero and the paper's change"
LEVEL = 0.95  # the intervals' coverage, for every row that stores its paired values
DRAWN = "interval drawn"  # the column `recomputed` adds: where the row's interval comes from


def text(row: dict, key: str) -> str:
    """A text cell; "" for a missing one (a CSV's empty cell may come back as NaN)."""
    value = row.get(key)
    return " ".join(value.split()) if isinstance(value, str) else ""


def recomputed(row: dict) -> dict:
    """The row with its change, interval, counts and sign test drawn here from its stored paired
    values at `LEVEL` (`DRAWN` says so); a row without them keeps the interval its notebook stored,
    and one whose values cannot be read keeps it too, with the reason in `DRAWN`."""
    raw = row.get(PAIRED)
    if not isinstance(raw, str) or not raw.strip():
        return row | {DRAWN: "stored by the notebook"}
    try:
        v = json.loads(raw)
        better, worse = np.asarray(v["better"], dtype=float), np.asarray(v["worse"], dtype=float)
        r = paired_effect(better, worse, generator(v["rng"]), int(v["n_boot"]), LEVEL, v["statistic"])
    except (ValueError, KeyError, TypeError, IndexError) as exc:  # JSONDecodeError is a ValueError
        return row | {DRAWN: f"stored by the notebook (its paired values cannot be read: {exc})"}
    drawn = {"our change": r["change"], "ci low": r["ci_low"], "ci high": r["ci_high"], "level": LEVEL}
    drawn |= {k.replace("_", " "): r[k] for k in ("users", "seeds", "users_improved", "users_worse", "sign_test_p")}
    return row | drawn | {DRAWN: "at publish, from the paired values"}


@dataclass(frozen=True)
class Reading:
    """How a claim's printed change is read: `lead` ("relative" or "points") leads, `other` is shown
    beside; `level` names our headline number of the worse condition (its absolute level turns a
    relative change into points)."""

    claim: str
    lead: str
    other: str
    level: str = ""
    why: str = ""


@functools.cache
def _facts(papers_dir: Path) -> dict[str, dict]:
    """Every paper.toml, its floats kept as the Decimals they were printed as (their digits)."""
    out = {}
    for path in sorted(Path(papers_dir).glob("*/paper.toml")):
        try:
            with path.open("rb") as f:
                out[path.parent.name] = tomllib.load(f, parse_float=Decimal)
        except (OSError, tomllib.TOMLDecodeError):
            continue
    return out


def _claims(experiment: str, papers_dir: Path) -> list[dict]:
    """The experiment's claims sections (its [x.claims], [x.time], ...) across the facts files."""
    for name, doc in _facts(Path(papers_dir)).items():
        if experiment in doc and not name.startswith("_"):
            return [v for v in doc[experiment].values() if isinstance(v, dict)]
    return []


def half_unit(number: dict) -> float:
    """Half a unit of a number's last printed digit; 0 for a number the paper defines (exact)."""
    value = number.get("value")
    if number.get("exact") or not isinstance(value, (Decimal, int)):
        return 0.0
    if "precision" in number:
        return float(number["precision"])
    exponent = value.as_tuple().exponent if isinstance(value, Decimal) else 0
    return 0.5 * 10.0**exponent


def paper_range(experiment: str, claim: str, papers_dir: Path = PAPERS) -> tuple[float, float] | None:
    """The range of a claimed change that the paper's printed numbers allow: better / worse - 1 at
    the ends of each number's range; None when the facts pair no two numbers for this claim."""
    for section in _claims(experiment, papers_dir):
        numbers = {n.get("quantity"): n for n in section.get("numbers", []) if isinstance(n, dict)}
        for e in section.get("effects", []):
            if not isinstance(e, dict) or e.get("claim") != claim:
                continue
            b, w = numbers.get(e.get("better")), numbers.get(e.get("worse"))
            if b is None or w is None:
                return None
            # in decimal, so that 0.617 and 0.616 meet exactly at 0.6165 (no change is in range)
            bv, wv, bh, wh = (Decimal(str(x)) for x in (b["value"], w["value"], half_unit(b), half_unit(w)))
            if wv - wh <= 0:
                return None
            return float((bv - bh) / (wv + wh) - 1), float((bv + bh) / (wv - wh) - 1)
    return None


def reading(experiment: str, claim: str, papers_dir: Path = PAPERS) -> Reading | None:
    """The claim's declared reading of its unit, if paper.toml gives one."""
    for section in _claims(experiment, papers_dir):
        for r in section.get("readings", []):
            if isinstance(r, dict) and r.get("claim") == claim:
                return Reading(claim, r["lead"], r["other"], r.get("level", ""), r.get("why", ""))
    return None


@dataclass(frozen=True)
class Protocols:
    """Where an experiment stores a claim's change under its other protocols: a table of tables/,
    its column naming each run (`run`) and the column of its change (`change`, in `unit`, "relative"
    or "points"); the row of the protocol the effects rows use (`main`) is left out, and `select`
    keeps the rows whose columns hold those values. Or `paired` (column, value, better, worse): the
    run named `run` is the claim under two conditions of a per-user table (`paired_change`)."""

    claim: str
    table: str
    run: str
    change: str = ""
    main: str = ""
    unit: str = "relative"
    select: tuple = ()
    paired: tuple = ()
    experiment: str = ""  # another experiment's result holds the table ("": the claim's own)

    @property
    def source(self) -> str:
        """The table's key among the tables a page reads (`referenced`): "<experiment>/<table>" for another's."""
        return f"{self.experiment}/{self.table}" if self.experiment else self.table


def protocols(experiment: str, claim: str, papers_dir: Path = PAPERS) -> list[Protocols]:
    """The claim's declared sensitivity tables, if paper.toml gives any."""
    found = []
    for section in _claims(experiment, papers_dir):
        for p in section.get("protocols", []):
            if isinstance(p, dict) and p.get("claim") == claim:
                paired = p.get("paired") or {}
                keys = ("table", "run") + (() if paired else ("change", "main"))
                missing = [k for k in keys if k not in p] + [
                    f"paired.{k}" for k in PAIRED_KEYS if paired and k not in paired
                ]
                if missing:
                    raise ValueError(f"paper.toml: {experiment}'s protocols of {claim!r} lack {', '.join(missing)}")
                select = tuple(sorted((str(k), str(v)) for k, v in (p.get("select") or {}).items()))
                named = {k: str(p[k]) for k in keys} | {"unit": str(p.get("unit", "relative")), "select": select}
                named |= {"experiment": str(p.get("experiment", ""))}
                found.append(Protocols(claim, **named, paired=tuple(str(paired[k]) for k in PAIRED_KEYS if paired)))
    return found


def referenced(experiment: str, papers_dir: Path = PAPERS) -> set[tuple[str, str]]:
    """(other experiment, table) of every protocol run an experiment's claims read from another's result."""
    return {
        (p.get("experiment"), p.get("table"))
        for section in _claims(experiment, papers_dir)
        for p in section.get("protocols", [])
        if isinstance(p, dict) and p.get("experiment") and p.get("table")
    }


PAIRED_KEYS = ("column", "value", "better", "worse")


def paired_change(rows: list[dict], column: str, value: str, better: str, worse: str) -> float | None:
    """The claim's change between two conditions (`column` holds them) of a per-user table, from
    `value` paired by seed and user, as the effects rows draw theirs (`claims.paired_effect`); None
    when fewer than two users have both."""
    found: dict[str, dict] = {better: {}, worse: {}}
    for r in rows:
        if text(r, column) in found and (x := finite(r.get(value))) is not None:
            found[text(r, column)][(text(r, "seed"), text(r, "user"))] = x
    both = sorted(set(found[better]) & set(found[worse]))
    seeds = sorted({s for s, _ in both})
    users = [u for s, u in both if s == seeds[0]] if seeds else []
    if len(users) < 2 or any((s, u) not in both for s in seeds for u in users):
        return None
    b, w = (np.array([[found[c][s, u] for u in users] for s in seeds]) for c in (better, worse))
    return paired_effect(b, w, np.random.default_rng(0), n_boot=100)["change"]


def reversals(row: dict, experiment: str, tables: dict, papers_dir: Path = PAPERS) -> list[str]:
    """Each declared sensitivity run that gives the row's claim a change of the other sign ("<run>
    +0.65 points"); a change of exactly zero reverses nothing."""
    ours = finite(row.get("our change"))
    if not ours:
        return []
    out = []
    for p in protocols(experiment, text(row, "effect"), papers_dir):
        rows = tables.get(p.source, [])
        if p.paired:
            runs = [(p.run, paired_change(rows, *p.paired))]
        else:
            kept = [r for r in rows if text(r, p.run) != p.main and all(text(r, k) == v for k, v in p.select)]
            runs = [(text(r, p.run), finite(r.get(p.change))) for r in kept]
        for name, change in runs:
            if change and (change > 0) != (ours > 0):
                shown = f"{change * 100:+.2f} points" if p.unit == "points" else f"{change:+.1%}"
                out.append(f"{name} {shown}")
    return out


def protocol_checked(row: dict, experiment: str, tables: dict, papers_dir: Path = PAPERS) -> dict:
    """The row with its diagnosis read open where one of our own sensitivity runs reverses its
    sign (`reversals`), or where a declared sensitivity table has no stored rows: a cause outside our
    implementation is not shown while a protocol of ours turns (or may turn) the change around. A row
    without a diagnosis, or with an open one, is kept as it is."""
    kind = text(row, "diagnosis kind")
    if not text(row, "diagnosis") or kind in ("", Kind.OPEN.value):
        return row
    found = reversals(row, experiment, tables, papers_dir)
    unrun = sorted(
        {p.source for p in protocols(experiment, text(row, "effect"), papers_dir) if not tables.get(p.source)}
    )
    if found:
        said = f"open (protocol), not {kind}: our own sensitivity runs give the other sign ({'; '.join(found)}); "
    elif unrun:
        said = f"open (protocol not yet run), not {kind}: its declared sensitivity runs ({', '.join(unrun)}) have no "
        said += "stored result, so a protocol of ours may yet turn the change around; "
    else:
        return row
    return row | {"diagnosis kind": Kind.OPEN.value, "diagnosis": said + text(row, "diagnosis")}


def curve_checked(row: dict, experiment: str, tables: dict, papers_dir: Path = PAPERS) -> dict:
    """The row with a data or scale diagnosis kept only where its declared curve shows the link
    (`curves.checked`), else read open."""
    return curves.checked(row, _claims(experiment, papers_dir), experiment, tables)


def verdict(low, high, paper_low=None, paper_high=None) -> str:
    """One of VERDICTS from our interval and the paper's range ("-" without an interval)."""
    low, high = finite(low), finite(high)
    if low is None or high is None:
        return "-"
    if low > 0:
        return "holds"
    if high < 0:
        return "does not hold"
    plo, phi = finite(paper_low), finite(paper_high)
    if plo is not None and phi is not None and low <= phi and plo <= high and not plo <= 0 <= phi:
        return "inconclusive"
    return "within noise"


def audit(paper_low, paper_high, ours, low, high, diagnosis: str = "") -> str:
    """Does our change tell the paper's story? "agrees" only where the interval excludes zero (or
    the paper itself claims no change); a row that differs (interval off the paper's range, and
    ours not within 3x of it with its sign) reads "differs, explained by <diagnosis>" when its
    notebook measured why, else "unexplained"."""
    plo, phi, ours, low, high = (finite(v) for v in (paper_low, paper_high, ours, low, high))
    if plo is None or phi is None:
        return "no paper change to compare"
    if ours is None:
        return "no change measured"
    if low is None or high is None:
        return "no interval"
    zero = low <= 0 <= high
    overlaps = low <= phi and plo <= high
    if overlaps and plo <= 0 <= phi:
        return (
            "agrees: no change beyond noise, as the paper reports"
            if zero
            else "agrees: the interval overlaps the paper's range"
        )
    if overlaps:
        return INCONCLUSIVE if zero else "agrees: the interval contains the paper's change"
    paper = (plo + phi) / 2
    if not zero and agrees_in_size(paper, ours):
        return f"agrees within {FACTOR:g}x"
    explained = " ".join(diagnosis.split()) if isinstance(diagnosis, str) else ""
    return f"differs, explained by {explained}" if explained else "unexplained"


@dataclass(frozen=True)
class Judged:
    """One effects row judged: the verdict, the audit's text, the ratio (only where the interval
    excludes zero), the paper's range, and the other reading of the claim's unit, if any."""

    verdict: str
    audit: str
    ratio: float | None
    paper_low: float | None
    paper_high: float | None
    reading: str = ""  # "relative" or "points": the reading that leads, where paper.toml names one
    other: str = ""  # the other reading's verdict and audit, in one line


def _points_scale(row: dict, headline: dict, r: Reading) -> float | None:
    """Our worse condition's absolute level: a relative change times it is a change in points."""
    rel, absolute = finite(row.get("our change")), finite(row.get("absolute change of the mean"))
    if rel and absolute is not None:
        return absolute / rel
    h = headline.get(r.level) if r.level else None
    return finite(h.get("value")) if isinstance(h, dict) else None


def judge(row: dict, experiment: str, headline: dict | None = None, papers_dir: Path = PAPERS) -> Judged:
    """Judge one effects.csv row of an experiment under the rules above."""
    claim = text(row, "effect")
    paper = finite(row.get("paper change"))
    rng = paper_range(experiment, claim, papers_dir) if paper is not None else None
    plo, phi = rng if rng else (paper, paper)
    ours, low, high = (finite(row.get(k)) for k in ("our change", "ci low", "ci high"))
    v = verdict(low, high, plo, phi)
    said = audit(plo, phi, ours, low, high, text(row, "diagnosis"))
    excludes_zero = v in ("holds", "does not hold")
    ratio = ours / paper if excludes_zero and ours is not None and paper else None
    r = reading(experiment, claim, papers_dir)
    if r is None or paper is None:
        return Judged(v, said, ratio, plo, phi)
    scale = _points_scale(row, headline or {}, r)
    if scale is None:
        return Judged(v, said, ratio, plo, phi, r.lead, f"as {r.other}: no level to convert with")
    # the paper's printed change as a fraction read the other way: "+1%" relative <-> 1 point
    to_other = (lambda x: x * scale) if r.other == "points" else (lambda x: x / scale)
    o = [to_other(x) if x is not None else None for x in (ours, low, high)]
    other_v = verdict(o[1], o[2], plo, phi)
    other_text = (
        audit(plo, phi, *o).split(":")[0].replace("unexplained", "differs")
    )  # the lead row carries the diagnosis
    unit = "points" if r.other == "points" else "relative"
    shown = f"{o[0] * 100:+.2f} {unit}" if unit == "points" else f"{o[0]:+.1%}"
    return Judged(v, said, ratio, plo, phi, r.lead, f"as {r.other} ({shown}): {other_v}; {other_text}")


def flagged_kind(row: dict, audit_text: str) -> str | None:
    """Where the cause of a flagged row lies: its diagnosis kind (open when it names none), or
    "unexplained"; None for a row the audit does not flag."""
    if not audit_text.startswith("differs") and audit_text != "unexplained":
        return None
    if not text(row, "diagnosis"):
        return "unexplained"
    return text(row, "diagnosis kind") or Kind.OPEN.value


def kinds_text(flagged: list[str]) -> str:
    """SUMMARY.md's line on the flagged rows: how many are ours to fix (open or unexplained), and
    where the others' causes lie. `flagged`: each flagged row's `flagged_kind`."""
    counts = {k.value: 0 for k in Kind} | {"unexplained": 0}
    for kind in flagged:
        counts[kind] = counts.get(kind, 0) + 1
    ours = counts[Kind.OPEN.value] + counts["unexplained"]
    outside = [f"{k.value} {counts[k.value]}" for k in Kind if k is not Kind.OPEN and counts[k.value]]
    text = f"**{ours} of {len(flagged)} flagged rows are ours to fix** ({counts['open']} with an open "
    text += f"diagnosis, {counts['unexplained']} unexplained)"
    return text + (f"; the others name a cause outside our implementation: {', '.join(outside)}." if outside else ".")
