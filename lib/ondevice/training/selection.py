"""Hyper-parameter choice on validation users, by code anyone can re-run, never on test users."""

from __future__ import annotations

from typing import Callable

import pandas as pd


def select(candidates: list[dict], score: Callable[[dict], float], log=print) -> tuple[dict, pd.DataFrame]:
    """Score every candidate (higher is better) and return the best with the table of all scores.

    Ties go to the earlier candidate, so list the cheaper or more conservative choice first.
    """
    if not candidates:
        raise ValueError("no candidate to select from")
    rows = []
    for cand in candidates:
        value = float(score(cand))
        rows.append({**cand, "score": value})
        log(f"[selection] {cand}: {value:+.4f}")
    table = pd.DataFrame(rows)
    best = candidates[int(table.score.to_numpy().argmax())]
    table["chosen"] = [c == best for c in candidates]
    return best, table
