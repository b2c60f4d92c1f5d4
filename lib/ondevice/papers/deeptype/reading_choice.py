"""top3eff's personal step size: one of `step_size`'s two readings, chosen on the validation users'
own lines alone (issue 74). The planted-signal control certifies the rows, so it never chooses their
setting; until 2026-12-07 it broke the readings' tie (`step_size.choose`) and then vouched for the choice.

RULE, fixed before any test run: the reading with the higher median top-k-eff gain (personalized minus
global, in points) on the validation users (the crowd model of the first seed); within `step_size_tie`
of each other, "continued", the reading fixed in advance (the nearer reading of "the same
configuration"). The other reading runs on the test users for the sensitivity table."""

from __future__ import annotations

import pandas as pd

from ondevice.engine.stage import resumable
from ondevice.papers.deeptype import common, step_size

FIXED = step_size.READINGS[0]  # "continued": a tie's reading


def choose(gains: dict[str, float], tie: float) -> str:
    """The RULE: the higher gain on the validation users' own lines; within `tie`, `FIXED`."""
    (a, b), (first, second) = (gains[r] for r in step_size.READINGS), step_size.READINGS
    if abs(a - b) <= tie:
        return FIXED
    return first if a > b else second


@resumable("step_size_choice")
def select(params, corpus, models: common.GlobalModels, log=print) -> tuple[str, pd.DataFrame]:
    """Both readings on the validation users' own lines: the RULE's choice and the table (one row per
    reading, the chosen one marked, `tie` saying whether the fixed reading decided)."""
    table = pd.DataFrame([step_size._validation(params, corpus, models, r, 0.0) for r in step_size.READINGS])
    gains = dict(zip(table.reading, table.median_gain_points))
    chosen = choose(gains, params.step_size_tie)
    tie = abs(gains[step_size.READINGS[0]] - gains[step_size.READINGS[1]]) <= params.step_size_tie
    log(f"step size: {chosen} (validation users' median gain in points: {gains}{'; a tie' if tie else ''})")
    return chosen, table.assign(chosen=table.reading == chosen, tie=tie)
