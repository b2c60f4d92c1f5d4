"""Claims: the paper's numbers beside ours, and whether each claimed effect holds here beyond noise.

An effect is judged by a paired bootstrap interval over users, not by comparing two numbers: a
+0.1% change over 12 users and one seed is noise until its interval excludes zero.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from enum import Enum

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class PaperNumber:
    quantity: str
    value: float
    source: str


@dataclass(frozen=True)
class Effect:
    """A claimed direction: `better` should exceed `worse` (by the paper's account)."""

    claim: str
    better: str
    worse: str


@dataclass(frozen=True)
class Paper:
    citation: str
    numbers: tuple[PaperNumber, ...]
    effects: tuple[Effect, ...]


class Kind(str, Enum):
    """Where a diagnosed cause lies. Only the first four are outside our implementation; an open
    diagnosis says what we measured about our own shortfall, and the row stays ours to fix."""

    DATA = "data"  # the data per user or the stand-in corpus
    SCALE = "scale"  # the run's sizes (users, words, epochs) against the paper's
    HARDWARE = "hardware"  # this machine against the paper's phones
    READ_TWO_WAYS = "paper read two ways"  # the paper supports more than one reading (a setting it leaves open)
    OPEN = "open"  # measured, but the cause is ours


@dataclass(frozen=True)
class Diagnosis:
    """Why our change differs from the paper's, in one line, the notebook section (its heading, or
    the heading's anchor) whose measurement shows it, so a reader can check the explanation, and
    the kind of cause: a diagnosis is open (ours to fix) unless it says otherwise."""

    text: str
    section: str = ""
    kind: Kind = Kind.OPEN

    def __post_init__(self):
        if not self.text.strip() or "\n" in self.text or "\n" in self.section:
            raise ValueError(f"a diagnosis is one non-empty line (and its section one line), got {self!r}")
        object.__setattr__(self, "kind", Kind(self.kind))  # a kind's value ("data") reads as the kind; others fail

    def columns(self) -> dict:
        """The effects table's diagnosis, section and diagnosis kind cells."""
        return {"diagnosis": self.text, "section": self.section, "diagnosis kind": self.kind.value}


NO_DIAGNOSIS = {"diagnosis": "", "section": "", "diagnosis kind": ""}


NEAR_ZERO = 0.01  # a paper change within 1 point of zero: no ratio is meaningful, the interval alone decides
FACTOR = 3.0  # ours within a factor of 3 of the paper's change, and of its sign, agrees in size


def finite(x) -> float | None:
    """A finite float, or None for anything else (a missing cell, text, NaN)."""
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def agrees_in_size(paper: float, ours: float) -> bool:
    """The audit's size rule: ours of the paper's sign and within FACTOR of it (never for a paper
    change within NEAR_ZERO of zero, where a ratio means nothing)."""
    return abs(paper) >= NEAR_ZERO and ours * paper > 0 and 1 / FACTOR <= ours / paper <= FACTOR


def audit(paper_change, our_change, ci_low, ci_high, diagnosis: str = "") -> str:
    """The audit rule as a notebook applies it, to decide which rows it measures a diagnosis for:
    does our change tell the paper's story? (The pages judge the stored rows by `judge.audit`.)

    A row differs when our interval excludes the paper's change and ours is more than 3x or less
    than a third of it, or of the other sign; for a paper change near zero (within NEAR_ZERO) a
    ratio means nothing, so the interval alone decides. A differing row reads "differs, explained
    by <diagnosis>" when the experiment measured why, else "unexplained". The verdict (holds, does
    not hold, within noise) is a separate question and never changes here. Missing values (None,
    NaN, "") give a reason instead of a judgement.
    """
    paper, ours, low, high = (finite(v) for v in (paper_change, our_change, ci_low, ci_high))
    if paper is None:
        return "no paper change to compare"
    if ours is None:
        return "no change measured"
    if low is None or high is None:
        return "no interval"
    if low <= paper <= high:
        return "agrees: the interval contains the paper's change"
    if agrees_in_size(paper, ours):
        return f"agrees within {FACTOR:g}x"
    explained = " ".join(str(diagnosis or "").split())
    return f"differs, explained by {explained}" if explained else "unexplained"


def paper_vs_ours(paper: Paper, ours: dict[str, float]) -> pd.DataFrame:
    """The paper's numbers beside ours (never instead of them)."""
    missing = [n.quantity for n in paper.numbers if n.quantity not in ours]
    if missing:
        raise KeyError(f"no measured value for {missing}")
    return pd.DataFrame(
        [
            {
                "quantity": n.quantity,
                "paper": n.value,
                "ours": ours[n.quantity],
                "ours / paper": ours[n.quantity] / n.value if n.value else float("nan"),
                "paper source": n.source,
            }
            for n in paper.numbers
        ]
    )


def _per_seed_users(name: str, values) -> np.ndarray:
    """As a (seeds, users) float array; one seed may come as a 1-D array."""
    array = np.asarray(values, dtype=float)
    if array.ndim == 1:
        array = array[None, :]
    if array.ndim != 2:
        raise ValueError(f"{name} must have shape (seeds, users) or (users,), got {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} has non-finite values")
    return array


STATISTICS = {"median": np.median, "mean": np.mean}
PAIRED = "paired values"  # effects.csv column: what `judge.recomputed` draws the interval from at publish
GENERATORS = ("PCG64", "PCG64DXSM", "Philox", "SFC64", "MT19937")


def paired_values(better, worse, rng: np.random.Generator, n_boot: int, statistic: str) -> str:
    """An effect's paired values as one JSON text: (seeds, users) arrays of both conditions, the
    statistic, the resamples, and the bootstrap generator's state before it drew, so that publish
    recomputes this very interval (or another, under changed rules) from what was measured."""
    b, w = _per_seed_users("better", better), _per_seed_users("worse", worse)
    state = rng.bit_generator.state
    record = dict(statistic=statistic, n_boot=int(n_boot), better=b.tolist(), worse=w.tolist(), rng=state)
    return json.dumps(record, separators=(",", ":"))


def generator(state: dict) -> np.random.Generator:
    """A numpy Generator restored from a stored `bit_generator.state`."""
    name = state.get("bit_generator") if isinstance(state, dict) else None
    if name not in GENERATORS:
        raise ValueError(f"unknown bit generator {name!r} (expected one of {list(GENERATORS)})")
    bits = getattr(np.random, name)()
    bits.state = state
    return np.random.Generator(bits)


def _seed_changes(better: np.ndarray, worse: np.ndarray, statistic: str = "median") -> np.ndarray:
    """Per seed, median_u(better) / median_u(worse) - 1 (or of the means over users, with
    statistic="mean"); users on the last axis, seeds on the first."""
    stat = STATISTICS[statistic]
    return stat(better, axis=-1) / stat(worse, axis=-1) - 1


def sign_test(improved: int, worse: int) -> float:
    """Two-sided exact binomial test of improved vs. worse users under p = 1/2 (ties already dropped)."""
    n = improved + worse
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(improved, worse) + 1))
    return min(1.0, 2 * tail / 2**n)


