"""The rule both cloud baselines' settings are chosen by (`cloud_choice`, `fedavg_baseline`): every
candidate trains from the same start, at most a screen's epochs or rounds; the one whose kept step
has the lowest loss on the validation users wins (`training.selection`: ties to the earlier, a
non-finite loss loses); then it alone trains on to its plateau, with its rate cuts, and that run is
the chosen run. A screen that already ended at its plateau without cuts is that run. With no screen
every candidate trains to its plateau and the winner's run is the chosen run.

Not imported by `cloud_baselines`, so this rule is outside the key of the runs it reuses."""

from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np
import pandas as pd

from ondevice.training import selection


class Screened(NamedTuple):
    """The winning candidate, its chosen run's kept weights and curve, and the table of every candidate."""

    best: dict
    weights: list[np.ndarray]
    curve: list[dict]
    table: pd.DataFrame


def kept(curve: list[dict]) -> dict:
    return next(p for p in curve if p["kept"])


def choose(candidates: list[dict], train: Callable[[dict, int], list[dict]], model, screen: int, cuts: bool, log):
    """`train(candidate, cap)` runs one candidate (cap 0: to its plateau, with its cuts) and leaves
    its kept weights in `model`; `screen` caps every candidate's first run (0: none); `cuts`: the
    full run has rate cuts, so a screen (at one rate) is never the chosen run. The model is left
    with the chosen run's weights."""
    runs, rows = [], []

    def score(candidate: dict) -> float:
        curve = train(candidate, screen)
        point = kept(curve)
        runs.append((model.get_weights(), curve))
        rows.append(dict(kept_step=point["step"], unit=point["unit"], ended_by=point["ended_by"]))
        return -point["holdout_loss"] if np.isfinite(point["holdout_loss"]) else -np.inf

    best, table = selection.select(candidates, score, log)
    chosen = int(np.flatnonzero(table.chosen.to_numpy())[0])
    if screen and (rows[chosen]["ended_by"] == "cap" or cuts):
        log(f"the best screened candidate ({best}) on to its plateau")
        curve = train(best, 0)
        runs[chosen] = (model.get_weights(), curve)
    point = kept(runs[chosen][1])
    table = pd.concat([table, pd.DataFrame(rows)], axis=1).assign(**{"validation holdout loss": -table.score})
    table = table.drop(columns="score").assign(screen=screen)
    table["chosen run: kept step"] = np.where(table.chosen, point["step"], np.nan)
    table["chosen run: validation holdout loss"] = np.where(table.chosen, point["holdout_loss"], np.nan)
    model.set_weights(runs[chosen][0])
    return Screened(best, *runs[chosen], table)
