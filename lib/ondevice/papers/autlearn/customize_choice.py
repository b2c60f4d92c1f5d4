"""CloudCustomize's on-device step (rate and epochs), chosen where the validation users stand as the
test users do.

CloudCustomize is CloudTrain's model, then AutLearn's on-device step on each user. CloudTrain pools
every test user's training part, so on a test user the step trains again on data the model has
already fitted. Until 2026-12-06 the step was chosen (`protocol.choose_step`) from CloudTrain's own
model on the validation users, whose data CloudTrain never pools: a step for new users, then applied
to seen ones. Measured on MobileNet (default, seed 0, that CloudTrain): mean top-1 0.953 on the test
writers' training parts (0.883 on their test parts), 0.799 on the validation writers' training
parts (0.816 on their test parts). The steps chosen that way raised the validation writers on every
seed (0.816 -> 0.866, 0.752 -> 0.857, 0.847 -> 0.902) and lowered the test writers (0.883 -> 0.822,
0.868 -> 0.823, 0.872 -> 0.846).

The rule, fixed before its test run: a second CloudTrain of the first seed (the chosen optimizer and
rate, its rate cuts, from the same start) pools the validation users' training parts beside the
test users', so the validation users stand as the test users do. It stops at the plateau of the loss
on the validation users' test parts, the only data of theirs it does not pool (the same rule and
patience as CloudTrain's). `protocol.choose_step` from its kept weights chooses the step on the
validation users, once for every seed, as AutLearn's step is chosen once on the first seed's public
model. This model serves the choice only: CloudCustomize's users start from CloudTrain's model.

The optimizer is chosen by the same rule (`choose_optimizer`). The paper's on-device update applies
its gradients by SGD; our MobileNet head step uses Adam (`image_personal_optimizer`). Where a kind's
step is Adam, plain SGD at `<kind>_sgd_rate_candidates` is chosen on beside it (listed first, so a
tie goes to the paper's), and the optimizer whose best rate and epochs score higher on the validation
users wins. Until 2026-12-07 CloudCustomize's MobileNet step was Adam without a choice.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np
import pandas as pd

from ondevice.data.typing_samples import build_samples
from ondevice.engine.stage import resumable
from ondevice.papers.autlearn import cloud_baselines, cloud_choice, common, protocol
from ondevice.papers.autlearn.common import MODEL_NAMES
from ondevice.training import selection

METHOD = "CloudTrain, validation users pooled (CloudCustomize's choice)"


class CustomizeChoice(NamedTuple):
    """One kind's chosen step (the params to train CloudCustomize's users with), the choice's table and
    the curve of the CloudTrain it was chosen on."""

    params: object
    table: pd.DataFrame
    curve: list[dict]


def pool(kind: str, data):
    """The test users' training parts, then the validation users' (CloudTrain's pool with both)."""
    val = data.validation
    if kind == "text":
        sentences = [s for u in (*data.users, *val.users) for s in data.train_sentences[u]]
        return build_samples(sentences, data.vocab, data.context_words)
    x, y = data.pooled_train()
    return np.concatenate([x, *(val.train[u][0] for u in val.users)]), np.concatenate(
        [y, *(val.train[u][1] for u in val.users)]
    )


def check(params) -> None:
    """The SGD rates CloudCustomize's Adam step is chosen beside (`choose_optimizer`)."""
    rates = params.image_sgd_rate_candidates
    params.require(all(r > 0 for r in rates), "image_sgd_rate_candidates", "must hold positive rates")


def later_parts_loss(kind: str, validation: common.Validation) -> cloud_baselines.Holdout:
    """`cloud_baselines.holdout_loss` on the validation users' test parts alone. It reads two parts per
    user; given each test part as both, its mean (per word or image, over summed losses) is that of the
    test parts alone."""
    return cloud_baselines.holdout_loss(kind, common.Validation(validation.users, validation.test, validation.test))


@resumable("customize_choice", part=lambda params, kind, *args, **kwargs: kind)
def choose(params, kind: str, data, pre: common.Pretrained, cloud: cloud_choice.CloudChoice, log=print):
    """The module's rule on one kind, from the first seed's start."""
    model, seed = pre.model, params.seed
    start = cloud_choice.start_weights(params, kind, data, pre, seed)
    log(f"{MODEL_NAMES[kind]}: CloudTrain with the validation users' training parts pooled (CloudCustomize's choice)")
    setting = (cloud.optimizer, cloud.learning_rate)
    holdout = later_parts_loss(kind, data.validation)
    curve = cloud_baselines.cloud_train(params, kind, model, start, pool(kind, data), holdout, seed, log, *setting)
    curve = [p | dict(method=METHOD, model=MODEL_NAMES[kind], seed=seed) for p in curve]
    kept = next(p for p in curve if p["kept"])
    chosen, table = choose_optimizer(params, kind, data, common.Pretrained(model, model.get_weights(), {}, False), log)
    note = dict(start="CloudTrain, validation users pooled", start_kept_epoch=kept["step"])
    note |= dict(start_ended_by=kept["ended_by"], start_loss_on_later_parts=kept["holdout_loss"])
    table = table.assign(method="CloudCustomize's on-device step", **note)
    return CustomizeChoice(chosen, table, curve)


def choose_optimizer(params, kind: str, data, start: common.Pretrained, log=print):
    """`protocol.choose_step` under each optimizer of the module's rule (SGD first, then the preset's
    Adam, where it is Adam): the winner's params and one table, with each optimizer's row marked."""
    field, sgd_rates = f"{kind}_personal_optimizer", getattr(params, f"{kind}_sgd_rate_candidates", ())
    variants = [params]
    if getattr(params, field) == "adam" and sgd_rates:
        variants.insert(0, dataclasses.replace(params, **{field: "sgd", f"{kind}_rate_candidates": sgd_rates}))
    runs = [protocol.choose_step(v, kind, data, start, log) for v in variants]
    if len(runs) == 1 or any(t.empty for _, t in runs):
        return runs[-1]  # one optimizer, or nothing to choose on
    best = lambda t: float(t.loc[t.chosen, "validation mean top-1"].iloc[0])  # noqa: E731
    optimizers = [{"optimizer": getattr(v, field)} for v in variants]
    winner, _ = selection.select(optimizers, lambda o: best(runs[optimizers.index(o)][1]), log)
    tables = [t.assign(chosen=t.chosen & (o == winner)) for (_, t), o in zip(runs, optimizers)]
    log(f"{MODEL_NAMES[kind]}: CloudCustomize's step by {winner['optimizer']}")
    return runs[optimizers.index(winner)][0], pd.concat(tables, ignore_index=True)


def choose_all(params, text, images, pre, cloud: dict, log=print):
    """`choose` on both kinds: per kind the params CloudCustomize's users train with, one table and
    the choices' CloudTrain curves."""
    choices = {
        k: choose(params, k, d, pre[k][params.seed], cloud[k], log) for k, d in (("text", text), ("image", images))
    }
    steps = {k: c.params for k, c in choices.items()}
    table = pd.concat([c.table for c in choices.values()], ignore_index=True)
    return steps, table, [p for c in choices.values() for p in c.curve]
