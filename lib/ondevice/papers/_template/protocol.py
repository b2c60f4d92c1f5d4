"""The paper's method, written once and used by every experiment of the paper: here, how one
user's model is trained (to a plateau of the loss on held-out *training* data, the best epoch kept)."""

from __future__ import annotations

import numpy as np

from ondevice.training.trainer import History, Plateau, Trainer


def train_user(trainer: Trainer, start: list[np.ndarray], train, held, params, rng) -> History:
    """From `start`, up to `params.epochs` on `train`, stopping after `params.patience` epochs
    without a lower loss on `held`; the model keeps the best epoch (`History.best_epoch`)."""
    trainer.reset(start)
    holdout = lambda model: {"holdout_loss": trainer.task.evaluate(model, held)["loss"]}  # noqa: E731
    stop = Plateau(params.patience, 0.0)
    return trainer.fit(train, params.epochs, params.batch_size, rng, evaluate=holdout, stop=stop)
