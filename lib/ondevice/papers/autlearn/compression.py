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
from ondevice.models import svd_compression
from ondevice.papers.autlearn import cached_runs, common, retraining
from ondevice.papers.autlearn.common import LAST_LAYER, MODEL_NAMES
from ondevice.papers.autlearn.protocol import setting
from ondevice.papers.autlearn.retraining import Cloud
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
    rates: tuple = ()  # uncompressed: the re-training rates tried (`retraining.RateTrial`)
    checks: tuple = ()  # uncompressed: the re-training's known-answer control (`retraining.Check`)
    budget_from: float | None = None  # the accuracy the budget is judged from (None: the uncompressed model's)
    adaptation: retraining.Adaptation | None = None  # uncompressed MobileNet: re-trained on the cloud's data first


def subset(samples: Samples, n: int, rng) -> Samples:
    """`n` of the samples drawn at random, in their order (all when n is 0 or at least their number)."""
    return _apart(samples, n, rng)[0]


def _apart(samples: Samples, n: int, rng) -> tuple[Samples, Samples]:
    """(`subset(samples, n, rng)`, the samples it left out)."""
    if not n or n >= len(samples):
        return samples, _take(samples, np.arange(0))
    idx = np.sort(rng.choice(len(samples), n, replace=False))
    return _take(samples, idx), _take(samples, np.setdiff1d(np.arange(len(samples)), idx))


def _take(samples: Samples, idx: np.ndarray) -> Samples:
    spans = [slice(samples.offsets[j], samples.offsets[j + 1]) for j in idx]
    parts, labels = [samples.inputs[s] for s in spans], [samples.labels[s] for s in spans]
    offsets = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(samples.offsets.dtype)
    kept = (samples.n_context[idx], samples.word_len[idx], samples.target[idx])
    empty = lambda a, like: np.concatenate(a) if a else like[:0]
    return Samples(empty(parts, samples.inputs), empty(labels, samples.labels), offsets, *kept)


def cloud_text(params, text: common.TextData) -> Cloud:
    """The LSTM in the cloud: top-1 on `validation_samples` held-out public samples (the budget's),
    the rate chosen on `retrain_selection_samples` others, re-training on public samples by Adam."""
    holdout, rest = _apart(
        text.public_holdout, params.validation_samples, streams.rng(params.seed, "autlearn-cost/cloud-text")
    )
    if not len(rest):
        raise ValueError("'validation_samples' leaves no held-out public sample to choose the re-training rate on")
    selection = subset(rest, params.retrain_selection_samples, streams.rng(params.seed, "autlearn-cost/selection"))
    evaluate = lambda model: common.top1_text(model, holdout)

    def retrain(model, rate: float, tag: str = ""):
        """One re-training pass; a `tag` (the SVD's rank and epoch) draws its own public samples."""
        trainer = Trainer(model, NextWordTask(params.k), rate, "adam", hooks=[EqualLength()])
        draw = streams.rng(params.seed, "autlearn-cost/retrain-sample" + (f"/{tag}" if tag else ""))
        sub = subset(text.public_train, params.retrain_samples, draw)
        rng = streams.rng(params.seed, "autlearn-cost/retrain")
        trainer.fit(sub, params.retrain_epochs, params.pretrain_batch_size, rng)

    scores = lambda model: (evaluate(model), common.top1_text(model, selection))
    data = [text.public_train.digest()]
    return Cloud(
        evaluate,
        scores,
        cached_runs.stored_pass(
            "autlearn_retrain", _fields(params, "text"), data, CODE, retrain, (subset, _apart, _take)
        ),
    )


def cloud_image(params, images: common.ImageData, writers) -> Cloud:
    """MobileNet in the cloud: a backbone's score is the top-1 on the cloud writers' test images (the
    budget's held-out images) of a copy of its head fitted on their training images (features once),
    less a random `retrain_selection_fraction` of them, the selection hold-out. ImageNet is not here,
    so a pruned model re-trains (the paper: "after pruning the model must be re-trained") on those
    training images, every layer (BatchNorm in inference mode, `pruning.flatten`), by Adam."""
    (x, y), test, head_name = images.pooled(writers), images.pooled(writers, ("test",)), LAST_LAYER["image"]
    held = streams.rng(params.seed, "autlearn-cost/selection-images").random(len(y)) < params.retrain_selection_fraction
    train, selection = (x[~held], y[~held]), (x[held], y[held])
    s = setting(params, "image")

    def retrain(model, rate: float, tag: str = ""):
        trainer = Trainer(model, common.image_task(), rate, "adam")
        trainer.fit(train, params.retrain_epochs, 32, streams.rng(params.seed, f"autlearn-cost/retrain-image/{tag}"))

    def scores(model, parts=(test, selection)):
        feats, head = keras.Model(model.input, model.get_layer(head_name).input), _head_copy(model, head_name)
        f = lambda x: np.concatenate([feats(x[i : i + 256], training=False).numpy() for i in range(0, len(x), 256)])
        trainer = Trainer(
            head, ClassificationTask((head.input_shape[-1],), femnist.CLASSES), s.learning_rate, s.optimizer
        )
        rng = streams.rng(params.seed, "autlearn-cost/cloud-head")
        trainer.fit((f(train[0]), train[1]), params.cloud_head_epochs, s.batch_size, rng)
        return tuple(float((head(f(p[0]), training=False).numpy().argmax(-1) == p[1]).mean()) for p in parts)

    stored = cached_runs.stored_pass(
        "autlearn_retrain", _fields(params, "image"), [cached_runs.digest(train)], CODE, retrain, (common.image_task,)
    )
    return Cloud(lambda model: scores(model, (test,))[0], scores, stored)


