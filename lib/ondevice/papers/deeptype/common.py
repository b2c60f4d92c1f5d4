"""What every DeepType notebook shares beyond the typing protocol (`tasks.typing_protocol`) and its
data (`data.per_user_text`): the personal and global next-word tasks, and the global model trained
on the global text to a plateau of held-out global text (cached: trained once per machine, not
once per notebook)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ondevice import streams
from ondevice.data.per_user_text import Corpus
from ondevice.tasks.next_word import NextWordTask
from ondevice.tasks.typing_protocol import DeepTypeParams, build_model
from ondevice.training import model_cache
from ondevice.training.trainer import Plateau, Trainer, seed_everything

# What decides the global model's weights besides the seed, the split, the data and the code.
TRAINING_CODE = ("ondevice.training.trainer", "ondevice.tasks.next_word", "ondevice.models.lstm_lm", "ondevice.streams")
GLOBAL_FIELDS = tuple(
    "vocab_size embedding_dim hidden_units lstm_layers context_words crowd_max_words global_epochs global_batch_size "
    "global_learning_rate optimizer global_holdout_words global_patience global_min_improvement global_clip_norm "
    "global_lr_decay global_decay_after dropout global_loss_per".split()
)


def task(params: DeepTypeParams) -> NextWordTask:
    """The next-word task of personal (on-device) training, with its loss (`personal_loss_per`)."""
    return NextWordTask(params.k, loss_per=params.personal_loss_per)


def global_task(params: DeepTypeParams) -> NextWordTask:
    """The next-word task of global training, with its loss (`global_loss_per`)."""
    return NextWordTask(params.k, loss_per=params.global_loss_per)


def global_trainer(params: DeepTypeParams, model) -> tuple[Trainer, object]:
    """A trainer in the global regime and its per-epoch learning rate (constant, then decayed)."""
    rate, clip = params.global_learning_rate, params.global_clip_norm
    trainer = Trainer(model, global_task(params), rate, params.optimizer, clip_norm=clip)
    decay = params.global_lr_decay
    return trainer, lambda epoch: params.global_learning_rate * decay ** max(0, epoch - params.global_decay_after)


def global_rate(params: DeepTypeParams, epoch: int) -> float:
    """The global regime's learning rate in a (1-based) epoch: constant, then decayed (PTB); the
    schedule `global_trainer` returns (kept apart from it: its source is in the models' cache key)."""
    return params.global_learning_rate * params.global_lr_decay ** max(0, epoch - params.global_decay_after)


def model_card(model) -> dict:
    """Parameter count and float32 size, the numbers DeepType's Table 2 reports per model."""
    n = int(sum(np.prod(w.shape) for w in model.weights))
    layers = [{"layer": x.name, "type": type(x).__name__, "parameters": x.count_params()} for x in model.layers]
    return {"parameters": n, "size_mb": n * 4 / 1e6, "layers": layers}


def global_model(params: DeepTypeParams, corpus: Corpus, seed: int, log=print) -> model_cache.Entry:
    """The global model of one seed, trained on the global text (batch 128) until the hold-out loss
    improves by less than `global_min_improvement` (relative) for `global_patience` epochs, or for
    `global_epochs`; it keeps the last improving epoch's weights. From the cache if it exists."""

    def train():
        (trainer, schedule), held = global_trainer(params, build_model(params, corpus, seed)), corpus.holdout_samples
        scores = lambda m: {"holdout_loss": float(np.log(trainer.task.evaluate(m, held)["perplexity"]))}
        evaluate = scores if held else None
        stop = Plateau(params.global_patience, params.global_min_improvement) if held else None
        rng, label = streams.rng(seed, "batches/global"), f"global {corpus.global_text} (seed {seed})"
        args = (params.global_epochs, params.global_batch_size, rng, log, label, evaluate, stop)
        history, model = trainer.fit(corpus.crowd_samples, *args, schedule=schedule), trainer.model
        # reported: the epoch of the lowest hold-out loss (without a hold-out: the last epoch)
        best = int(np.argmin([h.get("holdout_loss", -h["epoch"]) for h in history])) + 1
        return model.get_weights(), {"history": list(history), "best_epoch": best, "plateau": history.plateau}

    fields = {name: getattr(params, name) for name in GLOBAL_FIELDS}
    fields.update(seed=seed, k=params.k, global_text=corpus.global_text)
    data = [a.sha256 for m in corpus.manifests for a in m.artifacts] + [corpus.crowd_samples.digest()]
    data += [corpus.holdout_samples.digest()] if corpus.holdout_samples is not None else []
    name = f"deeptype_global_{corpus.global_text}"
    return model_cache.cached_train(
        name, fields, data, TRAINING_CODE, train, log, sources=(global_model, global_trainer, global_task)
    )


@dataclass
class GlobalModels:
    """The trained global models (from the model cache or trained now), per run seed, and the
    Keras model whose weights are swapped in per seed. Seeds beyond `global_seeds` share a model."""

    model: object
    weights: dict[int, list[np.ndarray]]  # every run seed -> the weights of its global model
    entries: dict[int, model_cache.Entry]  # every run seed -> its global model's cache entry

    @property
    def from_cache(self) -> dict[int, bool]:
        return {s: e.hit for s, e in self.entries.items()}

    def unique(self) -> dict[int, model_cache.Entry]:
        """Each distinct global model once, under the first seed that uses it."""
        first: dict[str, int] = {}
        for s, e in self.entries.items():
            first.setdefault(e.key, s)
        return {s: self.entries[s] for s in first.values()}

    def history(self) -> pd.DataFrame:
        return pd.DataFrame(
            [
                {"phase": "global", "seed": s, "user": "", **h}
                for s, e in self.unique().items()
                for h in e.info["history"]
            ]
        )

    def cache(self) -> pd.DataFrame:
        """Each distinct global model: from the cache or not, epochs run, the epoch whose weights it
        keeps (the plateau rule's last improving one), the epoch of the lowest hold-out loss (later
        epochs may lower it by less than `global_min_improvement`), plateau reached, seeds, key."""
        columns = "seed from_cache epochs kept_epoch lowest_holdout_epoch plateau used_by_seeds train_seconds key"
        seeds = lambda e: [t for t, f in self.entries.items() if f.key == e.key]
        rows = [
            (s, e.hit, len(e.info["history"]), kept_epoch(e.info), e.info.get("best_epoch"), e.info.get("plateau"))
            + (seeds(e), e.info["train_seconds"], e.key[:16])
            for s, e in self.unique().items()
        ]
        return pd.DataFrame(rows, columns=columns.split())


def kept_epoch(info: dict) -> int | None:
    """The epoch whose weights a cached global model holds: its hold-out curve replayed through the
    plateau rule it was trained with (None without a hold-out)."""
    history, fields = info["history"], info.get("fields", {})
    if not history or "holdout_loss" not in history[0]:
        return None
    watch = Plateau(fields["global_patience"], fields["global_min_improvement"]).watch()
    no_weights = type("NoWeights", (), {"get_weights": lambda self: []})()
    for h in history:
        if watch.update(h["holdout_loss"], h["epoch"], no_weights):
            break
    return watch.epoch


def train_global(params: DeepTypeParams, corpus: Corpus, log=print) -> GlobalModels:
    """The global models (one per global seed), trained once per machine (model cache); run seed
    number i uses global model i % global_seeds."""
    seed_everything(params.seed)
    global_seeds = params.seed_list[: min(params.global_seeds, params.seeds)]
    trained = {s: global_model(params, corpus, s, log) for s in global_seeds}
    entries = {s: trained[global_seeds[i % len(global_seeds)]] for i, s in enumerate(params.seed_list)}
    return GlobalModels(build_model(params, corpus, params.seed), {s: e.weights for s, e in entries.items()}, entries)
