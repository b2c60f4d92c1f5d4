"""CloudTrain's optimizer and rate, chosen on the validation users as FedAvg's setting is.

The paper trains every method "by mini-batches" (Sec. 4.1) and names no optimizer for CloudTrain.
Until 2026-12-06 it was Adam at a fixed rate (the preset's `<kind>_cloud_learning_rate`), and that
baseline fell short of what this data allows. On MobileNet (default, seed 0, rate cuts), Adam
0.0005 kept a held-out loss of 0.559, centralized SGD 0.03 kept 0.540 and IID FedAvg (grid 0.03)
kept 0.519. "CloudTrain beats FedAvg" would then compare FedAvg with a weaker centralized model
than a rule on validation data picks.

The rule, fixed before any run with it: the candidates are Adam at the preset's rate (listed first,
so it keeps ties), then plain SGD at each rate of the kind's FedAvg grid. Those grid rates are the
centralized SGD rates that FedAvg's runs stand for (`fedavg_baseline`), so IID FedAvg at the chosen
grid rate and SGD CloudTrain run the same optimizer. On the first seed, each candidate trains
CloudTrain from the same start on the pooled training parts. With a screen (`<kind>_cloud_screen_epochs`),
each trains at most that many epochs at its rate only. Without one, each trains to its plateau. The
candidate whose kept epoch has the lowest loss on the validation users (`cloud_baselines.holdout_loss`;
no test part is seen) is chosen. A diverged run (a non-finite loss) loses, and ties go to the earlier
candidate. Then the chosen candidate trains to its plateau, with its rate cuts, and that run is the
first seed's CloudTrain. If its screen already reached the plateau and it has no cuts, the screen
run is that run. Later seeds train with the chosen optimizer and rate.

MobileNet's SGD grid (0.01, 0.03, 0.1) came from centralized SGD from the public model, with its
batch normalisation adapting (`cloud_baselines.every_layer`), on 6,000 training images. Its
validation loss after epochs 1, 2 and 3 (2026-12-05) was: at 0.01, 2.97, 1.65, 1.13; at 0.03, 2.60,
1.57, 2.07; at 0.1, 2.70, 3.57, 2.04. With the statistics fixed, 0.01 sat at the class prior
(3.45-3.44)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pandas as pd

from ondevice.engine.stage import resumable
from ondevice.papers.autlearn import cloud_baselines, common, screening
from ondevice.papers.autlearn.common import MODEL_NAMES


class CloudChoice(NamedTuple):
    """The chosen optimizer and rate of one kind, the chosen run's kept weights and curve (the
    first seed's CloudTrain), and the table of every candidate."""

    optimizer: str
    learning_rate: float
    weights: list[np.ndarray]
    curve: list[dict]
    table: pd.DataFrame


def check(params) -> None:
    """The CloudTrain fields of autlearn_accuracy's parameters."""
    params.require(params.cloud_init in ("public", "scratch"), "cloud_init", "must be 'public' or 'scratch'")
    params.at_least(1, "text_cloud_epochs", "image_cloud_epochs", "text_cloud_batch_size", "image_cloud_batch_size")
    for kind in ("text", "image"):
        (rate, cap, _), screen = params.cloud(kind), screen_epochs(params, kind)
        params.require(rate > 0, f"{kind}_cloud_learning_rate", "must be positive")
        params.require(
            0 <= screen < cap, f"{kind}_cloud_screen_epochs", f"must be 0 (no screen) or below the cap {cap}"
        )


def screen_epochs(params, kind: str) -> int:
    """Epochs every candidate trains before the best goes on to its plateau (0: no screen)."""
    return getattr(params, f"{kind}_cloud_screen_epochs")


def candidates(params, kind: str) -> list[dict]:
    """Adam at the preset's rate, then SGD at the kind's FedAvg grid (centralized rates)."""
    sgd = getattr(params, f"{kind}_fedavg_rate_candidates")
    return [dict(optimizer="adam", learning_rate=params.cloud(kind)[0])] + [
        dict(optimizer="sgd", learning_rate=r) for r in sgd
    ]


def start_weights(params, kind: str, data, pre: common.Pretrained, seed: int) -> list[np.ndarray]:
    """CloudTrain's start: the public model, or random weights with cloud_init = "scratch"."""
    return pre.weights if params.cloud_init == "public" else cloud_baselines.scratch_weights(params, kind, data, seed)


def choose(params, kind: str, data, pre: common.Pretrained, log=print) -> CloudChoice:
    """The module's rule on one kind, from the first seed's start; resumable per kind (`engine.stage`)."""
    return _choose(params, kind, data, pre, log)


@resumable("cloud_choice", part=lambda params, kind, *args, **kwargs: kind)
def _choose(params, kind: str, data, pre: common.Pretrained, log=print) -> CloudChoice:
    holdout, model = cloud_baselines.holdout_loss(kind, data.validation), pre.model
    start, pooled = start_weights(params, kind, data, pre, params.seed), data.pooled_train()

    def train(candidate: dict, cap: int) -> list[dict]:
        optimizer, rate = candidate["optimizer"], candidate["learning_rate"]
        log(f"{MODEL_NAMES[kind]}: CloudTrain by {optimizer} at rate {rate}" + (f", {cap} epochs" if cap else ""))
        return cloud_baselines.cloud_train(
            params, kind, model, start, pooled, holdout, params.seed, log, optimizer, rate, cap
        )

    cuts = bool(cloud_baselines.rate_cuts(params, kind).cuts)
    s = screening.choose(candidates(params, kind), train, model, screen_epochs(params, kind), cuts, log)
    log(f"{MODEL_NAMES[kind]}: CloudTrain by {s.best['optimizer']} at rate {s.best['learning_rate']}")
    table = s.table.assign(method="CloudTrain", model=MODEL_NAMES[kind], clients="pooled")
    return CloudChoice(s.best["optimizer"], s.best["learning_rate"], s.weights, s.curve, table)


def choose_all(params, text, images, pre, log=print) -> tuple[dict[str, CloudChoice], pd.DataFrame]:
    """`choose` on both kinds (the first seed's public models): the choices and one table."""
    choices = {k: choose(params, k, d, pre[k][params.seed], log) for k, d in (("text", text), ("image", images))}
    return choices, pd.concat([c.table for c in choices.values()], ignore_index=True)


def train(params, kind: str, data, pre: common.Pretrained, holdout, seed: int, choice: CloudChoice, log):
    """CloudTrain of `seed` with the chosen optimizer and rate, from `seed`'s start (`start_weights`)
    on the pooled training parts, leaving its kept weights in `pre.model`; the first seed's is the
    chosen run itself, not trained again."""
    if seed == params.seed:
        pre.model.set_weights(choice.weights)
        return choice.curve
    start, setting = start_weights(params, kind, data, pre, seed), (choice.optimizer, choice.learning_rate)
    return cloud_baselines.cloud_train(
        params, kind, pre.model, start, data.pooled_train(), holdout, seed, log, *setting
    )
