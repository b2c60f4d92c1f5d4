"""DeepType D6 (Table 2): on-device optimisations of personal training, each alone and combined.

Variants of one personal epoch from each seed's cached global model (stand-in data: Shakespeare
roles as users, as in D3):

- `baseline`: the un-optimised personal model (D3's incremental training: all layers, the
  task's batching, which sorts by length within windows of 50 batches);
- `fine_tune`: only the softmax trains (`techniques/deeptype/fine_tune.py`, Sec. 5.4);
- `svd`: the softmax factored by truncated SVD at t = `svd_rank_fraction` x hidden units, and
  the compressed global model re-trained on the crowd before personalization (Sec. 5.1, cached);
- `vocab`: the softmax cut to the words of the user's own history (Sec. 5.2);
- `bucketing`: batches of exactly equal length, no padding (Sec. 5.3);
- `combined`: all four, composed from the same transforms and hooks;
- `buckets_4`, `fixed_length`: the comparison batch sources of Sec. 5.3 (4 buckets 5/10/20/30,
  and every sample padded or cut to 30).

Training time = steady-state seconds per step (median after `warmup_steps`) x steps of the
epoch, every variant of a (seed, user) measured back to back in the same run, reported as a
ratio to the baseline. Timing numbers differ from run to run, so they are kept out of the
headline numbers, of `effects.csv` and of every displayed table: they are in tables whose timing
columns say "time"/"seconds" (`runs`, `table2`, `bucketing`, `timing_effects`), in run.json's
notes, in figures and in log lines. Accuracy (top-k-eff), model sizes and padding are
deterministic and carry the headline numbers and the effects.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ondevice import streams
from ondevice.data.typing_samples import Samples
from ondevice.device import tflite
from ondevice.report import claims, record
from ondevice.tasks.next_word import NextWordTask
from ondevice.papers.deeptype.techniques import bucketing as bk
from ondevice.papers.deeptype.techniques import svd_compression as svd
from ondevice.papers.deeptype.techniques import vocab_compression as vc
from ondevice.papers.deeptype.techniques.fine_tune import FineTune
from ondevice.papers.deeptype.techniques.incremental import personalize as incremental_training
from ondevice.training.trainer import StepTimer, Trainer
from ondevice.papers.deeptype import common
from ondevice.papers.deeptype.common import Corpus, GlobalModels, load_corpus, train_global  # noqa: F401  (stages the notebook calls)

NAME = "deeptype_ondevice_opt"

# variant -> (label, SVD softmax, vocabulary compression, fine-tune, batch source)
VARIANTS = {
    "baseline": ("personal model (baseline)", False, False, False, None),
    "fine_tune": ("fine-tune training", False, False, True, None),
    "svd": ("layer compression (SVD)", True, False, False, None),
    "vocab": ("vocabulary compression", False, True, False, None),
    "bucketing": ("fine-grained bucketing", False, False, False, "equal"),
    "combined": ("all combined", True, True, True, "equal"),
    "buckets_4": ("4 buckets (5/10/20/30)", False, False, False, "buckets"),
    "fixed_length": ("fixed length (30)", False, False, False, "fixed"),
}
TABLE2 = ("baseline", "fine_tune", "svd", "vocab", "bucketing", "combined")
# Table 2 (train 100K samples on a Nexus 6): top-3-eff, training time (h), model size (MB, None = "/")
PAPER_TABLE2 = {"baseline": (0.616, 3.79, 74.5), "fine_tune": (0.617, 2.17, None), "svd": (0.612, 2.97, 17.0),
                "vocab": (0.614, 2.63, 42.4), "bucketing": (0.616, 1.35, None), "combined": (0.605, 0.32, 13.8)}
SOURCE = "DeepType Table 2"


def _label(v: str) -> str:
    return VARIANTS[v][0]


PAPER = claims.Paper(
    citation="Xu et al., DeepType, IMWUT 2018, Sec. 5 and Table 2 (100K samples of one user, Nexus 6)",
    numbers=tuple(
        [claims.PaperNumber(f"top-k-eff, {_label(v)}", PAPER_TABLE2[v][0], SOURCE) for v in TABLE2]
        + [claims.PaperNumber(f"model size (MB), {_label(v)}", PAPER_TABLE2[v][2], SOURCE)
           for v in TABLE2 if PAPER_TABLE2[v][2] is not None]
        + [claims.PaperNumber("top-k-eff change, all combined", 0.605 / 0.616 - 1, "Table 2: 0.616 -> 0.605 (-1.8%)"),
           claims.PaperNumber("model size change, layer compression", 17.0 / 74.5 - 1, "Table 2: 74.5 -> 17.0 MB"),
           claims.PaperNumber("model size change, vocabulary compression", 42.4 / 74.5 - 1, "Table 2: 74.5 -> 42.4 MB"),
           claims.PaperNumber("model size change, all combined", 13.8 / 74.5 - 1, "Table 2: 74.5 -> 13.8 MB (-81.5%)")]),
    effects=(
        claims.Effect("layer compression shrinks the model", "model size (MB), personal model (baseline)",
                      "model size (MB), layer compression (SVD)"),
        claims.Effect("vocabulary compression shrinks the model", "model size (MB), personal model (baseline)",
                      "model size (MB), vocabulary compression"),
        claims.Effect("all combined shrinks the model", "model size (MB), personal model (baseline)",
                      "model size (MB), all combined"),
        claims.Effect("fine-tune training keeps top-k-eff", "top-k-eff, fine-tune training",
                      "top-k-eff, personal model (baseline)"),
        claims.Effect("fine-grained bucketing keeps top-k-eff", "top-k-eff, fine-grained bucketing",
                      "top-k-eff, personal model (baseline)"),
        claims.Effect("layer compression costs top-k-eff", "top-k-eff, personal model (baseline)",
                      "top-k-eff, layer compression (SVD)"),
        claims.Effect("vocabulary compression costs top-k-eff", "top-k-eff, personal model (baseline)",
                      "top-k-eff, vocabulary compression"),
        claims.Effect("all combined costs top-k-eff", "top-k-eff, personal model (baseline)", "top-k-eff, all combined"),
    ),
)
# Timing claims: better = the baseline's epoch time, worse = the technique's, so "holds" = faster.
PAPER_TIME = claims.Paper(
    citation=PAPER.citation,
    numbers=tuple(claims.PaperNumber(f"training time (h), {_label(v)}", PAPER_TABLE2[v][1], SOURCE) for v in TABLE2),
    effects=tuple(claims.Effect(f"{_label(v)} trains faster", "training time (h), personal model (baseline)",
                                f"training time (h), {_label(v)}") for v in TABLE2 if v != "baseline"),
)
# effects_table columns that carry timing measurements, renamed so they say so
_TIMING_COLUMNS = {"our change": "our change (epoch time)", "ci low": "ci low (epoch time)",
                   "ci high": "ci high (epoch time)", "users improved": "users faster (epoch time)",
                   "users worse": "users slower (epoch time)", "sign test p": "sign test p (epoch time)",
                   "verdict": "verdict (epoch time)"}


@dataclass(frozen=True)
class Params(common.DeepTypeParams):
    max_test_users: int = 0             # the first N test users of the split; 0 = all
    max_personal_samples: int = 0       # the user's first N training samples; 0 = all (smoke: fewer)
    personal_epochs: int = 1
    personal_batch_size: int = 16
    personal_learning_rate: float = 3e-4  # D3's choice on the validation users at default scale
    svd_rank_fraction: float = 0.1      # t / hidden units; the paper's 40 / 400
    svd_retrain_epochs: int = 1         # re-training of the compressed global model on the crowd
    buckets: tuple[int, ...] = (5, 10, 20, 30)
    fixed_length: int = 30
    warmup_steps: int = 5               # steps excluded from the steady-state step time
    tflite_variants: tuple[str, ...] = TABLE2
    tflite_check_steps: int = 3         # personal steps run both in TF and in the exported TFLite model
    bootstrap: int = 2000

    PRESETS = common.presets({
        "smoke": dict(max_test_users=2, max_personal_samples=640, seeds=1, tflite_variants=("combined",),
                      bootstrap=500),
        # three exports keep default under ~8 min (each conversion takes ~20-40 s here); the
        # combined one exercises every technique, `paper` exports all six Table 2 variants
        "default": dict(max_test_users=4, seeds=3, tflite_variants=("svd", "vocab", "combined")),
        "paper": dict(personal_epochs=5),
    })

    def check(self) -> None:
        super().check()
        self.require(self.max_test_users >= 0, "max_test_users", "must be >= 0 (0 = all)")
        self.require(self.max_test_users != 1, "max_test_users", "must be 0 or at least 2 (effects need 2 users)")
        self.require(self.max_personal_samples >= 0, "max_personal_samples", "must be >= 0 (0 = all)")
        self.require(self.personal_epochs >= 1, "personal_epochs", "must be at least 1")
        self.require(self.personal_batch_size >= 1, "personal_batch_size", "must be at least 1")
        self.require(self.personal_learning_rate > 0, "personal_learning_rate", "must be positive")
        self.require(0 < self.svd_rank_fraction <= 1, "svd_rank_fraction", "must be in (0, 1]")
        self.require(self.svd_retrain_epochs >= 0, "svd_retrain_epochs", "must be >= 0")
        self.require(len(self.buckets) >= 1 and list(self.buckets) == sorted(set(self.buckets)) and self.buckets[0] >= 1,
                     "buckets", "must be increasing positive lengths")
        self.require(self.fixed_length >= 1, "fixed_length", "must be at least 1")
        self.require(self.warmup_steps >= 0, "warmup_steps", "must be >= 0")
        self.require(all(v in VARIANTS for v in self.tflite_variants), "tflite_variants",
                     f"must name variants among {list(VARIANTS)}")
        self.require(self.tflite_check_steps >= 0, "tflite_check_steps", "must be >= 0 (0 = skip)")
        self.require(self.bootstrap >= 100, "bootstrap", "must be at least 100 resamples")

    @property
    def svd_rank(self) -> int:
        return svd.rank_for(self.hidden_units, self.svd_rank_fraction)

    def chosen_users(self, corpus: Corpus) -> list[str]:
        users = list(corpus.split.test)
        return users[: self.max_test_users] if self.max_test_users else users

    def personal_data(self, corpus: Corpus, user: str) -> tuple[Samples, Samples]:
        """The user's training samples (the first `max_personal_samples` when set) and test samples."""
        train, test = corpus.personal(user, self.personal_train_fraction)
        if self.max_personal_samples and len(train) > self.max_personal_samples:
            train = first_samples(train, self.max_personal_samples)
        return train, test


