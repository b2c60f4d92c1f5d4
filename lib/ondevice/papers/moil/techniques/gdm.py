"""Global dataset mixing, GDM(alpha) (thesis eq. 4.1-4.2): the local training set plus a
per-class uniform sample of a fraction alpha of the global set, so incremental training keeps
seeing every global class and does not forget it. alpha = 0 is local data only (catastrophic
forgetting); alpha = 1 is all of both."""

from __future__ import annotations

import numpy as np


def sampling_class(labels: np.ndarray) -> np.ndarray:
    """The class each sample is sampled under: its id, or for multi-hot rows its first positive
    label (a row without any positive label is an error)."""
    labels = np.asarray(labels)
    if labels.ndim == 1:
        return labels.astype(np.int64)
    if labels.ndim != 2:
        raise ValueError(f"labels must be 1-D class ids or 2-D multi-hot rows, got shape {labels.shape}")
    positive = labels > 0
    empty = ~positive.any(axis=1)
    if empty.any():
        raise ValueError(
            f"{int(empty.sum())} multi-hot rows have no positive label (first: row {int(np.argmax(empty))})"
        )
    return positive.argmax(axis=1).astype(np.int64)


def sample_global(labels: np.ndarray, alpha: float, rng: np.random.Generator) -> np.ndarray:
    """Sorted indices of SamplePerClass(D_G, alpha): round(alpha * n_c) samples drawn uniformly
    without replacement from each class c with n_c samples (halves round up)."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
    classes = sampling_class(labels)
    picks = [np.zeros(0, np.int64)]
    for c in np.unique(classes):
        members = np.flatnonzero(classes == c)
        k = int(np.floor(alpha * len(members) + 0.5))
        picks.append(rng.choice(members, size=k, replace=False))
    return np.sort(np.concatenate(picks))


def mix(local: tuple, global_: tuple, alpha: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """D_M = D_L u SamplePerClass(D_G, alpha) as (inputs, labels); both sets' labels must already
    be in one label space (the union of global and local classes)."""
    (xl, yl), (xg, yg) = local, global_
    if np.shape(xl)[1:] != np.shape(xg)[1:] or np.ndim(yl) != np.ndim(yg):
        raise ValueError(
            f"local and global data differ in shape: inputs {np.shape(xl)[1:]} vs {np.shape(xg)[1:]}, "
            f"labels {np.ndim(yl)}-D vs {np.ndim(yg)}-D"
        )
    idx = sample_global(yg, alpha, rng)
    xl, yl = np.asarray(xl), np.asarray(yl)
    return np.concatenate([xl, np.asarray(xg[idx], xl.dtype)]), np.concatenate([yl, np.asarray(yg[idx], yl.dtype)])
