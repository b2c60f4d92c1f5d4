"""Non-neural next-symbol baselines: the most frequent symbol and a first-order Markov table.

Why: a neural next-place (or next-word) model is only worth its cost if it beats these on the same
splits; the Fidelity rules put one beside every neural method.
"""

from __future__ import annotations

import numpy as np


def most_frequent(labels: np.ndarray) -> int:
    """The most frequent label (the smallest id among ties); -1 for no labels."""
    if len(labels) == 0:
        return -1
    values, counts = np.unique(np.asarray(labels), return_counts=True)
    return int(values[np.argmax(counts)])


class Markov:
    """First-order Markov predictor: for each current symbol, the most frequent next one seen in
    training (smallest id among ties); a current symbol never seen predicts the most frequent next
    symbol overall."""

    def __init__(self, current: np.ndarray, following: np.ndarray):
        current, following = np.asarray(current), np.asarray(following)
        if current.shape != following.shape:
            raise ValueError(f"current {current.shape} and following {following.shape} must have one shape")
        self.fallback = most_frequent(following)
        pairs, counts = np.unique(np.stack([current, following], axis=1), axis=0, return_counts=True)
        order = np.lexsort((pairs[:, 1], -counts, pairs[:, 0]))  # per current: most counts, then smallest next
        pairs = pairs[order]
        first = np.r_[True, pairs[1:, 0] != pairs[:-1, 0]] if len(pairs) else np.zeros(0, bool)
        self.table = dict(zip(pairs[first, 0].tolist(), pairs[first, 1].tolist()))

    def predict(self, current: np.ndarray) -> np.ndarray:
        return np.array([self.table.get(c, self.fallback) for c in np.asarray(current).tolist()], np.int64)
