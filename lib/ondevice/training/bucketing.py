"""Bucketing of variable-length samples for on-device training (DeepType Sec. 5.3).

Three batch sources, each a `Hook` whose `batches()` replaces the task's batching:

- `EqualLength` (DeepType's fine-grained bucketing on the phone): every batch holds samples of
  exactly the same length, so no position is padded; the last batch of a length may be smaller
  than the batch size.
- `FixedBuckets((5, 10, 20, 30))`: DeepType's 4 buckets of the cloud training; a sample goes to
  the smallest bucket that fits it and is padded to that bucket's length (one longer than the
  last bucket is cut to it).
- `FixedBuckets((30,))`: the naive fixed length, every sample padded (or cut) to 30.

Each source shuffles with the given generator, covers every sample exactly once per epoch, and
yields (inputs, labels) right-padded with <pad> (label 0, ignored by the loss).
"""

from __future__ import annotations

import numpy as np

from ondevice.data.typing_samples import Samples
from ondevice.training.step import Hook


def _chunks(groups: list[np.ndarray], batch_size: int, rng) -> list[np.ndarray]:
    batches = [g[i : i + batch_size] for g in groups for i in range(0, len(g), batch_size)]
    if rng is not None:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


def equal_length_batches(lengths: np.ndarray, batch_size: int, rng: np.random.Generator | None) -> list[np.ndarray]:
    """Index arrays of batches whose samples all have the same length."""
    order = rng.permutation(len(lengths)) if rng is not None else np.arange(len(lengths))
    groups = [order[lengths[order] == n] for n in np.unique(lengths)]
    return _chunks(groups, batch_size, rng)


def bucket_batches(
    lengths: np.ndarray, boundaries: tuple[int, ...], batch_size: int, rng: np.random.Generator | None
) -> list[tuple[int, np.ndarray]]:
    """(bucket length, index array) per batch: each sample in the smallest bucket that fits it."""
    order = rng.permutation(len(lengths)) if rng is not None else np.arange(len(lengths))
    bucket = np.minimum(np.searchsorted(np.asarray(boundaries), lengths[order]), len(boundaries) - 1)
    out = []
    for b, size in enumerate(boundaries):
        group = order[bucket == b]
        out += [(size, group[i : i + batch_size]) for i in range(0, len(group), batch_size)]
    if rng is not None:
        out = [out[i] for i in rng.permutation(len(out))]
    return out


def padded_to(data: Samples, idx: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    """Inputs and labels of the chosen samples, right-padded (or cut) to exactly `length`."""
    x = np.zeros((len(idx), length), np.int32)
    y = np.zeros_like(x)
    for row, j in enumerate(idx):
        a = data.offsets[j]
        b = min(data.offsets[j + 1], a + length)
        x[row, : b - a] = data.inputs[a:b]
        y[row, : b - a] = data.labels[a:b]
    return x, y


class EqualLength(Hook):
    """Fine-grained bucketing: batches of exactly equal length, no padding."""

    name = "fine-grained (equal length)"

    def batches(self, task, data: Samples, batch_size: int, rng):
        return [data.padded(idx) for idx in equal_length_batches(data.lengths, batch_size, rng)]


class FixedBuckets(Hook):
    """Batches padded to fixed bucket lengths (default DeepType's 5/10/20/30)."""

    def __init__(self, boundaries: tuple[int, ...] = (5, 10, 20, 30)):
        if not boundaries or list(boundaries) != sorted(set(boundaries)) or boundaries[0] < 1:
            raise ValueError(f"bucket boundaries must be increasing positive lengths, got {boundaries}")
        self.boundaries = tuple(boundaries)
        self.name = (
            "fixed length %d" % boundaries[0]
            if len(boundaries) == 1
            else f"{len(boundaries)} buckets ({'/'.join(map(str, boundaries))})"
        )

    def batches(self, task, data: Samples, batch_size: int, rng):
        return [
            padded_to(data, idx, size) for size, idx in bucket_batches(data.lengths, self.boundaries, batch_size, rng)
        ]


def padding_stats(batches) -> dict:
    """Real (label != <pad>) and computed positions of a list of (inputs, labels) batches."""
    real = int(sum(int((np.asarray(y) != 0).sum()) for _, y in batches))
    computed = int(sum(np.asarray(y).size for _, y in batches))
    return {
        "real_positions": real,
        "computed_positions": computed,
        "padded_fraction": 1 - real / computed if computed else float("nan"),
    }
