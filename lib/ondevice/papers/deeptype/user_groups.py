"""DeepType D5 (Fig. 8): the test users grouped by how much they typed, the lightest 25%, the
heaviest 25% and the rest normal, and the crowd model against its personalized twin per group."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd

from ondevice.report.conclusion import wide

GROUPS = ("light", "normal", "heavy")


def user_groups(users: pd.DataFrame) -> pd.Series:
    """D5's groups by personal training words: the lightest and heaviest 25% (at least one each), the rest normal."""
    words = users.drop_duplicates("user").set_index("user").train_words.sort_values(kind="stable")
    n, edge = len(words), max(1, round(0.25 * len(words)))
    group = pd.Series("normal", index=words.index)
    group.iloc[:edge], group.iloc[n - edge :] = "light", "heavy"
    return group


def matrix(users: pd.DataFrame, condition: str, only=None) -> np.ndarray:
    """(seeds, users) top-k-eff of one condition, of the users in `only` when given."""
    d = users[users.condition == condition]
    return wide(d if only is None else d[d.user.isin(only)], "top_k_eff")


def group_table(users: pd.DataFrame, start: str, personalized: str) -> tuple[pd.DataFrame, dict[str, float]]:
    """Per group, median top-k-eff (mean over seeds) of the `start` global and the `personalized` model."""
    groups, rows, values = user_groups(users), [], {}
    for name, (cond, label) in itertools.product(GROUPS, ((start, "global"), (personalized, "personalized"))):
        members = groups.index[groups == name]
        words, m = users[users.user.isin(members)].train_words, matrix(users, cond, members)
        value = values[f"top-k-eff, {name} users, {label}"] = float(np.median(m, axis=1).mean()) if m.size else math.nan
        span = {f"train_words_{f}": int(getattr(words, f)()) if len(words) else 0 for f in ("min", "max")}
        rows.append({"group": name, "model": label, "users": len(members), "top_k_eff_median": value, **span})
    return pd.DataFrame(rows), values
