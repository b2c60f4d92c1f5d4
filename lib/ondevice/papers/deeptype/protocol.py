"""DeepType's method, once: how a personal model is trained on the phone (Sec. 4.1, incremental
training). Every DeepType experiment (accuracy, personal data, on-device optimisations, online,
energy) builds its personal or online trainer here, from the personal fields of its parameters
(`personal_optimizer`, `personal_learning_rate`, `personal_epochs`, `personal_batch_size`), never
from the global model's `optimizer`: changing the global regime must not move a personal result.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ondevice.training.trainer import History, Hook, Plateau, Trainer


def personal_trainer(params, model, task, hooks: Sequence[Hook] = (), warmup_steps: int = 5) -> Trainer:
    """The on-device trainer of a DeepType experiment: the personal optimizer at the personal rate."""
    return Trainer(model, task, params.personal_learning_rate, params.personal_optimizer, hooks, warmup_steps)


def personalize(trainer: Trainer, global_weights: list[np.ndarray], data, params, rng: np.random.Generator,
                evaluate=None, stop: Plateau | None = None, log=None, label: str = "") -> History:
    """Incremental training: start from the global weights with a fresh optimizer state and train
    up to `personal_epochs` on the user's data at `personal_batch_size` (with `stop`, until the
    held-out part of the user's training data stops improving; the best epoch is kept)."""
    trainer.reset(global_weights)
    return trainer.fit(data, params.personal_epochs, params.personal_batch_size, rng, log, label, evaluate, stop)
