"""A data or scale diagnosis needs a measured link: a curve over the quantity it names (words per
user, data size, model size), declared in paper.toml (`[[<experiment>.claims.curves]]`) and drawn
here at publish from a table the run stored, so a change to this rule makes no result stale.

The link holds when moving the quantity toward the paper's value moves our change toward the paper's
change: beyond noise where the table allows an interval. A diagnosis of kind data or scale keeps its
kind only then, with the curve beside it; without a declared curve, or where the curve does not move
that way, it reads open (the cause it names is not shown to be the cause). Four forms:

- **across users** (`paired` = column, value, better, worse, optional x_of; `x`): each user's relative
  change (seeds averaged) against the user's `x` (in the `better` condition's rows, or `x_of`'s);
  Spearman's rank correlation, its interval by resampling users.
- **subsampled conditions** (`conditions` = column, value, worse, better = [...]; `x`): the change of
  each better condition (as the effects rows draw theirs) at its median `x`, from the smallest to the
  largest; the last minus the first, its interval by resampling users.
- **steps over sizes** (`steps` = value; `x`, optional `select`): the gain per doubling of `x` between
  successive sizes, from the medians over users (the experiment is itself the curve over the data
  size); the last step's minus the first's, its interval by resampling users.
- **points** (`change`, optional `x`, `select`): a sweep's stored changes, no interval. With `spans`,
  the link holds where the sweep's changes reach the paper's on both sides; else the point at the
  paper's value (`paper_x`, or the one selected row) must lie nearer the paper's change than ours.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.stats import rankdata

from ondevice.report.claims import Kind, finite, paired_effect

OUTSIDE = (Kind.DATA.value, Kind.SCALE.value)  # the kinds that name a quantity of the data or the run
N_BOOT = 2000


@dataclass(frozen=True)
class Curve:
    """One declared curve of a claim (paper.toml), as `declared` reads it."""

    claim: str
    quantity: str
    table: str
    x: str = ""
    paper_x: float | None = None
    paired: dict | None = None
    conditions: dict | None = None
    change: str = ""
    steps: str = ""
    select: tuple = ()
    spans: bool = False


def declared(sections: list[dict], experiment: str, claim: str) -> list[Curve]:
    """The claim's curves in an experiment's claims sections; a malformed one is an error."""
    found = []
    for section in sections:
        for c in section.get("curves", []):
            if not isinstance(c, dict) or c.get("claim") != claim:
                continue
            forms = [k for k in ("paired", "conditions", "change", "steps") if k in c]
            missing = [k for k in ("quantity", "table") if k not in c] + ([] if len(forms) == 1 else ["one form"])
            missing += ["x"] if forms and forms[0] != "change" and "x" not in c else []
            if missing:
                raise ValueError(f"paper.toml: {experiment}'s curve of {claim!r} lacks {', '.join(missing)}")
            select = tuple(sorted((str(k), str(v)) for k, v in (c.get("select") or {}).items()))
            paper_x = float(c["paper_x"]) if "paper_x" in c else None
            kept = {k: c[k] for k in ("quantity", "table", "x", "change", "steps", "spans") if k in c}
            kept |= {k: dict(c[k]) for k in ("paired", "conditions") if k in c}
            found.append(Curve(claim, **kept, paper_x=paper_x, select=select))
    return found


def _text(row: dict, key: str) -> str:
    value = row.get(key)
    return " ".join(str(value).split()) if value is not None and value == value else ""


def _per_user(rows: list[dict], column: str, value: str, x: str, conditions: list[str]):
    """conditions -> (seeds, users) arrays of `value`, and each user's `x` per condition (seeds
    averaged); only users with every condition in every seed. None when fewer than 3 such users."""
    found: dict[str, dict] = {c: {} for c in conditions}
    for r in rows:
        v, at = finite(r.get(value)), finite(r.get(x)) if x else 0.0
        if _text(r, column) in found and v is not None and at is not None:
            found[_text(r, column)][(_text(r, "seed"), _text(r, "user"))] = (v, at)
    seeds = sorted({s for c in found.values() for s, _ in c})
    users = sorted({u for c in found.values() for _, u in c})
    users = [u for u in users if all((s, u) in found[c] for s in seeds for c in conditions)]
    if len(users) < 3:
        return None
    values = {c: np.array([[found[c][s, u][0] for u in users] for s in seeds]) for c in conditions}
    xs = {c: np.array([[found[c][s, u][1] for u in users] for s in seeds]).mean(axis=0) for c in conditions}
    return values, xs


def spearman(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Spearman's rank correlation along the last axis (0 where either side does not vary)."""
    rx, ry = rankdata(x, axis=-1), rankdata(y, axis=-1)
    rx, ry = rx - rx.mean(axis=-1, keepdims=True), ry - ry.mean(axis=-1, keepdims=True)
    den = np.sqrt((rx**2).sum(axis=-1) * (ry**2).sum(axis=-1))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, (rx * ry).sum(axis=-1) / den, 0.0)


