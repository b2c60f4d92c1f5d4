"""AutLearn's online learning (Sec. 3.5): a user's stream predicted and learnt in order, the last
layer updated from the inference cache (`training.inference_reuse.OnlineTrainer`), with the
image update chosen on validation users."""

from __future__ import annotations

import numpy as np
import pandas as pd
import tensorflow as tf

from ondevice import streams
from ondevice.data.typing_samples import build_samples
from ondevice.papers.autlearn import common
from ondevice.papers.autlearn.common import LAST_LAYER, MODEL_NAMES
from ondevice.papers.autlearn.protocol import PersonalTrainer, setting, task
from ondevice.tasks.next_word import position_scores
from ondevice.training import selection
from ondevice.training.inference_reuse import OnlineTrainer

# The online update's candidates for images, "optimizer:rate", the more conservative first.
CANDIDATES = tuple(f"sgd:{r}" for r in ("0.001", "0.003", "0.01", "0.03", "0.1")) + tuple(
    f"adam:{r}" for r in ("0.0001", "0.0003", "0.001", "0.003")
)


def stream_pass(
    trainer: OnlineTrainer, start: list[np.ndarray], n: int, batch, hits, batch_size: int, train: bool
) -> tuple[np.ndarray, int]:
    """Online learning (Sec. 3.4): predict every sample of a stream of n in order with the model of
    that moment: `batch(idx)` gives (inputs, labels), `hits(logits, idx, labels)` 1/0 per sample
    (NaN: not scored). With `train`, each full buffer of `batch_size` then trains the last layer from
    the cached features (a last partial buffer is not trained on). Returns the hits and the updates."""
    trainer.reset(start)
    b = batch_size if train else max(batch_size, 256)  # no updates: the same predictions, faster
    out, steps = np.full(n, np.nan), 0
    for first in range(0, n, b):
        idx = np.arange(first, min(first + b, n))
        x, y = batch(idx)
        cached = trainer.infer_and_cache(x)
        out[idx] = hits(cached["logits"].numpy(), idx, y)
        if train and len(idx) == b:
            trainer.train_from_cache(cached["features"], y)
            steps += 1
    return out, steps


def stream_parts(hit: np.ndarray, last_fraction: float) -> dict[str, float]:
    """Top-1 over the scored samples of a stream, and over its last `last_fraction` of them."""
    scored = np.flatnonzero(~np.isnan(hit))
    last = scored[len(scored) - max(1, int(round(last_fraction * len(scored)))) :]
    return {"stream": float(hit[scored].mean()), "last": float(hit[last].mean())}


def stream_curve(hit: np.ndarray, points: int) -> list[dict]:
    """Cumulative top-1 at `points` evenly spaced positions of the scored samples."""
    scored = hit[~np.isnan(hit)]
    at = np.unique(np.linspace(0, len(scored), points + 1).round().astype(int)[1:])
    total = np.cumsum(scored)
    return [{"samples": int(p), "fraction": p / len(scored), "cumulative_top1": total[p - 1] / p} for p in at]


def online_trainer(params, kind: str, model, optimizer: str | None = None, learning_rate: float | None = None):
    """AutLearn's online trainer: the last layer trains from the features the prediction cached
    (DeepType's inference reuse), by the on-device step's optimizer and rate unless given."""
    s = setting(params, kind)
    opt, lr = optimizer or s.optimizer, learning_rate or s.learning_rate
    return OnlineTrainer(model, task(params, kind), lr, opt, head=LAST_LAYER[kind])


def text_stream(text: common.TextData, user: str):
    """A user's sentences in order (training part, then test part) as a stream (n, batch, hits):
    a sample is scored when it has a previous word (top-1 before any character is typed)."""
    samples = build_samples(text.train_sentences[user] + text.test_sentences[user], text.vocab, text.context_words)
    one = tf.constant(1)

    def hits(logits, idx, y):
        hit = position_scores(tf.constant(logits), tf.constant(y), one)[0].numpy()
        ctx = samples.n_context[idx]
        return np.where(ctx > 0, hit[np.arange(len(idx)), np.maximum(ctx - 1, 0)], np.nan)

    return len(samples), samples.padded, hits