def first_samples(samples: Samples, n: int) -> Samples:
    """The first n samples (the user's earliest words)."""
    end = samples.offsets[n]
    return Samples(samples.inputs[:end], samples.labels[:end], samples.offsets[: n + 1], samples.n_context[:n],
                   samples.word_len[:n], samples.target[:n])


@dataclass
class Compressed:
    """Each seed's SVD-compressed global model, re-trained on the crowd (from the model cache)."""

    model: object
    rank: int
    weights: dict
    entries: dict

    def cache(self) -> pd.DataFrame:
        return pd.DataFrame([{"seed": s, "rank": self.rank, "from_cache": e.hit, "train_seconds": e.info["train_seconds"],
                              "key": e.key[:16]} for s, e in self.entries.items()])

    def history(self) -> pd.DataFrame:
        return pd.DataFrame([{"phase": "svd re-training", "seed": s, **h}
                             for s, e in self.entries.items() for h in e.info["history"]])


def compress_global(params: Params, corpus: Corpus, models: GlobalModels, log=print) -> Compressed:
    """SVD layer compression of every seed's global model, then re-training on the crowd (Sec. 5.1)."""
    task = NextWordTask(params.k)
    entries = {}
    for seed in params.seed_list:
        models.model.set_weights(models.weights[seed])
        entries[seed] = svd.retrain_global(
            models.model, models.entries[seed].key, params.svd_rank, corpus.crowd_samples, task,
            epochs=params.svd_retrain_epochs, batch_size=params.global_batch_size,
            learning_rate=params.global_learning_rate, optimizer=params.optimizer,
            rng_factory=lambda s=seed: streams.rng(s, "batches/svd_retrain"), log=log)
    shape = svd.compress(models.model, params.svd_rank)
    return Compressed(shape, params.svd_rank, {s: e.weights for s, e in entries.items()}, entries)


