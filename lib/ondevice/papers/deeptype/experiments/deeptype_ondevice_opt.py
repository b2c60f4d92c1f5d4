"""DeepType D6 (Table 2): on-device optimisations of personal training, each alone and combined.

One personal epoch from each seed's cached global model (Shakespeare roles as users, as in D3)
per variant of `techniques/combined.py`: the baseline, each technique alone, all combined, and
the comparison batch sources of Sec. 5.3; the SVD global model is re-trained on the crowd first.
Layer compression is measured under both readings of Sec. 5.1 (`techniques/svd_reading.py`: the
softmax alone, the embedding as well); the main rows use the reading its rule chooses on held-out
global text, the other reading's SVD and combined runs are the `svd_readings` sensitivity table.

Training time = steady seconds per step x steps, every variant of a (seed, user) back to back, as
a ratio to the baseline. Timings differ run to run: they stay out of the headline, `effects.csv`
and displayed tables (they are in "time"/"seconds" columns, `timing_effects`, figures and logs).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ondevice import streams
from ondevice.data.per_user_text import Corpus, load_corpus
from ondevice.data.typing_samples import Samples
from ondevice.device import parity
from ondevice.papers.deeptype import common, protocol
from ondevice.papers.deeptype import table2 as t2m
from ondevice.papers.deeptype.common import GlobalModels, train_global
from ondevice.papers.deeptype.table2 import (
    LABEL,
    NAME,
    PAPER,
    PAPER_TIME,
    SIZE_CLAIMS,
    TABLE2,
    VARIANTS,
    bucketing_table,
    median,
    table2,
    wide,
)
from ondevice.papers.deeptype.techniques import svd_rank, svd_reading, svd_retrain
from ondevice.report import claims, record
from ondevice.report.conclusion import Conclusion
from ondevice.tasks import typing_protocol
from ondevice.training import bucketing as bk
from ondevice.training.trainer import StepTimer

SMOKE = dict(max_test_users=2, max_personal_samples=640, seeds=1, tflite_variants=("combined",), bootstrap=500)
SMOKE |= svd_rank.SMOKE
# default: three exports (~20-40 s each here); the combined one exercises every technique
DEFAULT = dict(max_test_users=4, seeds=3, tflite_variants=("svd", "vocab", "combined"))
# effects_table columns that carry timing measurements, renamed so they say so
_TIMING_COLUMNS = {c: f"{c} (epoch time)" for c in ("our change", "ci low", "ci high", "sign test p", "verdict")}
_TIMING_COLUMNS.update({"users improved": "users faster (epoch time)", "users worse": "users slower (epoch time)"})
SVD_VARIANTS = ("svd", "combined")  # the variants that start from the SVD global model


@dataclass(frozen=True)
class Params(typing_protocol.DeepTypeParams, svd_rank.SVDParams):
    max_test_users: int = 0  # the first N test users of the split; 0 = all
    max_personal_samples: int = 0  # the user's first N training samples; 0 = all (smoke: fewer)
    personal_epochs: int = 1
    personal_holdout_fraction: float = 0.0  # fixed epochs: each variant costs the same steps (Table 2)
    personal_optimizer: str = "adam"  # from a fresh state per user (a deviation from the paper's SGD)
    personal_learning_rate: float = 3e-4  # D3's choice on the validation users at default scale
    buckets: tuple[int, ...] = (5, 10, 20, 30)
    fixed_length: int = 30
    warmup_steps: int = 5  # steps excluded from the steady-state step time
    tflite_variants: tuple[str, ...] = TABLE2
    tflite_check_steps: int = 3  # personal steps run both in TF and in the exported TFLite model
    bootstrap: int = 2000
    # Layer compression (every preset, fixed before any run, read on held-out global text):
    # svd_rank's rule per matrix (softmax, then embedding); the main rows' reading by
    # svd_reading.READING_RULE: fewer parameters within the tolerance, else the text's (softmax only).

    PRESETS = typing_protocol.presets({"smoke": SMOKE, "default": DEFAULT, "paper": dict(personal_epochs=5)})

    def check(self) -> None:
        super().check()
        self.require(self.max_test_users != 1, "max_test_users", "must be 0 (all) or at least 2 (effects need 2 users)")
        counts = ("max_test_users", "max_personal_samples", "warmup_steps", "tflite_check_steps")
        for name in counts:
            self.require(getattr(self, name) >= 0, name, "must be >= 0")
        for name in ("personal_epochs", "fixed_length"):
            self.require(getattr(self, name) >= 1, name, "must be at least 1")
        svd_rank.SVDParams.check(self)
        bucket_ok = len(self.buckets) >= 1 and list(self.buckets) == sorted(set(self.buckets)) and self.buckets[0] >= 1
        self.require(bucket_ok, "buckets", "must be increasing positive lengths")
        self.require(set(self.tflite_variants) <= set(VARIANTS), "tflite_variants", f"must be among {list(VARIANTS)}")
        self.require(self.bootstrap >= 100, "bootstrap", "must be at least 100 resamples")

    def chosen_users(self, corpus: Corpus) -> list[str]:
        return list(corpus.split.test)[: self.max_test_users or None]

    def personal_data(self, corpus: Corpus, user: str) -> tuple[Samples, Samples]:
        """The user's training samples (the first `max_personal_samples` when set) and test samples."""
        train, test = corpus.personal(user, self.personal_train_fraction)
        if self.max_personal_samples and len(train) > self.max_personal_samples:
            train = first_samples(train, self.max_personal_samples)
        return train, test


