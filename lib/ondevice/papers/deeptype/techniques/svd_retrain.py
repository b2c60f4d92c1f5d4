"""The SVD-compressed global models of DeepType's cloud (Sec. 5.1): a global model factored at a
rank (`models.svd_compression.compress`) and re-trained on the crowd, to a plateau on held-out
text, once per machine (`retrain_global`, model cache); `compress_globals` does it for every
seed's global model in the global regime, before the models are sent to phones. With an
`embedding_rank`, the global model's embedding is factored first (`models.svd_embedding`, the
reading of Sec. 5.1 that Table 2's sizes fit), and the re-training starts from that model."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import tf_keras as keras

from ondevice import streams
from ondevice.models import svd_embedding
from ondevice.models.svd_compression import compress
from ondevice.papers.deeptype import common
from ondevice.training import model_cache
from ondevice.training.trainer import Plateau, Trainer

# code whose change must invalidate a re-trained compressed model (the training loop and task)
RETRAIN_CODE = ("ondevice.training.trainer", "ondevice.tasks.next_word", "ondevice.models.lstm_lm", "ondevice.streams")
RETRAIN_CODE += ("ondevice.models.svd_compression",)
TRAINING = ("epochs", "batch_size", "learning_rate", "optimizer", "clip_norm")


def retrain_global(
    model: keras.Model,
    base_key: str,
    rank: int,
    crowd,
    task,
    *,
    rng_factory: Callable,
    holdout=None,
    stop: Plateau | None = None,
    log=print,
    **training,
) -> model_cache.Entry:
    """Compress the (global) `model` at `rank`, re-train it on the crowd (`training`: epochs,
    batch_size, learning_rate, optimizer, clip_norm), cached: the key holds the base model's key,
    the rank, `training`, the stop rule, the task's loss, the data's digests and the code. With
    `holdout` and `stop`, `epochs` is a cap: re-training ends on the held-out loss's plateau and
    keeps that epoch's weights; epoch 0 of the history is the compressed model before any
    re-training. `rng_factory()` gives the batch order (called only when training). Returns the
    entry; its weights fit `compress(model, rank)`."""
    epochs, batch_size, learning_rate, optimizer, clip_norm = (training[k] for k in TRAINING)
    if stop is not None and holdout is None:
        raise ValueError("a stop rule needs held-out text")

    def train():
        compressed = compress(model, rank)
        trainer = Trainer(compressed, task, learning_rate, optimizer, clip_norm=clip_norm)
        label = f"SVD t={rank} re-training"
        held = (lambda m: {"holdout_loss": float(np.log(task.evaluate(m, holdout)["perplexity"]))}) if holdout else None
        args = (epochs, batch_size, rng_factory(), log, label, held, stop, held is not None)
        history = trainer.fit(crowd, *args) if epochs else []
        return compressed.get_weights(), {"history": list(history), "kept_epoch": getattr(history, "best_epoch", None)}

    fields = {"base_key": base_key, "rank": rank, **{k: training[k] for k in TRAINING}, "k": getattr(task, "k", None)}
    fields.update(loss_per=getattr(task, "loss_per", "position"), stop=repr(stop))
    name, data = "deeptype_global_svd", [crowd.digest()] + ([holdout.digest()] if holdout else [])
    return model_cache.cached_train(name, fields, data, RETRAIN_CODE, train, log, sources=(retrain_global,))


@dataclass
class Compressed:
    """Each seed's SVD-compressed global model, re-trained on the crowd (from the model cache)."""

    model: keras.Model
    rank: int
    weights: dict
    entries: dict
    embedding_rank: int = 0  # 0: the softmax alone is factored

    def cache(self) -> pd.DataFrame:
        """Per seed: the rank, cache hit, re-training rate, epochs run and kept, seconds, key."""
        rows = [
            {"seed": s, "rank": self.rank, "embedding_rank": self.embedding_rank, "from_cache": e.hit}
            | {"learning_rate": e.info["fields"]["learning_rate"]}
            | {"epochs": max(0, len(e.info["history"]) - 1), "kept_epoch": e.info.get("kept_epoch")}
            | {"train_seconds": e.info["train_seconds"], "key": e.key[:16]}
            for s, e in self.entries.items()
        ]
        return pd.DataFrame(rows)

    def history(self) -> pd.DataFrame:
        rows = [
            {"phase": "svd re-training", "seed": s, **h} for s, e in self.entries.items() for h in e.info["history"]
        ]
        return pd.DataFrame(rows)


def kept_loss(entry: model_cache.Entry) -> float | None:
    """The held-out loss of the epoch a re-training kept (None without a hold-out curve)."""
    info = entry.info
    kept = [h["holdout_loss"] for h in info["history"] if h["epoch"] == info.get("kept_epoch")]
    return float(kept[0]) if kept else None


def retrain_seed(models, params, corpus, seed: int, rank: int, log=print, embedding_rank: int = 0) -> model_cache.Entry:
    """`retrain_global` of one seed's global model (`common.GlobalModels`) at `rank`, in the global
    regime (batch, optimizer, clipping, plateau rule on the held-out global text) at the learning
    rate the global model's kept epoch trained with: re-training continues its schedule rather
    than restarting it, up to `svd_retrain_epochs`. With `embedding_rank`, from the global model
    with its embedding factored at that rank (its key names the rank and the factoring code)."""
    base, stop = models.entries[seed], Plateau(params.global_patience, params.global_min_improvement)
    rate = common.global_rate(params, common.kept_epoch(base.info) or 1)
    training = dict(epochs=params.svd_retrain_epochs, batch_size=params.global_batch_size, learning_rate=rate)
    training.update(optimizer=params.optimizer, clip_norm=params.global_clip_norm)
    models.model.set_weights(models.weights[seed])
    start, key = models.model, base.key
    if embedding_rank:
        start = svd_embedding.compress_embedding(models.model, embedding_rank)
        code = model_cache.code_digest([Path(svd_embedding.__file__)])
        key = f"{base.key} embedding t={embedding_rank} {code}"
    rng = lambda: streams.rng(seed, "batches/svd_retrain")  # noqa: E731
    args = (start, key, rank, corpus.crowd_samples, common.global_task(params))
    return retrain_global(*args, rng_factory=rng, holdout=corpus.holdout_samples, stop=stop, log=log, **training)


def compress_globals(models, params, corpus, rank: int, log=print, embedding_rank: int = 0) -> Compressed:
    """`retrain_seed` for every seed's global model at `rank` (and `embedding_rank`; cached)."""
    entries = {s: retrain_seed(models, params, corpus, s, rank, log, embedding_rank) for s in params.seed_list}
    start = svd_embedding.compress_embedding(models.model, embedding_rank) if embedding_rank else models.model
    shape = compress(start, rank)
    return Compressed(shape, rank, {s: e.weights for s, e in entries.items()}, entries, embedding_rank)
