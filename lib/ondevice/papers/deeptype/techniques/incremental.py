"""Incremental training (DeepType Sec. 4.1): the personal model starts from the global model's
weights and keeps training on the user's own typing, on the phone, with a small batch (16)."""

from __future__ import annotations

import numpy as np

from ondevice.training.trainer import Trainer


def personalize(
    trainer: Trainer, global_weights: list[np.ndarray], data, epochs: int, batch_size: int, rng: np.random.Generator
) -> list[dict]:
    """Reset the trainer to the global weights with a fresh optimizer state, then train `epochs`
    on the user's data; returns the per-epoch history. The trainer's model is left personalised."""
    trainer.reset(global_weights)
    return trainer.fit(data, epochs, batch_size, rng)