def first_samples(samples: Samples, n: int) -> Samples:
    """The first n samples (the user's earliest words)."""
    s, end = samples, samples.offsets[n]
    return Samples(s.inputs[:end], s.labels[:end], s.offsets[: n + 1], s.n_context[:n], s.word_len[:n], s.target[:n])


def compress_global(params: Params, corpus: Corpus, models: GlobalModels, log=print) -> svd_reading.Readings:
    """SVD layer compression of every seed's global model under both readings, at the ranks the
    rule chooses per matrix on held-out global text, re-trained on the crowd (Sec. 5.1); the
    sweeps and the reading the main rows use (`svd_reading.READING_RULE`)."""
    return svd_reading.compress(params, corpus, models, log)


class Personal:
    """Builds, trains and scores the personal model of one (seed, user, variant)."""

    def __init__(self, params: Params, corpus: Corpus, models: GlobalModels, compressed: svd_retrain.Compressed):
        self.params, self.corpus, self.models, self.compressed = params, corpus, models, compressed
        self.task, self._trainers = common.task(params), {}

    def setup(self, variant: str, seed: int, train: Samples, test: Samples):
        """(model with its starting weights set, starting weights, train, test, vocabulary map)."""
        return VARIANTS[variant].for_seed(self.models, self.compressed, seed, train, test)

    def trainer(self, variant: str, model):
        """The variant's personal trainer; a vocabulary-compressed model is the user's own size."""
        p, spec = self.params, VARIANTS[variant]
        if spec.vocab or variant not in self._trainers:
            self._trainers[variant] = protocol.personal_trainer(p, model, self.task, spec.hooks(p), p.warmup_steps)
        return self._trainers[variant]

    def run(self, variant: str, seed: int, user: str, train: Samples, test: Samples) -> dict:
        model, weights, train, test, vmap = self.setup(variant, seed, train, test)
        trainer = self.trainer(variant, model)
        trainer.timer = StepTimer(self.params.warmup_steps)
        rng = lambda: streams.rng(seed, f"personal/{user}")  # noqa: E731  (the same batch order for every variant)
        history = protocol.personalize(trainer, weights, train, self.params, rng())
        scores, card = self.task.evaluate(trainer.model, test), common.model_card(trainer.model)
        steps, steady = history[0]["steps"], trainer.timer.steady()
        row = dict(seed=seed, user=user, variant=variant, label=LABEL[variant], train_samples=len(train))
        row.update(test_samples=len(test), top_k_eff=scores["top_k_eff"], perplexity=scores["perplexity"])
        row.update(test_oov_or_unseen_rate=float(np.mean(test.target == 1)))
        row.update(output_words=int(vmap.size if vmap else self.corpus.vocab.size), parameters=card["parameters"])
        row.update(
            size_mb=card["size_mb"], trained_parameters=int(sum(np.prod(v.shape) for v in trainer.variables_to_train))
        )
        padding = bk.padding_stats(VARIANTS[variant].batch_list(self.task, train, self.params, rng()))
        row.update(steps=steps, **padding, final_loss=history[-1]["loss"], steady_step_seconds=steady)
        return row | {"epoch_time_seconds": steady * steps, "epoch_wall_seconds": history[0]["seconds"]}


