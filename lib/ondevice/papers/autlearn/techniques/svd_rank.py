"""The SVD of the softmax (`models.svd_compression`) held to AutLearn's accuracy budget the way its
structured pruning is (`pruning.search`): after the rank is cut the model is re-trained in the cloud
and judged on the same held-out data by the same rule, accuracy at most `max_drop` below the
uncompressed model's.

The rule, fixed before any run: ranks are tried from the largest down; each cut model re-trains an
epoch at a time, judged after every epoch, until it is inside the budget or has re-trained
`max_epochs` epochs. A rank inside the budget is kept and the next smaller one tried; the first
rank that stays outside ends the search (as the first pruning round over the budget does). The
result is the smallest rank inside the budget, or, when none is, the largest rank tried, reported
as outside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import tf_keras as keras

from ondevice.models import svd_compression


@dataclass(frozen=True)
class Trial:
    rank: int
    epochs_retrained: int
    val_accuracy: float
    within_budget: bool


@dataclass(frozen=True)
class Choice:
    rank: int
    model: keras.Model
    val_accuracy: float
    within_budget: bool


def search(
    base: keras.Model,
    ranks: list[int],
    evaluate: Callable[[keras.Model], float],
    retrain: Callable[[keras.Model, str], None],
    base_accuracy: float,
    *,
    max_drop: float,
    max_epochs: int,
    log=print,
) -> tuple[Choice, list[Trial]]:
    """The chosen rank (see the module's rule) and every epoch's judgement. `retrain(model, tag)`
    re-trains in place for one epoch; `tag` names the rank and epoch, so each epoch can draw its own
    public samples."""
    if not ranks or max_epochs < 1 or max_drop < 0:
        raise ValueError(f"need ranks, max_epochs >= 1 and max_drop >= 0; got {ranks}, {max_epochs}, {max_drop}")
    trials, kept, largest = [], None, None
    for rank in sorted(set(ranks), reverse=True):
        model = svd_compression.compress(base, rank)
        for epoch in range(1, max_epochs + 1):
            retrain(model, f"svd/{rank}/{epoch}")
            acc = evaluate(model)
            inside = acc >= base_accuracy - max_drop
            trials.append(Trial(rank, epoch, acc, inside))
            log(f"SVD rank {rank}, re-trained {epoch} epoch(s): accuracy {acc:.4f} (uncompressed {base_accuracy:.4f})")
            if inside:
                break
        choice = Choice(rank, model, acc, inside)
        largest = largest or choice
        if not inside:
            log(f"SVD rank {rank} stays over the budget after {max_epochs} epoch(s): stop")
            break
        kept = choice
    return kept or largest, trials
