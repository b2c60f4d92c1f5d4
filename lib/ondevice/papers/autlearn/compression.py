"""The cloud's compression of the public model (AutLearn Sec. 3.2): structured pruning and the SVD
of the softmax, each re-trained in the cloud and kept within an accuracy budget, and magnitude
pruning as our ablation beside them (autlearn_cost); what each removes, loses and saves."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import tf_keras as keras

from ondevice import streams
from ondevice.data import femnist
from ondevice.data.typing_samples import Samples
from ondevice.models import mobilenet_v1, svd_compression
from ondevice.papers.autlearn import common
from ondevice.papers.autlearn.common import LAST_LAYER, MODEL_NAMES
from ondevice.papers.autlearn.protocol import setting
from ondevice.papers.autlearn.techniques import magnitude_pruning, pruning, svd_rank
from ondevice.tasks.classification import ClassificationTask
from ondevice.tasks.next_word import NextWordTask
from ondevice.training.bucketing import EqualLength
from ondevice.training.trainer import Trainer


@dataclass
class Compressed:
    kind: str
    method: str  # uncompressed | structured pruning | SVD | magnitude pruning
    model: keras.Model
    detail: str
    val_top1: float
    head: str
    within_budget: bool = True  # accuracy at most `max_accuracy_drop` below the uncompressed model's
    trials: tuple = ()  # the SVD's re-training epochs per rank (`svd_rank.Trial`)


def subset(samples: Samples, n: int, rng) -> Samples:
    """`n` of the samples drawn at random, in their order (all when n is 0 or at least their number)."""
    if not n or n >= len(samples):
        return samples
    idx = np.sort(rng.choice(len(samples), n, replace=False))
    spans = [slice(samples.offsets[j], samples.offsets[j + 1]) for j in idx]
    parts, labels = [samples.inputs[s] for s in spans], [samples.labels[s] for s in spans]
    offsets = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(samples.offsets.dtype)
    kept = (samples.n_context[idx], samples.word_len[idx], samples.target[idx])
    return Samples(np.concatenate(parts), np.concatenate(labels), offsets, *kept)


def cloud_text(params, text: common.TextData):
    """The LSTM's (evaluate, retrain) in the cloud: top-1 on held-out public samples, re-training on
    public samples with the pre-training's optimizer."""
    holdout = subset(
        text.public_holdout, params.validation_samples, streams.rng(params.seed, "autlearn-cost/cloud-text")
    )

    def retrain(model, tag: str = ""):
        """One re-training pass; a `tag` (the SVD's rank and epoch) draws its own public samples."""
        trainer = Trainer(model, NextWordTask(params.k), params.pretrain_learning_rate, "adam", hooks=[EqualLength()])
        draw = streams.rng(params.seed, "autlearn-cost/retrain-sample" + (f"/{tag}" if tag else ""))
        sub = subset(text.public_train, params.retrain_samples, draw)
        rng = streams.rng(params.seed, "autlearn-cost/retrain")
        trainer.fit(sub, params.retrain_epochs, params.pretrain_batch_size, rng)

    return (lambda model: common.score_text(model, holdout, params.k)["top1"]), retrain


def cloud_image(params, images: common.ImageData, writers, pre: common.Pretrained):
    """MobileNet's (evaluate, retrain) in the cloud: a backbone's score is the top-1 on the cloud
    writers' test images of a head fitted on their training images (features once). ImageNet is not
    here, so a pruned model re-trains (the paper: "after pruning the model must be re-trained") on
    the cloud writers' training images, every layer, by Adam at `cloud_retrain_learning_rate`."""
    train, test, head_name = images.pooled(writers), images.pooled(writers, ("test",)), LAST_LAYER["image"]
    s = setting(params, "image")

    def retrain(model):
        trainer = Trainer(model, common.image_task(), params.cloud_retrain_learning_rate, "adam")
        trainer.fit(train, params.retrain_epochs, 32, streams.rng(params.seed, "autlearn-cost/retrain-image"))

    def evaluate(model):
        feats, head = keras.Model(model.input, model.get_layer(head_name).input), mobilenet_v1.head_model(model)
        head.get_layer(head_name).set_weights(pre.model.get_layer(head_name).get_weights())
        f = lambda x: np.concatenate([feats(x[i : i + 256], training=False).numpy() for i in range(0, len(x), 256)])
        trainer = Trainer(
            head, ClassificationTask((head.input_shape[-1],), femnist.CLASSES), s.learning_rate, s.optimizer
        )
        rng = streams.rng(params.seed, "autlearn-cost/cloud-head")
        trainer.fit((f(train[0]), train[1]), params.cloud_head_epochs, s.batch_size, rng)
        return float((head(f(test[0]), training=False).numpy().argmax(-1) == test[1]).mean())

    return evaluate, retrain