def image_stream(x: np.ndarray, y: np.ndarray):
    """Images in order as a stream (n, batch, hits): every image is scored."""
    return len(y), lambda idx: (x[idx], y[idx]), lambda logits, idx, labels: (logits.argmax(1) == labels).astype(float)


def online_rows(params, kind: str, trainer, start, user_streams: dict, log):
    """Each user's stream (n, batch, hits) through `stream_pass` without and with online updates:
    a row per user and condition (top-1 over the stream and on its last part) and the curve."""
    rows, curve, model, p = [], [], MODEL_NAMES[kind], params
    for user, (n, batch, hits) in user_streams.items():
        for condition in ("pre-trained", "online"):
            hit, steps = stream_pass(trainer, start, n, batch, hits, p.online_batch_size, condition == "online")
            who = dict(model=model, user=user, condition=condition)
            scored = dict(stream_samples=n, scored_samples=int((~np.isnan(hit)).sum()), updates=steps)
            rows.append(who | scored | {f"top1_{k}": v for k, v in stream_parts(hit, p.last_fraction).items()})
            curve += [who | c for c in stream_curve(hit, p.curve_points)]
        before, after = rows[-2], rows[-1]
        log(
            f"{model} {user} ({n} samples): top-1 over the stream {before['top1_stream']:.4f} -> "
            f"{after['top1_stream']:.4f} online, last part {before['top1_last']:.4f} -> {after['top1_last']:.4f}"
        )
    return pd.DataFrame(rows), pd.DataFrame(curve)


def online_candidate(text: str) -> tuple[str, float] | None:
    """An online update "optimizer:rate" ('sgd:0.01' -> ('sgd', 0.01)); None when malformed."""
    name, _, rate = text.partition(":")
    try:
        value = float(rate)
    except ValueError:
        return None
    return (name, value) if name in ("sgd", "adam") and value > 0 else None


def image_roles(params, images: common.ImageData) -> dict[str, tuple[str, ...]]:
    """Writers by role, drawn at random from their own stream: "head" and "validation" (public,
    the cloud's) and "users" (the streaming users) for A4; the same for every seed."""
    order = streams.rng(params.seed, "autlearn/public-writers").permutation(len(images.users))
    n_public = max(2, min(len(order) - 2, round(params.image_public_fraction * len(order))))
    n_val = max(1, min(n_public - 1, round(params.image_validation_fraction * n_public)))
    pick = lambda idx: tuple(sorted(images.users[i] for i in idx))
    return {"head": pick(order[n_val:n_public]), "validation": pick(order[:n_val]), "users": pick(order[n_public:])}


def online_images(params, images: common.ImageData, pre: common.Pretrained, roles: dict, candidates, log):
    """A4 for MobileNet: the cloud trains the head on its public writers (`roles["head"]`) and
    chooses the online update among `candidates` on its validation writers by online's gain; each
    user's images in LEAF's order (training part, then test part) then stream through that head,
    with and without online updates. Returns the users' rows and curve, the selection table, the
    update chosen."""
    pooled = images.pooled(roles["head"], ("train", "test"))
    PersonalTrainer(params, "image", pre.model).fit(pre.weights, pooled, streams.rng(params.seed, "batches/cloud-head"))
    start = pre.model.get_weights()
    log(f"cloud head trained on {len(roles['head'])} public writers ({len(pooled[1])} images)")
    stream = lambda users: {u: image_stream(*images.pooled([u], ("train", "test"))) for u in users}
    trainer = lambda candidate: online_trainer(params, "image", pre.model, *online_candidate(candidate))

    def gain(candidate: dict) -> float:
        update, quiet = trainer(candidate["update"]), lambda _: None
        rows, _ = online_rows(params, "image", update, start, stream(roles["validation"]), quiet)
        wide = rows.pivot(index="user", columns="condition", values="top1_stream")
        return float((wide["online"] - wide["pre-trained"]).mean())

    best, table = selection.select([{"update": c} for c in candidates], gain, log)
    table = table.rename(columns={"score": "validation gain (top-1, absolute)"})
    rows, curve = online_rows(params, "image", trainer(best["update"]), start, stream(roles["users"]), log)
    return rows, curve, table, best["update"]
