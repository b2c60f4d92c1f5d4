"""Learning-rate decay on a plateau of held-out loss, the training rule of DeepType's data-size
experiment (D2): the global regime decays its rate by epoch (after the 4th), so a small training
set gets a tenth of a large one's full-rate steps and stops short of its plateau. Decaying when the
held-out loss stalls gives every size the same rule, counted in what the model has learnt rather
than in passes over its data.

`PlateauDecay` is both the `schedule` and the `stop` of `Trainer.fit`: the rate starts at `rate`;
each epoch whose held-out loss is not below the lowest so far by `min_delta` (relative) multiplies
it by `decay` for the next epoch; `patience` such epochs in a row end training, and the weights of
the lowest held-out loss are kept (`Plateau(keep_lowest=True)`)."""

from __future__ import annotations

from ondevice.training.trainer import Plateau


class PlateauDecay:
    """Schedule and stop rule of one `Trainer.fit` (pass the same object as both)."""

    monitor = "holdout_loss"

    def __init__(self, rate: float, decay: float, patience: int, min_delta: float):
        if not 0 < decay < 1:
            raise ValueError(f"decay must be in (0, 1), got {decay}")
        if rate <= 0:
            raise ValueError(f"rate must be positive, got {rate}")
        self.start, self.decay, self.rate = rate, decay, rate
        self.rule = Plateau(patience, min_delta, keep_lowest=True)

    def __call__(self, epoch: int) -> float:
        """The learning rate of the next epoch (the rate the last stalled epoch left)."""
        return self.rate

    def watch(self) -> "_DecayWatch":
        self.rate = self.start
        return _DecayWatch(self)


class _DecayWatch:
    """`Plateau`'s watch of one fit, decaying the owner's rate after every epoch without improvement."""

    def __init__(self, owner: PlateauDecay):
        self.owner, self.inner = owner, owner.rule.watch()

    def update(self, value: float, epoch: int, model) -> bool:
        stop = self.inner.update(value, epoch, model)
        if self.inner.waited:
            self.owner.rate *= self.owner.decay
        return stop

    @property
    def weights(self):
        return self.inner.weights

    @property
    def epoch(self) -> int | None:
        return self.inner.epoch

    @property
    def plateau(self) -> bool:
        return self.inner.plateau