def batch_hook(params: Params, source: str | None):
    if source is None:
        return None
    return {"equal": bk.EqualLength(), "buckets": bk.FixedBuckets(tuple(params.buckets)),
            "fixed": bk.FixedBuckets((params.fixed_length,))}[source]


class Personal:
    """Builds, trains and scores the personal model of one (seed, user, variant)."""

    def __init__(self, params: Params, corpus: Corpus, models: GlobalModels, compressed: Compressed):
        self.params, self.corpus, self.models, self.compressed = params, corpus, models, compressed
        self.task = NextWordTask(params.k)
        self._trainers: dict[str, Trainer] = {}

    def hooks(self, variant: str) -> list:
        _, _, _, fine_tune, source = VARIANTS[variant]
        hooks = [FineTune()] if fine_tune else []
        hook = batch_hook(self.params, source)
        return hooks + ([hook] if hook is not None else [])

    def setup(self, variant: str, seed: int, train: Samples, test: Samples):
        """(model with its starting weights set, starting weights, train, test, vocabulary map)."""
        _, use_svd, use_vocab, _, _ = VARIANTS[variant]
        base, weights = (self.compressed.model, self.compressed.weights[seed]) if use_svd else \
            (self.models.model, self.models.weights[seed])
        base.set_weights(weights)
        if not use_vocab:
            return base, weights, train, test, None
        vmap = vc.VocabMap.from_history(train, self.corpus.vocab.size)
        model = vc.compress(base, vmap)
        return model, model.get_weights(), vmap.remap(train), vmap.remap(test), vmap

    def trainer(self, variant: str, model) -> Trainer:
        p = self.params
        if VARIANTS[variant][2]:  # vocabulary compression: a model of the user's own size
            return Trainer(model, self.task, p.personal_learning_rate, p.optimizer, self.hooks(variant), p.warmup_steps)
        if variant not in self._trainers:
            self._trainers[variant] = Trainer(model, self.task, p.personal_learning_rate, p.optimizer,
                                              self.hooks(variant), p.warmup_steps)
        return self._trainers[variant]

    def batches(self, variant: str, data: Samples, rng) -> list:
        hook = batch_hook(self.params, VARIANTS[variant][4])
        source = hook.batches(self.task, data, self.params.personal_batch_size, rng) if hook else None
        return list(source) if source is not None else list(self.task.batches(data, self.params.personal_batch_size, rng))

    def run(self, variant: str, seed: int, user: str, train: Samples, test: Samples) -> dict:
        p = self.params
        model, weights, train, test, vmap = self.setup(variant, seed, train, test)
        trainer = self.trainer(variant, model)
        trainer.timer = StepTimer(p.warmup_steps)
        rng = lambda: streams.rng(seed, f"personal/{user}")  # the same batch order for every variant
        history = incremental_training(trainer, weights, train, p.personal_epochs, p.personal_batch_size, rng())
        scores = self.task.evaluate(trainer.model, test)
        card = common.model_card(trainer.model)
        steps = history[0]["steps"]
        steady = trainer.timer.steady()
        pad = bk.padding_stats(self.batches(variant, train, rng()))
        return {"seed": seed, "user": user, "variant": variant, "label": _label(variant),
                "train_samples": len(train), "test_samples": len(test),
                "top_k_eff": scores["top_k_eff"], "perplexity": scores["perplexity"],
                "test_oov_or_unseen_rate": float(np.mean(test.target == 1)),
                "output_words": int(vmap.size if vmap else self.corpus.vocab.size),
                "parameters": card["parameters"], "size_mb": card["size_mb"],
                "trained_parameters": int(sum(np.prod(v.shape) for v in trainer.variables)),
                "steps": steps, **pad, "final_loss": history[-1]["loss"],
                "steady_step_seconds": steady, "epoch_time_seconds": steady * steps,
                "epoch_wall_seconds": history[0]["seconds"]}