def personalize(params: Params, corpus: Corpus, models: GlobalModels, compressed: svd_retrain.Compressed, log=print):
    """Every seed, every chosen test user, every variant back to back (so timing is comparable)."""
    personal, users, rows = Personal(params, corpus, models, compressed), params.chosen_users(corpus), []
    for seed in params.seed_list:
        for n, user in enumerate(users, 1):
            train, test = params.personal_data(corpus, user)
            for variant in VARIANTS:
                rows.append(r := personal.run(variant, seed, user, train, test))
                log(f"seed {seed} user {n}/{len(users)} {variant}: top-k-eff {r['top_k_eff']:.4f}, {r['steps']} steps")
    return rows


def other_reading(params: Params, corpus: Corpus, models: GlobalModels, readings: svd_reading.Readings, log=print):
    """The SVD and combined variants from the other reading's compressed models (the sensitivity
    rows), every seed and chosen test user, as `personalize` runs them."""
    personal, rows = Personal(params, corpus, models, readings.compressed[readings.other]), []
    for seed in params.seed_list:
        for user in params.chosen_users(corpus):
            train, test = params.personal_data(corpus, user)
            rows += [personal.run(v, seed, user, train, test) | {"svd_reading": readings.other} for v in SVD_VARIANTS]
    log(f"{readings.other}: {len(rows)} sensitivity runs")
    return rows


def on_device(params: Params, corpus: Corpus, models: GlobalModels, compressed: svd_retrain.Compressed, log=print):
    """`parity.parity_table` of each of `tflite_variants` (first test user and seed): copies train,
    from their own stream, so no result changes."""
    if not params.tflite_check_steps or not params.tflite_variants:
        return None, {}
    personal, tables, files = Personal(params, corpus, models, compressed), [], {}
    raw = params.personal_data(corpus, params.chosen_users(corpus)[0])
    for variant in params.tflite_variants:
        model, _, train, _, _ = personal.setup(variant, params.seed, *raw)
        spec, rng = VARIANTS[variant], streams.rng(params.seed, "diagnostics/tflite")
        batches = spec.batch_list(personal.task, train, params, rng)[: params.tflite_check_steps]
        args = (personal.task, params.personal_learning_rate, batches, params.personal_optimizer, spec.hooks(params))
        clip = params.personal_clip_norm
        table, files[f"deeptype_{variant}_trainable.tflite"] = parity.parity_table(model, *args, log, variant, clip)
        tables.append(table.assign(variant=variant))
    table = pd.concat(tables, ignore_index=True)
    return table[["variant", *table.columns[:-1]]], files


def runs_table(rows: list[dict], reading: str = "") -> pd.DataFrame:
    """The runs; with `reading`, the SVD variants' rows name it (`svd_reading`)."""
    runs = pd.DataFrame(rows)
    if reading:
        runs["svd_reading"] = np.where(runs.variant.isin(SVD_VARIANTS), reading, "")
    return runs


