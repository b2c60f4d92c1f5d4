"""Independent random streams, one per purpose.

Every random decision draws from `rng(seed, purpose)`, a NumPy generator seeded with
[seed, crc32(purpose)]: the user split, crowd sampling, each user's batch order and any
diagnostic are separate streams, so switching a diagnostic off, or adding a user, changes no
other draw. Purposes are plain strings ("crowd", "batches/global", "personal/hamlet/Ham").
"""

from __future__ import annotations

import zlib

import numpy as np


def stream_id(purpose: str) -> int:
    """A stable 32-bit id for a purpose name (the same on every machine and Python run)."""
    if not purpose:
        raise ValueError("a random stream needs a purpose name")
    return zlib.crc32(purpose.encode())


def rng(seed: int, purpose: str) -> np.random.Generator:
    return np.random.default_rng([seed, stream_id(purpose)])


def tf_seed(seed: int, purpose: str) -> int:
    """An int seed for TensorFlow/Keras initialisers drawn from the purpose's stream."""
    return int(rng(seed, purpose).integers(0, 2**31 - 1))
