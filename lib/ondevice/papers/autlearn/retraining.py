"""The cloud's re-training of a compressed model (autlearn_cost): its rate chosen by a rule fixed
before the run, and a known-answer control that re-training is not what loses accuracy.

The rule (the paper says only that a pruned model "must be re-trained"; optimizer and rate are
open): Adam from a fresh state, as in pre-training. Each rate of the kind's candidates re-trains the
uncompressed model as a pruning round re-trains a pruned one (one `retrain` call: same data, epochs,
batch) and is scored on the selection hold-out, cloud data apart from the re-training data and from
the held-out data the budget is judged on. The rate with the highest selection top-1 (ties: the
smaller rate) re-trains every compression of the run.

The control (known by construction): the uncompressed model, re-trained exactly as a compressed one
is (the pruning round's re-training; for the LSTM also the SVD's epochs, on the SVD's samples), loses
nothing to compression, so its judged top-1 must stay within the accuracy budget of the uncompressed
model's; a re-training that fails it is a bug of ours. The budget is then judged from the better of
the uncompressed model and its re-trained copies (`reference`): re-training on the cloud's data can
adapt the model to it (MobileNet: ImageNet filters to FEMNIST's letters), and a compression must not
be credited with what re-training alone gives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import tf_keras as keras


@dataclass(frozen=True)
class Cloud:
    """How the cloud judges and re-trains a model. `evaluate(model)`: top-1 on the held-out data the
    budget is judged on; `scores(model)`: (that top-1, top-1 on the selection hold-out);
    `retrain(model, rate, tag)`: one re-training pass in place (`tag` names its samples' draw)."""

    evaluate: Callable
    scores: Callable
    retrain: Callable


@dataclass(frozen=True)
class RateTrial:
    rate: float
    selection_top1: float  # chooses the rate
    judged_top1: float  # the control's pruning-round row (not used to choose)
    chosen: bool


@dataclass(frozen=True)
class Check:
    retraining: str  # the compression whose re-training is repeated on the uncompressed model
    epochs: int
    val_top1: float
    uncompressed_top1: float
    within_budget: bool


def copy(model: keras.Model) -> keras.Model:
    twin = keras.models.clone_model(model)
    twin.set_weights(model.get_weights())
    return twin


def choose_rate(base: keras.Model, cloud: Cloud, rates, log=print) -> tuple[float, list[RateTrial]]:
    """The rule of the module's docstring: every trial, the chosen one marked."""
    if not rates or min(rates) <= 0:
        raise ValueError(f"need positive candidate re-training rates, got {rates}")
    scored = []
    for rate in sorted(set(rates)):
        model = copy(base)
        cloud.retrain(model, rate, "")
        judged, selection = cloud.scores(model)
        log(f"re-training rate {rate:g}: uncompressed re-trained once, selection top-1 {selection:.4f}")
        scored.append((rate, selection, judged))
    best = max(scored, key=lambda t: (t[1], -t[0]))[0]
    return best, [RateTrial(r, s, j, r == best) for r, s, j in scored]


def control(
    base: keras.Model,
    cloud: Cloud,
    rate: float,
    trials: list[RateTrial],
    base_acc: float,
    max_drop: float,
    svd_tags: tuple[str, ...] = (),
    log=print,
) -> list[Check]:
    """The known answer: the pruning round's re-training (the chosen rate's trial, scored on the judged
    hold-out) and, with `svd_tags`, the SVD's re-training epoch by epoch on a copy of `base`."""
    judged = next(t.judged_top1 for t in trials if t.chosen)
    rows = [("pruning round", 1, judged)]
    model = copy(base)
    for epoch, tag in enumerate(svd_tags, 1):
        cloud.retrain(model, rate, tag)
        rows.append(("SVD", epoch, cloud.evaluate(model)))
    checks = [Check(name, e, acc, base_acc, acc >= base_acc - max_drop) for name, e, acc in rows]
    for c in checks:
        verdict = "within" if c.within_budget else "OUTSIDE"
        log(
            f"control: uncompressed re-trained as {c.retraining} ({c.epochs} epoch(s)) at rate {rate:g}: "
            f"{c.val_top1:.4f} (uncompressed {base_acc:.4f}), {verdict} the budget"
        )
    return checks


def reference(base_acc: float, checks: list[Check]) -> float:
    """The accuracy a re-trained compression is judged from: the better of the uncompressed model
    and its re-trained copies."""
    return max([base_acc, *(c.val_top1 for c in checks)])