def paired_effect(
    better: np.ndarray,
    worse: np.ndarray,
    rng: np.random.Generator,
    n_boot: int = 2000,
    level: float = 0.95,
    statistic: str = "median",
) -> dict:
    """Relative change of medians over users (averaged over seeds) with a paired bootstrap interval;
    `statistic="mean"` compares means over users instead (e.g. accuracies on few test items each).

    Two-stage bootstrap: users are resampled with the same indices in every seed (a user's values
    under both conditions and across seeds are not independent), then, with more than one seed, the
    seeds too, with replacement (a seed's draws shared by all users, such as one global model, move
    every user at once; resampling users alone would leave that out). The interval is the bootstrap
    percentile interval at `level`. The sign test counts users whose seed-mean difference is above
    or below 0.
    """
    b, w = _per_seed_users("better", better), _per_seed_users("worse", worse)
    if b.shape != w.shape:
        raise ValueError(f"better and worse must be paired by user and seed, got shapes {b.shape} and {w.shape}")
    seeds, users = b.shape
    if users < 2:
        raise ValueError(f"need at least 2 users to judge an effect, got {users}")
    if statistic not in STATISTICS:
        raise ValueError(f"statistic must be one of {sorted(STATISTICS)}, got {statistic!r}")
    if np.any(STATISTICS[statistic](w, axis=1) == 0):
        raise ValueError(f"the {statistic} of `worse` is 0 in some seed, so a relative change is undefined")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    change = float(_seed_changes(b, w, statistic).mean())
    idx = rng.integers(0, users, size=(n_boot, users))
    with np.errstate(divide="ignore", invalid="ignore"):  # a resample whose median is 0 yields inf, kept as extreme
        per_seed = _seed_changes(b[:, idx], w[:, idx], statistic)  # (seeds, n_boot, users) -> (seeds, n_boot)
    per_seed = np.where(np.isnan(per_seed), 0.0, per_seed)  # 0 / 0: a resample where both are 0 has no change
    if seeds > 1:  # one seed draws nothing here, so its intervals are those of a users-only bootstrap
        per_seed = np.take_along_axis(per_seed, rng.integers(0, seeds, size=(seeds, n_boot)), axis=0)
    boot = per_seed.mean(axis=0)
    alpha = (1 - level) / 2
    ci_low, ci_high = (float(q) for q in np.quantile(boot, [alpha, 1 - alpha]))
    diff = (b - w).mean(axis=0)
    improved, worse_users = int((diff > 0).sum()), int((diff < 0).sum())
    verdict = "holds" if ci_low > 0 else "does not hold" if ci_high < 0 else "within noise"
    return {
        "change": change,
        "ci_low": ci_low,
        "ci_high": ci_high,
        "users": users,
        "seeds": seeds,
        "users_improved": improved,
        "users_worse": worse_users,
        "sign_test_p": sign_test(improved, worse_users),
        "verdict": verdict,
    }