# The code a stored re-training pass runs, and is keyed by (with `retrain` and its helpers): the
# training loop, the tasks' losses, the models' layers and the pruned copies' construction.
CODE = (
    "ondevice.training.trainer",
    "ondevice.training.bucketing",
    "ondevice.tasks.next_word",
    "ondevice.tasks.classification",
    "ondevice.streams",
    "ondevice.models.lstm_lm",
    "ondevice.models.mobilenet_v1",
    "ondevice.papers.autlearn.techniques.pruning",
)


def _fields(params, kind: str) -> dict:
    """Every parameter, so a stored re-training pass is never reused under another setting."""
    return {"kind": kind, **{k: v for k, v in vars(params).items() if not k.startswith("_")}}


def _head_copy(model: keras.Model, name: str) -> keras.Model:
    """The head alone on features, a copy starting from `model`'s head (scoring leaves `model` as it is)."""
    layer = model.get_layer(name)
    features = keras.Input((layer.input.shape[-1],), name="features")
    copy = type(layer).from_config(layer.get_config())
    head = keras.Model(features, copy(features))
    copy.set_weights(layer.get_weights())
    return head


def compress(params, kind: str, pre: common.Pretrained, cloud: Cloud, log=print):
    """The uncompressed public model and each compression within `max_accuracy_drop` of the
    re-training's reference (`retraining`), and the structured search's rounds: the paper's structured
    pruning (`_structured`) for both models; for the LSTM also DeepType's SVD of the softmax
    (re-trained, its rank chosen by `svd_rank.search`) and, as our ablation, magnitude pruning (not
    re-trained: judged from the uncompressed model; the highest tried sparsity within the budget;
    zeroed weights remove no work). MobileNet's FC head (256 x 62) is too small for SVD or sparsity
    to matter. MobileNet is first re-trained on the cloud's images to its plateau (`retraining.adapt`),
    and that model is the uncompressed one."""
    pre.model.set_weights(pre.weights)
    base = pruning.flatten(pre.model) if kind == "image" else retraining.copy(pre.model)
    name, head, detail, adapted = MODEL_NAMES[kind], LAST_LAYER[kind], "the public pre-trained model", None
    log_ = lambda m: log(f"{name}: {m}")
    if kind == "image":
        rule = (params.image_retrain_rates, params.adapt_max_epochs, params.retrain_patience)
        adapted = retraining.adapt(base, cloud, *rule, log_)
        detail += f", re-trained {adapted.epochs} epoch(s) on the cloud's images at rate {adapted.rate:g}"
    base_acc = cloud.evaluate(base)
    uncompressed = Compressed(kind, "uncompressed", base, detail, base_acc, head, adaptation=adapted)
    pruned, rounds, rate = _structured(params, kind, uncompressed, cloud, log_)
    variants = [uncompressed, pruned]
    if kind == "text":
        drop, tags = params.max_accuracy_drop, _svd_tags(params, base)
        checks = retraining.control(base, cloud, rate, base_acc, drop, tags, log_)
        uncompressed.checks += tuple(checks)
        retrain = lambda model, tag: cloud.retrain(model, rate, tag)
        variants += [
            _svd(params, base, cloud.evaluate, retrain, retraining.reference(base_acc, checks), log_),
            _magnitude(params, base, cloud.evaluate, base_acc, log_),
        ]
    return variants, [{"model": name, **r.__dict__} for r in rounds]


