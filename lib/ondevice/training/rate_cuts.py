"""Rate cuts at a plateau: train at a constant rate to the stop rule's plateau, then again from the
lowest held-out loss so far at the rate times `factor`, `cuts` times, keeping the lowest overall.

Why: at a constant rate a noisy held-out curve's kept minimum is an extreme value, and a known
answer judged on two such minima cannot be judged at all; on two settled curves it can (AutLearn's
MobileNet baselines, `papers/autlearn/cloud_baselines.py`, say what was measured).
Each phase is a whole run of the caller's loop (`Trainer.fit`, `fedavg`) under the same stop rule,
so a phase ends only at that rule's plateau (or its cap), never earlier than the constant rate would.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass(frozen=True)
class RateCuts:
    """`cuts` phases after the first, each at `factor` times the last phase's rate (0: one phase)."""

    cuts: int = 0
    factor: float = 0.2

    def __post_init__(self):
        if self.cuts < 0:
            raise ValueError(f"cuts must be at least 0, got {self.cuts}")
        if not 0 < self.factor < 1:
            raise ValueError(f"factor must be in (0, 1), got {self.factor}")

    def rates(self, rate: float) -> list[float]:
        return [rate * self.factor**k for k in range(self.cuts + 1)]


COUNTED = ("step", "examples_seen", "epochs_seen")  # counted on across phases
Phase = Callable[[int, float], list[dict]]


def with_cuts(rule: RateCuts, rate: float, phase: Phase, model) -> list[dict]:
    """Run `phase(k, rate_k)` for k = 0..cuts. A phase trains `model` from its current weights and
    returns its curve: rows with `step` (counted from 1 within the phase, 0 for a scored start),
    `holdout_loss` and `kept` (the phase's lowest), the phase's kept weights left in `model`; a
    later phase's scored start (step 0) is the weights already scored, and is dropped.

    Every phase starts from the lowest held-out loss seen so far; the result is one curve with
    `step`, `examples_seen` and `epochs_seen` counted on across phases, each row with its `phase`,
    `phase_step` and `learning_rate`, `kept` true on the overall lowest row only, whose weights
    are left in `model`. `ended_by` and `cap` are the last phase's."""
    best, weights, curve, offset = np.inf, None, [], dict.fromkeys(COUNTED, 0)
    for k, r in enumerate(rule.rates(rate)):
        if weights is not None:
            model.set_weights(weights)
        points = phase(k, r)
        kept = next(p for p in points if p["kept"])
        if weights is None or kept["holdout_loss"] < best:
            best, weights, mark = kept["holdout_loss"], model.get_weights(), (k, kept["step"])
        rows = points if k == 0 else [p for p in points if p["step"] > 0]
        on = [p | {c: p[c] + offset[c] for c in COUNTED if c in p} for p in rows]
        curve += [p | dict(phase=k, learning_rate=r, phase_step=q["step"]) for p, q in zip(on, rows)]
        offset = {c: curve[-1].get(c, 0) for c in COUNTED}
    model.set_weights(weights)
    last = {key: curve[-1][key] for key in ("ended_by", "cap") if key in curve[-1]}
    return [p | last | {"kept": (p["phase"], p["phase_step"]) == mark} for p in curve]
