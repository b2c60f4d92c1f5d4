"""How strong the image augmentation is, chosen on the validation writers (autlearn_augment_online, A3).

The paper names the operations (MobileNet: crop, rotation and translation, Sec. 5) but not their
strengths. The rule, fixed before any test run: each candidate scale (`image_strength_candidates`,
weaker first) multiplies every operation's default strength (`image_augment.STRENGTH`: rotation 0.05
of a turn, crop and translation 10%; capped at 1); AutLearn's on-device step (the chosen rate and
epochs) trains on every validation writer's training images plus those generated at that strength
(as A3 generates them: `image_n_aug`, at most `augment_cap` x), and the scale with the highest mean
top-1 on their test images wins (ties: the weaker). The step without augmentation is scored beside
them as a reference row (scale 0), never a candidate: A3 measures augmentation at its chosen
strength. No test writer's data is seen.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from ondevice import streams
from ondevice.papers.autlearn import common, protocol
from ondevice.papers.autlearn.techniques import image_augment
from ondevice.training import selection


def check_strength(params) -> None:
    """The strength fields of autlearn_augment_online's parameters."""
    ok = all(s > 0 for s in params.image_strength_candidates) and params.image_strength > 0
    params.require(ok, "image_strength_candidates", "and image_strength must be positive scales")


def strengths(params, scale: float | None = None) -> dict[str, float]:
    """Each operation's strength at `scale` (default: the chosen `image_strength`)."""
    scale = params.image_strength if scale is None else scale
    return {op: min(1.0, image_augment.STRENGTH[op] * scale) for op in image_augment.OPERATIONS}


def augmenter(params, operations: tuple[str, ...] | None = None, scale: float | None = None):
    """The augmenter of `operations` (default: the preset's) at the chosen (or given) strength."""
    ops = params.image_operations if operations is None else operations
    return image_augment.ImageAugmenter(ops, strengths(params, scale))


def _validation_top1(params, images: common.ImageData, pre: common.Pretrained, scale: float) -> float:
    """Mean top-1 of the on-device step on the validation writers, augmented at `scale` (0: not augmented)."""
    val, step, tops = images.validation, protocol.PersonalTrainer(params, "image", pre.model), []
    for user in val.users:
        x, y = val.train[user]
        if scale:
            rng = streams.rng(params.seed, f"image-augment/validation/{user}")
            gx, gy = image_augment.augment_images(
                augmenter(params, scale=scale), x, y, rng, params.image_n_aug, params.augment_cap
            )
            x, y = np.concatenate([x, gx]), np.concatenate([y, gy])
        rows = step.fit(pre.weights, (x, y), streams.rng(params.seed, f"validation/image/{user}"), test=val.test[user])
        tops.append(rows[-1]["top1"])
    pre.model.set_weights(pre.weights)
    return float(np.mean(tops))


def choose_strength(params, images: common.ImageData, pre: common.Pretrained, log=print):
    """The module's rule: the params with the chosen `image_strength`, and the table of every
    candidate (and the reference without augmentation). No candidates or no validation writers: the
    preset's scale."""
    candidates = params.image_strength_candidates
    if not candidates or not images.validation.users:
        log(f"image augmentation strength x{params.image_strength} from the preset (nothing to choose on)")
        return params, pd.DataFrame()
    score = lambda c: _validation_top1(params, images, pre, c["strength_scale"])  # noqa: E731
    best, table = selection.select([{"strength_scale": s} for s in candidates], score, log)
    reference = {"strength_scale": 0.0, "score": _validation_top1(params, images, pre, 0.0), "chosen": False}
    table = pd.concat([table, pd.DataFrame([reference])], ignore_index=True)
    table = table.rename(columns={"score": "validation mean top-1"}).assign(model=common.MODEL_NAMES["image"])
    table = table.assign(method="image augmentation strength", validation_users=len(images.validation.users))
    chosen = strengths(params, best["strength_scale"])
    log(f"image augmentation strength x{best['strength_scale']} chosen on the validation writers: {chosen}")
    return dataclasses.replace(params, image_strength=best["strength_scale"]), table