def _interval(boot: np.ndarray) -> tuple[float, float]:
    return tuple(float(q) for q in np.quantile(boot, [0.025, 0.975]))


def across_users(c: Curve, rows: list[dict]) -> dict | None:
    """Spearman's rho between each user's `x` and relative change, with its interval over users."""
    p = c.paired
    of = p.get("x_of", p["better"])
    got = _per_user(rows, p["column"], p["value"], c.x, list(dict.fromkeys([p["better"], p["worse"], of])))
    if got is None:
        return None
    values, xs = got
    x, change = xs[of], (values[p["better"]] / values[p["worse"]] - 1).mean(axis=0)
    idx = np.random.default_rng(0).integers(0, len(x), size=(N_BOOT, len(x)))
    low, high = _interval(spearman(x[idx], change[idx]))
    half = x <= np.median(x)
    halves = f"median change {np.median(change[half]):+.1%} in the lower half of {c.quantity}, "
    halves += f"{np.median(change[~half]):+.1%} in the upper"
    rho = float(spearman(x, change))
    text = f"across {len(x)} users ({c.quantity} {x.min():,.0f} to {x.max():,.0f}, median {np.median(x):,.0f}), "
    return {
        "stat": rho,
        "low": low,
        "high": high,
        "x": float(np.median(x)),
        "text": text + f"rank correlation {rho:+.2f} [{low:+.2f}, {high:+.2f}]; {halves}",
    }


def subsampled(c: Curve, rows: list[dict]) -> dict | None:
    """The change of each better condition at its median `x`; the last minus the first, with its interval."""
    q = c.conditions
    better = list(q["better"])
    got = _per_user(rows, q["column"], q["value"], c.x, [*better, q["worse"]])
    if got is None or len(better) < 2:
        return None
    values, xs = got
    worse, rng = values[q["worse"]], np.random.default_rng(0)
    changes = [paired_effect(values[b], worse, rng, n_boot=2)["change"] for b in better]
    at = [float(np.median(xs[b])) for b in better]
    order = np.argsort(at)
    first, last = better[order[0]], better[order[-1]]
    idx = rng.integers(0, worse.shape[1], size=(N_BOOT, worse.shape[1]))
    med = lambda v: np.median(v[:, idx], axis=2)  # noqa: E731  (seeds, n_boot)
    boot = (med(values[last]) / med(worse) - med(values[first]) / med(worse)).mean(axis=0)
    low, high = _interval(boot)
    points = ", ".join(f"{better[i]} ({at[i]:,.0f}) {changes[i]:+.1%}" for i in order)
    stat = changes[order[-1]] - changes[order[0]]
    text = f"change at each median {c.quantity}: {points}; largest minus smallest {stat * 100:+.1f} points "
    return {
        "stat": stat,
        "low": low,
        "high": high,
        "x": at[order[-1]],
        "text": text + f"[{low * 100:+.1f}, {high * 100:+.1f}]",
    }


def _selected(c: Curve, rows: list[dict]) -> list[dict]:
    return [r for r in rows if all(_text(r, k) == v for k, v in c.select)]


def per_doubling(c: Curve, rows: list[dict]) -> dict | None:
    """The gain per doubling of `x` between successive sizes (the median over users at the larger size
    over that at the smaller, to the power 1 / log2 of their ratio, less 1; seeds averaged); the last
    step's minus the first's, with its interval over users. None with fewer than three sizes."""
    kept = _selected(c, rows)
    sizes = sorted({v for r in kept if (v := finite(r.get(c.x))) is not None})
    names = {_text(r, c.x): finite(r.get(c.x)) for r in kept}
    conditions = sorted((n for n in names if names[n] is not None), key=names.get)
    got = _per_user(kept, c.x, c.steps, "", conditions) if len(sizes) >= 3 else None
    if got is None or len(conditions) != len(sizes):
        return None
    values, users = got[0], len(next(iter(got[0].values()))[0])
    idx = np.random.default_rng(0).integers(0, users, size=(N_BOOT, users))
    full = np.arange(users)[None, :]

    def gains(pick: np.ndarray) -> np.ndarray:  # (steps, len(pick)), seeds averaged
        med = [np.median(values[n][:, pick], axis=2) for n in conditions]  # each (seeds, len(pick))
        if any(np.any(m <= 0) for m in med):
            return np.full((len(sizes) - 1, len(pick)), np.nan)
        power = [1 / np.log2(b / a) for a, b in zip(sizes, sizes[1:])]
        return np.array([((m1 / m0) ** p - 1).mean(axis=0) for m0, m1, p in zip(med, med[1:], power)])

    step, boot = gains(full)[:, 0], gains(idx)
    if not np.all(np.isfinite(step)):
        return None
    low, high = _interval(boot[-1] - boot[0])
    shown = ", ".join(f"{a:,.0f} -> {b:,.0f} {g:+.1%}" for a, b, g in zip(sizes, sizes[1:], step))
    stat = float(step[-1] - step[0])
    return {
        "stat": stat,
        "low": low,
        "high": high,
        "x": sizes[-1],
        "text": f"gain per doubling of {c.quantity} ({users} users, {c.table}): {shown}; last step minus first "
        f"{stat * 100:+.1f} points [{low * 100:+.1f}, {high * 100:+.1f}]",
    }