def personalize(params: Params, corpus: Corpus, models: GlobalModels, compressed: Compressed, log=print) -> list[dict]:
    """Every seed, every chosen test user, every variant back to back (so timing is comparable)."""
    personal = Personal(params, corpus, models, compressed)
    users = params.chosen_users(corpus)
    rows = []
    for seed in params.seed_list:
        for n, user in enumerate(users, 1):
            train, test = params.personal_data(corpus, user)
            for variant in VARIANTS:
                row = personal.run(variant, seed, user, train, test)
                rows.append(row)
                log(f"seed {seed} user {n}/{len(users)} {user} {variant}: top-{params.k}-eff {row['top_k_eff']:.4f}, "
                    f"{row['parameters']:,} parameters, {row['steps']} steps, padded {row['padded_fraction']:.1%} "
                    f"(epoch {row['epoch_time_seconds']:.1f}s)")
    return rows


def on_device(params: Params, corpus: Corpus, models: GlobalModels, compressed: Compressed, log=print):
    """Export each of `tflite_variants` (first test user, first seed) as a trainable TFLite file and
    run its first personal steps in TensorFlow and through the interpreter from the same weights on
    the same batches. Trains copies from its own random stream, so it changes no result."""
    if not params.tflite_check_steps or not params.tflite_variants:
        return None, {}
    personal = Personal(params, corpus, models, compressed)
    user = params.chosen_users(corpus)[0]
    raw_train, raw_test = params.personal_data(corpus, user)
    rows, files = [], {}
    for variant in params.tflite_variants:
        model, weights, train, _, _ = personal.setup(variant, params.seed, raw_train, raw_test)
        batches = personal.batches(variant, train, streams.rng(params.seed, "diagnostics/tflite"))[: params.tflite_check_steps]
        check = tflite.compare_training(model, personal.task, params.personal_learning_rate, batches, params.optimizer,
                                        personal.hooks(variant))
        out = float(np.abs(check["outputs_tflite"] - check["outputs_tensorflow"]).max())
        for step, (a, b) in enumerate(zip(check["tensorflow"], check["tflite"]), 1):
            rows.append({"variant": variant, "step": step, "loss_tensorflow": a, "loss_tflite": b,
                         "abs_difference": abs(a - b), "max_output_difference": out})
        files[f"deeptype_{variant}_trainable.tflite"] = check["flatbuffer"]
        worst = max(abs(a - b) for a, b in zip(check["tensorflow"], check["tflite"]))
        log(f"on device, {variant}: {len(batches)} steps through TFLite ({len(check['flatbuffer']) / 1e6:.2f} MB file), "
            f"max |loss difference| {worst:.1e}, max |output difference| {out:.1e}")
    return pd.DataFrame(rows), files


