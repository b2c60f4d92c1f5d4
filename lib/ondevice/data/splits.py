"""Per-user splits, the first-class concept of LEAF: who trains the global model, who is held out,
and how a held-out user's own history divides into personal training data and test data."""
from __future__ import annotations

import numpy as np


def choose_heldout(sizes: dict, n: int, min_size: int, rng: np.random.Generator) -> list:
    """n users drawn at random among those with at least min_size words, in a stable order."""
    eligible = sorted(u for u, s in sizes.items() if s >= min_size)
    if len(eligible) < n:
        raise ValueError(f"only {len(eligible)} users have at least {min_size} words; {n} requested")
    picked = rng.choice(len(eligible), size=n, replace=False)
    return [eligible[i] for i in sorted(picked)]


def split_history(items: list, sizes: list[int], train_fraction: float) -> tuple[list, list]:
    """Earlier items (up to train_fraction of the words) for training, later ones for testing."""
    total, running = sum(sizes), 0
    for i, size in enumerate(sizes):
        if running + size > train_fraction * total and i > 0:
            return items[:i], items[i:]
        running += size
    return items[:-1], items[-1:]