def compress(params, kind: str, pre: common.Pretrained, evaluate, retrain, log=print):
    """The uncompressed public model and each compression within `max_accuracy_drop` of its cloud
    accuracy, and the structured search's rounds: the paper's structured pruning (`pruning.search`)
    for both models; for the LSTM also DeepType's SVD of the softmax (re-trained, its rank chosen by
    `svd_rank.search`) and, as our ablation, magnitude pruning (the highest tried sparsity within the
    budget; zeroed weights remove no work). MobileNet's FC head (256 x 62) is too small for SVD or sparsity
    to matter."""
    pre.model.set_weights(pre.weights)
    base = pruning.flatten(pre.model) if kind == "image" else keras.models.clone_model(pre.model)
    if kind == "text":
        base.set_weights(pre.model.get_weights())
    layers = pruning.candidates(base)
    if kind == "image" and params.prune_candidates:
        layers = sorted(layers, key=lambda n: -pruning.layer_flops(base.get_layer(n)))[: params.prune_candidates]
    name, head = MODEL_NAMES[kind], LAST_LAYER[kind]
    log_ = lambda m: log(f"{name}: {m}")
    search = dict(step=params.prune_step, max_drop=params.max_accuracy_drop, max_rounds=params.prune_rounds)
    best, rounds, base_acc = pruning.search(base, evaluate, retrain, layers=layers, log=log_, **search)
    w = lambda model, n: pruning.width(model.get_layer(n))
    widths = ", ".join(f"{n} {w(base, n)}->{w(best, n)}" for n in layers if w(base, n) != w(best, n))
    acc = evaluate(best) if best is not base else base_acc
    variants = [
        Compressed(kind, "uncompressed", base, "the public pre-trained model", base_acc, head),
        Compressed(kind, "structured pruning", best, widths or "no round within the budget", acc, head),
    ]
    if kind == "text":
        variants += [
            _svd(params, base, evaluate, retrain, base_acc, log_),
            _magnitude(params, base, evaluate, base_acc, log_),
        ]
    return variants, [{"model": name, **r.__dict__} for r in rounds]


def _svd(params, base, evaluate, retrain, base_acc: float, log) -> Compressed:
    """DeepType's SVD of the softmax at the rank `svd_rank.search` chooses, re-trained."""
    hidden = int(base.get_layer(svd_compression.SOFTMAX).input_shape[-1])
    ranks = [svd_compression.rank_for(hidden, f) for f in params.svd_fractions]
    rule = dict(max_drop=params.max_accuracy_drop, max_epochs=params.svd_retrain_epochs, log=log)
    choice, trials = svd_rank.search(base, ranks, evaluate, retrain, base_acc, **rule)
    detail = f"softmax rank {choice.rank} of {hidden}" + ("" if choice.within_budget else ", outside the budget")
    head, inside = svd_compression.SOFTMAX, choice.within_budget
    return Compressed("text", "SVD", choice.model, detail, choice.val_accuracy, head, inside, tuple(trials))


def _magnitude(params, base, evaluate, base_acc: float, log) -> Compressed:
    """Our ablation, not the paper's technique: the highest tried sparsity within the budget."""
    prune = lambda s: magnitude_pruning.prune(base, s)
    tried = ((f"magnitude pruning {s:.0%}", s, lambda s=s: prune(s)) for s in sorted(params.sparsities))
    sparsity, model, acc = _within_budget(tried, evaluate, base_acc, params.max_accuracy_drop, log)
    detail, inside = f"{sparsity:.0%} of weights zero", acc >= base_acc - params.max_accuracy_drop
    return Compressed("text", "magnitude pruning", model, detail, acc, LAST_LAYER["text"], inside)


def _within_budget(tried, evaluate, base_acc: float, max_drop: float, log):
    """(setting, model, accuracy) of the strongest of `tried` ((label, setting, build) from the
    weakest) within `max_drop` of `base_acc`, stopping at the first outside it (the weakest when
    none is within: it is reported, with its accuracy)."""
    chosen = None
    for label, value, build in tried:
        model = build()
        acc = evaluate(model)
        log(f"{label}: accuracy {acc:.4f} (uncompressed {base_acc:.4f})")
        if chosen is None or acc >= base_acc - max_drop:
            chosen = (value, model, acc)
        if acc < base_acc - max_drop:
            break
    return chosen


ROLE = {
    "structured pruning": "the paper's technique (Sec. 3.5)",
    "SVD": "the paper's (Sec. 3.2 calls its compression SVD-based)",
    "magnitude pruning": "our ablation (not the paper's technique)",
}


def summary(compression: pd.DataFrame, epochs: pd.DataFrame) -> pd.DataFrame:
    """Per compression, model and batch: the share of the on-device step's work it removes (counted
    FLOPs of the epoch), the held-out accuracy it loses (absolute top-1, inside the budget or not)
    and the share of the epoch's time it saves (medians over the timed users, as the effects read)."""
    base = epochs[epochs.method == "uncompressed"].set_index(["model", "batch", "user"])
    rows = []
    for (model, batch, method), sub in epochs[epochs.method != "uncompressed"].groupby(
        ["model", "batch", "method"], sort=False
    ):
        ref = base.loc[[(model, batch, u) for u in sub.user]]
        comp = compression[(compression.model == model) & (compression.method == method)].iloc[0]
        row = dict(model=model, batch=batch, method=method, role=ROLE[method])
        row |= dict(detail=comp.detail, work_removed=1 - np.median(sub.gflops.to_numpy() / ref.gflops.to_numpy()))
        row |= dict(accuracy_lost=comp.accuracy_drop, within_budget=bool(comp.within_budget))
        rows.append(row | dict(time_saved=1 - np.median(sub.epoch_seconds.to_numpy() / ref.epoch_seconds.to_numpy())))
    return pd.DataFrame(rows)


def svd_ranks(variants: dict) -> pd.DataFrame:
    """Every re-training epoch of every SVD rank tried (`svd_rank.search`) and its held-out judgement."""
    rows = [{"model": MODEL_NAMES[k], **t.__dict__} for k, vs in variants.items() for v in vs for t in v.trials]
    return pd.DataFrame(rows)