def _structured(params, kind: str, uncompressed: Compressed, cloud: Cloud, log):
    """(the paper's structured pruning, `pruning.search`, its rounds, the re-training rate): the rate
    `retraining.choose_rate` picks on the first round's pruned model, each round re-trained to a
    plateau of the selection hold-out and judged from the epoch-matched control
    (`retraining.EpochControl`); the rate trials and the control's rows are kept on `uncompressed`.
    MobileNet's rounds try the `prune_candidates` layers with the most FLOPs (0: all)."""
    base, base_acc, drop = uncompressed.model, uncompressed.val_top1, params.max_accuracy_drop
    rule = dict(layers=pruning.candidates(base), max_candidates=params.prune_candidates if kind == "image" else 0)
    select, step = (lambda model: cloud.scores(model)[1]), params.prune_step * pruning.forward_flops(base)
    first = pruning.ranked(base, rule["layers"], step, select, rule["max_candidates"])[1]
    rates = params.text_retrain_rates if kind == "text" else params.image_retrain_rates
    rate, trials = retraining.choose_rate(first[0][3] if first else base, cloud, rates, log)
    control = retraining.EpochControl(base, cloud, rate, base_acc, drop, log)
    epochs, patience = params.retrain_max_epochs, params.retrain_patience
    plateau = lambda model, done: retraining.to_plateau(model, cloud, rate, done, epochs, patience)
    search = dict(step=params.prune_step, max_drop=drop, reference=control.reference, log=log)
    best, rounds = pruning.search(base, cloud.scores, plateau, **search, **rule)
    uncompressed.rates, uncompressed.checks = tuple(trials), tuple(control.checks())
    w = lambda model, n: pruning.width(model.get_layer(n))
    widths = ", ".join(f"{n} {w(base, n)}->{w(best, n)}" for n in rule["layers"] if w(base, n) != w(best, n))
    kept = [r for r in rounds if r.within_budget]
    acc = kept[-1].val_accuracy if kept else base_acc
    pruned = Compressed(kind, "structured pruning", best, widths or "no round within the budget", acc, LAST_LAYER[kind])
    pruned.budget_from = kept[-1].budget_from if kept else None
    return pruned, rounds, rate


def _svd_tags(params, base) -> tuple[str, ...]:
    """The samples' draws of the SVD's re-training epochs at its largest rank (`svd_rank.search`)."""
    hidden = int(base.get_layer(svd_compression.SOFTMAX).input_shape[-1])
    largest = max(svd_compression.rank_for(hidden, f) for f in params.svd_fractions)
    return tuple(f"svd/{largest}/{e}" for e in range(1, params.svd_retrain_epochs + 1))


def _svd(params, base, evaluate, retrain, base_acc: float, log) -> Compressed:
    """DeepType's SVD of the softmax at the rank `svd_rank.search` chooses, re-trained; its budget is
    judged from `base_acc`."""
    hidden = int(base.get_layer(svd_compression.SOFTMAX).input_shape[-1])
    ranks = [svd_compression.rank_for(hidden, f) for f in params.svd_fractions]
    rule = dict(max_drop=params.max_accuracy_drop, max_epochs=params.svd_retrain_epochs, log=log)
    choice, trials = svd_rank.search(base, ranks, evaluate, retrain, base_acc, **rule)
    detail = f"softmax rank {choice.rank} of {hidden}" + ("" if choice.within_budget else ", outside the budget")
    head, inside = svd_compression.SOFTMAX, choice.within_budget
    svd = Compressed("text", "SVD", choice.model, detail, choice.val_accuracy, head, inside, tuple(trials))
    svd.budget_from = base_acc
    return svd


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


def retrain_control(variants: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the re-training rates tried per model, the known-answer control with its verdict)."""
    rows = lambda field: [
        {"model": MODEL_NAMES[k], **r.__dict__} for k, vs in variants.items() for r in getattr(vs[0], field)
    ]
    checks = pd.DataFrame(rows("checks"))
    verdict = lambda ok: "holds: re-training loses nothing" if ok else "FAILS: the re-training itself loses accuracy"
    return pd.DataFrame(rows("rates")), checks.assign(verdict=checks.within_budget.map(verdict))


def adaptation(variants: dict) -> pd.DataFrame:
    """The uncompressed models' re-training on the cloud's data before compression (`retraining.adapt`)."""
    adapted = [(MODEL_NAMES[k], vs[0].adaptation) for k, vs in variants.items() if vs[0].adaptation is not None]
    return pd.DataFrame([row for name, a in adapted for row in a.rows(name)])


def svd_ranks(variants: dict) -> pd.DataFrame:
    """Every re-training epoch of every SVD rank tried (`svd_rank.search`) and its held-out judgement."""
    rows = [{"model": MODEL_NAMES[k], **t.__dict__} for k, vs in variants.items() for v in vs for t in v.trials]
    return pd.DataFrame(rows)