def runs_table(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(rows)


def _wide(runs: pd.DataFrame, variant: str, column: str) -> np.ndarray:
    """(seeds, users) array of one variant's column."""
    return runs[runs.variant == variant].pivot(index="seed", columns="user", values=column).to_numpy()


def _per_seed_median(runs: pd.DataFrame, variant: str, column: str) -> np.ndarray:
    return np.median(_wide(runs, variant, column), axis=1)


def table2(runs: pd.DataFrame) -> pd.DataFrame:
    """Table 2 beside ours: medians over users, means over seeds; ratios per user to the baseline
    of the same seed and user (time ratio = baseline epoch time / variant epoch time)."""
    rows = []
    base_eff, base_size = _per_seed_median(runs, "baseline", "top_k_eff"), _per_seed_median(runs, "baseline", "size_mb")
    base_time = _wide(runs, "baseline", "epoch_time_seconds")
    for v in VARIANTS:
        eff, size = _per_seed_median(runs, v, "top_k_eff"), _per_seed_median(runs, v, "size_mb")
        speed = np.median(base_time / _wide(runs, v, "epoch_time_seconds"), axis=1)
        paper = PAPER_TABLE2.get(v, (None, None, None))
        rows.append({"variant": v, "label": _label(v), "top_k_eff": float(eff.mean()),
                     "top_k_eff_change": float((eff / base_eff - 1).mean()),
                     "size_mb": float(size.mean()), "size_change": float((size / base_size - 1).mean()),
                     "padded_fraction": float(runs[runs.variant == v].padded_fraction.mean()),
                     "steps_per_user": float(runs[runs.variant == v].steps.mean()),
                     "time_ratio_to_baseline": float(speed.mean()),
                     "paper_top_k_eff": paper[0], "paper_top_k_eff_change": paper[0] / 0.616 - 1 if paper[0] else None,
                     "paper_size_mb": paper[2], "paper_size_change": paper[2] / 74.5 - 1 if paper[2] else None,
                     "paper_training_time_h": paper[1], "paper_time_ratio_to_baseline": 3.79 / paper[1] if paper[1] else None})
    return pd.DataFrame(rows)


def bucketing_table(runs: pd.DataFrame) -> pd.DataFrame:
    """The batch sources of Sec. 5.3 side by side: padding, steps, time ratio to fixed length."""
    fixed = _wide(runs, "fixed_length", "epoch_time_seconds")
    rows = []
    for v in ("fixed_length", "buckets_4", "baseline", "bucketing"):
        sub = runs[runs.variant == v]
        rows.append({"batch source": _label(v) if v != "baseline" else "windows of 50 batches (baseline)",
                     "padded_fraction": float(sub.padded_fraction.mean()), "steps_per_user": float(sub.steps.mean()),
                     "time_ratio_to_fixed_length": float(np.median(fixed / _wide(runs, v, "epoch_time_seconds"), axis=1).mean())})
    return pd.DataFrame(rows)


def displayed(table: pd.DataFrame) -> pd.DataFrame:
    """A table without its timing columns (their values differ run to run; they are saved)."""
    return table[[c for c in table.columns if not any(w in c.lower() for w in ("time", "second"))]]


def conclude(params: Params, corpus: Corpus, models: GlobalModels, compressed: Compressed, rows: list[dict],
             on_device_table, files: dict, wall_time_s: float) -> record.Result:
    runs = runs_table(rows)
    t2 = table2(runs)
    base_eff = _per_seed_median(runs, "baseline", "top_k_eff")
    per_seed = {"top-k-eff, personal model (baseline)": base_eff,
                "top-k-eff change, all combined": _per_seed_median(runs, "combined", "top_k_eff") / base_eff - 1}
    base_size = _per_seed_median(runs, "baseline", "size_mb")
    for v, name in (("svd", "layer compression"), ("vocab", "vocabulary compression"), ("combined", "all combined")):
        per_seed[f"model size change, {name}"] = _per_seed_median(runs, v, "size_mb") / base_size - 1
    headline = {q: claims.headline(list(map(float, v))) for q, v in per_seed.items()}
    ours = {q: h["value"] for q, h in headline.items()}
    for v in TABLE2:
        ours[f"top-k-eff, {_label(v)}"] = float(_per_seed_median(runs, v, "top_k_eff").mean())
        ours[f"model size (MB), {_label(v)}"] = float(_per_seed_median(runs, v, "size_mb").mean())
    numbers = claims.paper_vs_ours(PAPER, ours)
    size, eff = (lambda v: _wide(runs, v, "size_mb")), (lambda v: _wide(runs, v, "top_k_eff"))
    measured = {
        "layer compression shrinks the model": (size("baseline"), size("svd")),
        "vocabulary compression shrinks the model": (size("baseline"), size("vocab")),
        "all combined shrinks the model": (size("baseline"), size("combined")),
        "fine-tune training keeps top-k-eff": (eff("fine_tune"), eff("baseline")),
        "fine-grained bucketing keeps top-k-eff": (eff("bucketing"), eff("baseline")),
        "layer compression costs top-k-eff": (eff("baseline"), eff("svd")),
        "vocabulary compression costs top-k-eff": (eff("baseline"), eff("vocab")),
        "all combined costs top-k-eff": (eff("baseline"), eff("combined")),
    }
    effects = claims.effects_table(PAPER, measured, streams.rng(params.seed, "bootstrap"), n_boot=params.bootstrap)
    epoch = lambda v: _wide(runs, v, "epoch_time_seconds")
    timing_measured = {f"{_label(v)} trains faster": (epoch("baseline"), epoch(v)) for v in TABLE2 if v != "baseline"}
    timing_effects = claims.effects_table(PAPER_TIME, timing_measured, streams.rng(params.seed, "bootstrap/time"),
                                          n_boot=params.bootstrap).rename(columns=_TIMING_COLUMNS)
    training = pd.concat([models.history(), compressed.history()])
    tables = {"data": corpus.table(), "runs": runs, "table2": t2, "bucketing": bucketing_table(runs),
              "training": training, "global_model_cache": models.cache(), "svd_model_cache": compressed.cache(),
              "headline": claims.headline_table(headline), "paper_vs_ours": numbers, "effects": effects,
              "timing_effects": timing_effects}
    if on_device_table is not None:
        tables["on_device"] = on_device_table
    speedups = {r.variant: r.time_ratio_to_baseline for r in t2.itertuples()}
    return record.Result(
        experiment=NAME, params=params.to_dict(), tables=tables, headline=headline, models=dict(files),
        artifacts={"split.json": corpus.split.to_dict()},
        data=[corpus.manifest.summary()], stand_in_data=corpus.manifest.stand_in_for, wall_time_s=wall_time_s,
        notes={"vocabulary_size": corpus.vocab.size, "svd_rank": compressed.rank, "split_digest": corpus.split.digest,
               "test_users": params.chosen_users(corpus), "seeds": params.seed_list,
               "personal_learning_rate": params.personal_learning_rate,
               "time_ratio_to_baseline (volatile)": speedups,
               "global_models_from_cache": models.from_cache,
               "svd_models_from_cache": {s: e.hit for s, e in compressed.entries.items()}},
    )


def run(params: Params, speeches=None, log=print) -> record.Result:
    """All stages in order, as the notebook runs them."""
    start = time.perf_counter()
    corpus = load_corpus(params, speeches, log)
    models = train_global(params, corpus, log)
    compressed = compress_global(params, corpus, models, log)
    rows = personalize(params, corpus, models, compressed, log)
    table, files = on_device(params, corpus, models, compressed, log)
    return conclude(params, corpus, models, compressed, rows, table, files, time.perf_counter() - start)


def log_timing(runs: pd.DataFrame, log=print) -> None:
    """Each variant's median epoch time beside the baseline's and the paper's hours, as log lines:
    timing differs run to run, so it is printed (and plotted), never displayed as a table."""
    for v in VARIANTS:
        base = float(np.median(_wide(runs, "baseline", "epoch_time_seconds")))
        ours = float(np.median(_wide(runs, v, "epoch_time_seconds")))
        paper = PAPER_TABLE2.get(v)
        paper = f"paper {paper[1]:.2f} h vs 3.79 h ({3.79 / paper[1]:.2f}x)" if paper else "paper: not in Table 2"
        log(f"{_label(v)}: {paper}; ours, median epoch over users and seeds: baseline ({base:.1f}s), "
            f"this variant ({ours:.1f}s)")


def plot_table2(table2_df: pd.DataFrame):
    """Three panels as Table 2: speed-up over the baseline, model size change, top-k-eff change;
    ours (bars) beside the paper's (black marks)."""
    import matplotlib.pyplot as plt

    t = table2_df[table2_df.variant.isin(TABLE2)].reset_index(drop=True)
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    panels = (("time_ratio_to_baseline", "paper_time_ratio_to_baseline", "speed-up over baseline (x)"),
              ("size_change", "paper_size_change", "model size change"),
              ("top_k_eff_change", "paper_top_k_eff_change", "top-k-eff change"))
    y = np.arange(len(t))
    for ax, (ours, paper, title) in zip(axes, panels):
        ax.barh(y, t[ours], color="#d1495b", label="ours")
        pv = pd.to_numeric(t[paper], errors="coerce")
        ax.scatter(pv, y, color="black", marker="|", s=250, label="paper", zorder=3)
        ax.set_yticks(y, t.label if ax is axes[0] else [""] * len(t))
        ax.set_title(title)
        ax.invert_yaxis()
    axes[0].axvline(1, color="0.6", lw=1, ls="--")
    axes[0].legend(frameon=False, loc="lower right")
    fig.tight_layout()
    return fig
