"""The SVD-compressed global models of DeepType's cloud (Sec. 5.1): every seed's global model
factored at `svd_rank` and re-trained on the crowd in the global regime
(`models.svd_compression.retrain_global`, cached), before it is sent to phones."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import tf_keras as keras

from ondevice import streams
from ondevice.models.svd_compression import compress, retrain_global
from ondevice.papers.deeptype import common
from ondevice.training.trainer import Plateau


@dataclass
class Compressed:
    """Each seed's SVD-compressed global model, re-trained on the crowd (from the model cache)."""

    model: keras.Model
    rank: int
    weights: dict
    entries: dict

    def cache(self) -> pd.DataFrame:
        """Per seed: the rank, cache hit, re-training rate, epochs run and kept, seconds, key."""
        rows = [
            {"seed": s, "rank": self.rank, "from_cache": e.hit, "learning_rate": e.info["fields"]["learning_rate"]}
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


def compress_globals(models, params, corpus, log=print) -> Compressed:
    """`retrain_global` for every seed's global model (`common.GlobalModels`) at `params.svd_rank`,
    in the global regime (batch, optimizer, clipping, plateau rule on the held-out global text) at
    the learning rate the global model's kept epoch trained with: re-training continues its
    schedule rather than restarting it, up to `svd_retrain_epochs`."""
    entries, stop = {}, Plateau(params.global_patience, params.global_min_improvement)
    for seed in params.seed_list:
        base = models.entries[seed]
        rate = common.global_rate(params, common.kept_epoch(base.info) or 1)
        training = dict(epochs=params.svd_retrain_epochs, batch_size=params.global_batch_size, learning_rate=rate)
        training.update(optimizer=params.optimizer, clip_norm=params.global_clip_norm)
        models.model.set_weights(models.weights[seed])
        rng = lambda s=seed: streams.rng(s, "batches/svd_retrain")  # noqa: E731
        args = (models.model, base.key, params.svd_rank, corpus.crowd_samples, common.global_task(params))
        entries[seed] = retrain_global(
            *args, rng_factory=rng, holdout=corpus.holdout_samples, stop=stop, log=log, **training
        )
    shape = compress(models.model, params.svd_rank)
    return Compressed(shape, params.svd_rank, {s: e.weights for s, e in entries.items()}, entries)