def points(c: Curve, rows: list[dict], ours: float, paper: float) -> dict | None:
    """A sweep's stored changes: whether they reach the paper's (`spans`) or its point at the
    paper's value lies nearer the paper's change than ours (no interval)."""
    kept = _selected(c, rows)
    pts = [(finite(r.get(c.x)) if c.x else None, finite(r.get(c.change))) for r in kept]
    pts = [(x, y) for x, y in pts if y is not None and (x is not None or not c.x)]
    if not pts:
        return None
    shown = ", ".join(f"{x:g}: {y:+.1%}" if x is not None else f"{y:+.1%}" for x, y in pts)
    if c.spans:
        ys = [y for _, y in pts]
        holds = min(ys) <= paper <= max(ys)
        return {
            "holds": holds,
            "text": f"change against {c.quantity}: {shown} (the paper's {paper:+.1%} "
            f"{'within' if holds else 'outside'} this range)",
        }
    if c.paper_x is not None and c.x:
        x, y = min(pts, key=lambda p: abs(p[0] - c.paper_x))
    elif len(pts) == 1:
        x, y = pts[0]
    else:
        return None
    holds = abs(y - paper) < abs(ours - paper)
    where = f" ({c.x} {x:g})" if x is not None else ""
    return {
        "holds": holds,
        "text": f"change at the paper's {c.quantity}{where}: {y:+.1%}, ours {ours:+.1%}, the paper's {paper:+.1%}",
    }


def link(c: Curve, rows: list[dict], ours: float, paper: float) -> tuple[bool, str] | None:
    """Whether the curve moves our change toward the paper's as the quantity moves toward the
    paper's value, and its text; None where the table cannot draw it."""
    if c.change:
        got = points(c, rows, ours, paper)
        return None if got is None else (got["holds"], got["text"])
    got = across_users(c, rows) if c.paired else per_doubling(c, rows) if c.steps else subsampled(c, rows)
    if got is None or c.paper_x is None:
        return None
    need = np.sign(paper - ours) * np.sign(c.paper_x - got["x"])
    holds = bool(need != 0 and (got["low"] > 0 if need > 0 else got["high"] < 0))
    way = "rise" if need > 0 else "fall"
    said = f"; toward the paper's {c.quantity} ({c.paper_x:,.0f}) the change must {way}"
    return holds, got["text"] + said


def checked(row: dict, sections: list[dict], experiment: str, tables: dict) -> dict:
    """The row with a data or scale diagnosis kept only where a declared curve shows the link
    (its text appended), else read open; any other row as it is."""
    kind, claim = _text(row, "diagnosis kind"), _text(row, "effect")
    ours, paper = finite(row.get("our change")), finite(row.get("paper change"))
    if kind not in OUTSIDE or not _text(row, "diagnosis") or ours is None or paper is None:
        return row
    found = [(c, link(c, tables.get(c.table, []), ours, paper)) for c in declared(sections, experiment, claim)]
    drawn = [(c, got) for c, got in found if got is not None]
    if any(holds for _, (holds, _) in drawn):
        shown = "; ".join(f"curve: {t}" for _, (holds, t) in drawn if holds)
        return row | {"diagnosis": f"{_text(row, 'diagnosis')}; {shown}"}
    if drawn:
        said = "; ".join(t for _, (_, t) in drawn)
        why = f"open (no measured link), not {kind}: the curve does not move our change toward the paper's ({said}); "
    else:
        why = f"open (no curve), not {kind}: no curve over the quantity it names is declared or drawn; "
    return row | {"diagnosis kind": Kind.OPEN.value, "diagnosis": why + _text(row, "diagnosis")}