def effects_table(
    paper: Paper,
    measured: dict[str, tuple[np.ndarray, np.ndarray]],
    rng: np.random.Generator,
    n_boot: int = 2000,
    level: float = 0.95,
    statistic: str = "median",
    diagnoses: dict[str, str | Diagnosis] | None = None,
    resampled: str = "users",
    repeats: int | None = None,
) -> pd.DataFrame:
    """One row per claimed effect: the paper's change beside ours, with our interval and verdict.

    `measured` maps each effect's claim to per-user (better, worse) arrays, shape (seeds, users).
    `diagnoses` maps a claim to a `Diagnosis` (or its one-line text): why ours differs from the
    paper's, backed by a measurement in the notebook section it names; SUMMARY.md shows it where
    `audit` flags the row. `resampled` names the units on the users axis (users, devices, repeats);
    `repeats` is how many timed repeats each value is the median of, when it is one.
    """
    notes = {c: d if isinstance(d, Diagnosis) else Diagnosis(d) for c, d in (diagnoses or {}).items()}
    unknown_diagnoses = set(notes) - {e.claim for e in paper.effects}
    if unknown_diagnoses:
        raise KeyError(f"diagnoses for {sorted(unknown_diagnoses)}, which are not effects the paper claims")
    if repeats is not None and repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    claims = [e.claim for e in paper.effects]
    missing = [c for c in claims if c not in measured]
    if missing:
        raise KeyError(f"no per-user measurements for effects {missing}")
    unknown = [c for c in measured if c not in claims]
    if unknown:
        raise KeyError(f"measurements for {unknown}, which are not effects the paper claims ({claims})")
    paper_values = {n.quantity: n.value for n in paper.numbers}
    rows = []
    for e in paper.effects:
        if e.better not in paper_values or e.worse not in paper_values:
            raise KeyError(
                f"effect {e.claim!r} refers to {e.better!r} / {e.worse!r}, not both among the paper's numbers"
            )
        stored = paired_values(*measured[e.claim], rng, n_boot, statistic)
        r = paired_effect(*measured[e.claim], rng=rng, n_boot=n_boot, level=level, statistic=statistic)
        rows.append(
            {
                "effect": e.claim,
                "paper change": paper_values[e.better] / paper_values[e.worse] - 1,
                "our change": r["change"],
                "ci low": r["ci_low"],
                "ci high": r["ci_high"],
                "users": r["users"],
                "seeds": r["seeds"],
                "users improved": r["users_improved"],
                "users worse": r["users_worse"],
                "sign test p": r["sign_test_p"],
                "verdict": r["verdict"],
                "level": level,
                "resampled": resampled,
                **({"repeats": repeats} if repeats is not None else {}),
                **(notes[e.claim].columns() if e.claim in notes else NO_DIAGNOSIS),
                PAIRED: stored,
            }
        )
    return pd.DataFrame(rows)