def conclude(params, corpus, models, readings, rows, other_rows, on_device_table, files, wall_time_s) -> record.Result:
    """Tables, headline, effects and diagnoses (`readings`: `compress_global`; `other_rows`: `other_reading`)."""
    runs, compressed, sweep = runs_table(rows, readings.main), readings.chosen, readings.sweep
    t2, base_eff, base_size = table2(runs), median(runs, "baseline", "top_k_eff"), median(runs, "baseline", "size_mb")
    per_seed = {"top-k-eff, personal model (baseline)": base_eff}
    per_seed["top-k-eff change, all combined"] = median(runs, "combined", "top_k_eff") / base_eff - 1
    per_seed |= {f"model size change, {n}": median(runs, v, "size_mb") / base_size - 1 for v, n in SIZE_CLAIMS.items()}
    c = Conclusion(NAME, params, PAPER)
    c.headlines(per_seed)
    ours = {}
    for v in TABLE2:
        ours[f"top-k-eff, {LABEL[v]}"] = float(median(runs, v, "top_k_eff").mean())
        ours[f"model size (MB), {LABEL[v]}"] = float(median(runs, v, "size_mb").mean())
    size, eff = (lambda v: wide(runs, v, "size_mb")), (lambda v: wide(runs, v, "top_k_eff"))
    measured = {f"{n} shrinks the model": (size("baseline"), size(v)) for v, n in SIZE_CLAIMS.items()}
    measured |= {f"{LABEL[v]} keeps top-k-eff": (eff(v), eff("baseline")) for v in ("fine_tune", "bucketing")}
    measured |= {f"{n} costs top-k-eff": (eff("baseline"), eff(v)) for v, n in SIZE_CLAIMS.items()}
    rng, epoch = (lambda name: streams.rng(params.seed, name)), (lambda v: wide(runs, v, "epoch_time_seconds"))
    models.model.set_weights(models.weights[params.seed])
    causes = t2m.causes(runs, t2m.softmax_share(models.model), readings.table)
    shape = dict(words_in=corpus.vocab.input_size, words_out=corpus.vocab.size, embedding=params.embedding_dim)
    shape |= dict(hidden=params.hidden_units, layers=params.lstm_layers)
    e_rank = svd_rank.chosen_rank(readings.embedding_sweep)
    sizes = t2m.size_table(runs, shape, compressed.rank, e_rank)
    why = t2m.diagnoses(causes, readings.table, sizes, runs)
    ours[t2m.USED_WORDS] = float(np.median(runs[runs.variant == "vocab"].output_words))
    c.effects(measured, rng("bootstrap"), n_boot=params.bootstrap, diagnoses=why)
    c.paper_vs_ours(ours)
    timing = {f"{LABEL[v]} trains faster": (epoch("baseline"), epoch(v)) for v in TABLE2[1:]}
    timing_effects = claims.effects_table(PAPER_TIME, timing, rng("bootstrap/time"), n_boot=params.bootstrap)
    tables = dict(data=corpus.table(), runs=runs, table2=t2, bucketing=bucketing_table(runs))
    tables.update(training=pd.concat([models.history(), compressed.history()]), global_model_cache=models.cache())
    tables.update(svd_model_cache=pd.concat([c.cache().assign(reading=r) for r, c in readings.compressed.items()]))
    tables.update(svd_rank_sweep=sweep, svd_embedding_rank_sweep=readings.embedding_sweep)
    tables.update(svd_readings=t2m.reading_sensitivity(runs, runs_table(other_rows), readings.table))
    tables["causes"] = t2m.causes_table(causes)
    tables["model_size_arithmetic"] = sizes
    tables["timing_effects"] = timing_effects.rename(columns=_TIMING_COLUMNS)
    if on_device_table is not None:
        tables["on_device"] = on_device_table
    notes = dict(vocabulary_size=corpus.vocab.size, svd_rank=compressed.rank, split_digest=corpus.split.digest)
    notes["svd_rank_rule"] = f"{svd_rank.RULE}; tolerance {params.svd_rank_tolerance:g}; per matrix"
    notes.update(svd_reading=readings.main, svd_embedding_rank=compressed.embedding_rank)
    notes["svd_reading_rule"] = svd_reading.READING_RULE
    notes.update(test_users=params.chosen_users(corpus), seeds=params.seed_list)
    notes.update(personal_learning_rate=params.personal_learning_rate, global_models_from_cache=models.from_cache)
    notes["time_ratio_to_baseline (volatile)"] = dict(zip(t2.variant, t2.time_ratio_to_baseline))
    notes["svd_models_from_cache"] = {
        f"{r}/{s}": e.hit for r, c in readings.compressed.items() for s, e in c.entries.items()
    }
    data, artifacts = [corpus.manifest.summary()], {"split.json": corpus.split.to_dict()}
    return c.result(tables, data, corpus.manifest.stand_in_for, wall_time_s, files, artifacts, **notes)


def run(params: Params, speeches=None, log=print) -> record.Result:
    start = time.perf_counter()
    corpus = load_corpus(params, speeches, log)
    models = train_global(params, corpus, log)
    readings = compress_global(params, corpus, models, log)
    rows = personalize(params, corpus, models, readings.chosen, log)
    other_rows = other_reading(params, corpus, models, readings, log)
    table, files = on_device(params, corpus, models, readings.chosen, log)
    return conclude(params, corpus, models, readings, rows, other_rows, table, files, time.perf_counter() - start)