def percent(x: float) -> str:
    """A signed percentage with one decimal, or two when one would round a non-zero change to 0.0%."""
    return f"{x:+.2%}" if 0 < abs(x) < 0.0005 else f"{x:+.1%}"


def verdict_text(effects: pd.DataFrame, stand_in_data: str | None) -> str:
    """A Markdown bullet per effect (from effects_table): holds, does not hold, or within noise, and by how much."""
    lines = []
    for _, row in effects.iterrows():
        seeds = f"{row['seeds']} seed" + ("s" if row["seeds"] != 1 else "")
        lines.append(
            f"- **{row['effect']}**: {row['verdict']} in our measurement: {percent(row['our change'])} "
            f"({row['level']:.0%} interval {percent(row['ci low'])} to {percent(row['ci high'])}, "
            f"{row['users']} users x {seeds}; the paper reports {percent(row['paper change'])})."
        )
    if stand_in_data:
        lines.append(
            f"- Our data is **stand-in data** for {stand_in_data.strip().rstrip('.')}. Absolute numbers "
            "are not comparable with the paper's; the direction and size of each effect are."
        )
    return "\n".join(lines)


def headline(per_seed: list[float], resolution: float = 0.0) -> dict:
    """A headline number over seeds, with the tolerance a re-run elsewhere should stay within.

    A re-run on another machine is like a fresh set of seeds: oneDNN picks ISA-specific kernels
    whose rounding perturbs training as a new seed would. The difference of two S-seed means then
    has standard error s * sqrt(2 / S) (s: sample standard deviation over seeds, ddof=1), and we
    allow three of them, which a correct re-run exceeds about as rarely as 3 sigma allows. The
    tolerance never goes below `resolution` (e.g. the metric's granularity); with one seed the
    spread is unknown, so the tolerance is None.
    """
    values = [float(v) for v in per_seed]
    if not values or not all(math.isfinite(v) for v in values):
        raise ValueError(f"headline needs at least one finite per-seed value, got {per_seed!r}")
    n = len(values)
    tolerance = None
    if n >= 2:
        tolerance = max(3 * float(np.std(values, ddof=1)) * math.sqrt(2 / n), resolution)
    return {"value": float(np.mean(values)), "per_seed": values, "tolerance": tolerance, "resolution": resolution}


def headline_table(headlines: dict[str, dict]) -> pd.DataFrame:
    """The headline numbers of a run, one row each, for reports and the reproduce runner."""
    return pd.DataFrame(
        [
            {
                "name": name,
                "value": h["value"],
                "tolerance": h["tolerance"],
                "seeds": len(h["per_seed"]),
                "per-seed values": ", ".join(f"{v:.6g}" for v in h["per_seed"]),
            }
            for name, h in headlines.items()
        ]
    )
