"""DeepType D7 (Sec. 6.1, "Accuracy Improvement of Online Training"): emulated online training.

Each test user's samples are fed in typing order, starting from the shared global model. The
emulator first infers every sample (that is the suggestion the user sees, and what is scored),
buffers it, and trains one step each time 16 samples are buffered, so later words are suggested
by a model that has learnt from the earlier ones. Without online training the global model
suggests every word. Both conditions are scored with top-k-eff on the whole stream, on its last
part (the paper: the last 10K of 100K samples) and on the user's later lines (D3's test part).

Online training is DeepType's on-device path (Sec. 5.4-5.5, 6.2.3): only the softmax trains
and its update reuses the inference's cached features (`techniques.deeptype.inference_reuse`);
`online_training = "full"` trains every layer with the platform's Trainer instead.

The notebook calls one stage per section: `load_corpus`, `train_global`, `emulate`, `conclude`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
import tensorflow as tf

from ondevice import streams
from ondevice.data.typing_samples import Samples
from ondevice.metrics import top_k_eff, typed_chars_needed
from ondevice.report import claims, record
from ondevice.tasks.next_word import NextWordTask, position_scores
from ondevice.papers.deeptype.techniques.inference_reuse import OnlineTrainer
from ondevice.training.trainer import Trainer
from ondevice.papers.deeptype import common
from ondevice.papers.deeptype.common import Corpus, GlobalModels, load_corpus, train_global  # noqa: F401  (stages the notebook calls)

NAME = "deeptype_online"
CONDITIONS = ("global", "online")

PAPER = claims.Paper(
    citation="Xu et al., DeepType, IMWUT 2018, Sec. 6.1, online training emulated on 100 users' 100K samples each "
             "(global model from Twitter corpora)",
    numbers=(
        claims.PaperNumber("top-k-eff, without online training", 0.51, "Sec. 6.1: around 0.51"),
        claims.PaperNumber("relative gain, whole stream", 0.095, "Sec. 6.1: +9.5% overall"),
        claims.PaperNumber("relative gain, last part of the stream", 0.169, "Sec. 6.1: +16.9% on the last 10K of 100K samples"),
    ),
    effects=(),
)
PART_CLAIMS = {
    "stream": ("online training raises top-k-eff over the whole stream", 0.095),
    "last": ("online training raises top-k-eff on the last part of the stream", 0.169),
}


@dataclass(frozen=True)
class Params(common.DeepTypeParams):
    online_batch_size: int = 16      # the paper trains once 16 samples are buffered
    online_training: str = "fine_tune"  # fine_tune: softmax only, reusing inference (the paper's online path) | full
    last_fraction: float = 0.1       # the stream's last part (the paper: last 10K of 100K samples)
    curve_points: int = 20           # cumulative top-k-eff at this many points of each stream (figure)
    bootstrap: int = 2000

    # The LSTM fields stay the shared presets', so the global models are the other DeepType
    # notebooks' cache entries. Online training uses the shared personal protocol
    # (personal_optimizer, personal_learning_rate).
    # Online training has no randomness of its own (samples in typing order, no shuffling), so
    # each distinct global model runs once: min(seeds, global_seeds) of them.
    PRESETS = common.presets({
        "smoke": dict(curve_points=5, bootstrap=500),
        "paper": dict(seeds=3),
    })

    def check(self) -> None:
        super().check()
        self.require(self.online_batch_size >= 1, "online_batch_size", "must be at least 1")
        self.require(self.online_training in ("fine_tune", "full"), "online_training", "must be 'fine_tune' or 'full'")
        self.require(0 < self.last_fraction < 1, "last_fraction", "must be in (0, 1)")
        self.require(self.curve_points >= 2, "curve_points", "must be at least 2")
        self.require(self.bootstrap >= 100, "bootstrap", "must be at least 100 resamples")


def stream(corpus: Corpus, user: str, train_fraction: float) -> tuple[Samples, int]:
    """A user's samples in typing order (earlier lines, then later lines) and where the later
    lines (D3's test part) begin."""
    first, later = corpus.personal(user, train_fraction)
    parts = (first, later)
    offsets = np.concatenate([first.offsets[:-1], later.offsets + first.offsets[-1]])
    joined = Samples(*(np.concatenate([getattr(p, f) for p in parts]) for f in ("inputs", "labels")), offsets,
                     *(np.concatenate([getattr(p, f) for p in parts]) for f in ("n_context", "word_len", "target")))
    return joined, len(first)


class Emulator:
    """Feeds a stream batch by batch: infer (and score) each buffered batch, then train on it."""

    def __init__(self, params: Params, models: GlobalModels):
        self.params, self.models = params, models
        self.k = tf.constant(params.k)
        lr, opt = params.personal_learning_rate, params.personal_optimizer
        if params.online_training == "fine_tune":
            self.trainer = OnlineTrainer(models.model, NextWordTask(params.k), lr, opt)
        else:
            self.trainer = Trainer(models.model, NextWordTask(params.k), lr, opt)

    def run(self, data: Samples, seed: int, train: bool) -> tuple[np.ndarray, int]:
        """R(x) of every sample, as suggested by the model of that moment, and the steps trained.
        Without training the model never changes, so larger batches give the same suggestions faster."""
        self.trainer.reset(self.models.weights[seed])
        b = self.params.online_batch_size if train else max(self.params.online_batch_size, 256)
        needed, steps = np.zeros(len(data), np.int32), 0
        for start in range(0, len(data), b):
            idx = np.arange(start, min(start + b, len(data)))
            x, y = data.padded(idx)
            if self.params.online_training == "fine_tune":
                out = self.trainer.infer_and_cache(x)
                logits = out["logits"]
            else:
                logits = self.trainer.model(x, training=False)
            hit = position_scores(logits, tf.constant(y), self.k)[0].numpy()
            for row, j in enumerate(idx):
                needed[j] = typed_chars_needed(hit[row], int(data.n_context[j]), int(data.word_len[j]))
            if train and len(idx) == b:  # a full buffer of `online_batch_size` samples: one update
                if self.params.online_training == "fine_tune":
                    self.trainer.train_from_cache(out["features"], y)
                else:
                    self.trainer.step(x, y)
                steps += 1
        return needed, steps


def _parts(n: int, later_start: int, last_fraction: float) -> dict[str, np.ndarray]:
    last = n - max(1, int(round(n * last_fraction)))
    return {"stream": np.arange(n), "last": np.arange(last, n), "later_lines": np.arange(later_start, n)}


def emulate(params: Params, corpus: Corpus, models: GlobalModels, log=print) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every seed and test user, with and without online training: one row per (seed, user,
    condition) with top-k-eff on each part of the stream, and the cumulative curve."""
    emulator = Emulator(params, models)
    rows, curve = [], []
    for seed in models.entries:  # each distinct global model once
        for n_user, user in enumerate(corpus.split.test, 1):
            data, later_start = stream(corpus, user, params.personal_train_fraction)
            parts = _parts(len(data), later_start, params.last_fraction)
            points = np.unique(np.linspace(0, len(data), params.curve_points + 1).round().astype(int)[1:])
            scores = {}
            for condition in CONDITIONS:
                needed, steps = emulator.run(data, seed, train=condition == "online")
                scores[condition] = {p: top_k_eff(data.word_len[i], needed[i]) for p, i in parts.items()}
                rows.append({"seed": seed, "user": user, "condition": condition, "stream_words": len(data),
                             "last_words": len(parts["last"]), "later_lines_words": len(parts["later_lines"]),
                             "train_steps": steps, **{f"top_k_eff_{p}": v for p, v in scores[condition].items()}})
                saved = np.cumsum(data.word_len - needed)
                curve += [{"seed": seed, "user": user, "condition": condition, "samples": int(p),
                           "fraction": p / len(data), "cumulative_top_k_eff": saved[p - 1] / data.word_len[:p].sum()}
                          for p in points]
            log(f"seed {seed} user {n_user}/{len(corpus.split.test)} {user} ({len(data)} samples): top-{params.k}-eff "
                f"{scores['global']['stream']:.3f} -> {scores['online']['stream']:.3f} online, last part "
                f"{scores['global']['last']:.3f} -> {scores['online']['last']:.3f}")
    return pd.DataFrame(rows), pd.DataFrame(curve)


def _wide(users: pd.DataFrame, condition: str, part: str) -> np.ndarray:
    sel = users[users.condition == condition]
    return sel.pivot(index="seed", columns="user", values=f"top_k_eff_{part}").sort_index().sort_index(axis=1).to_numpy(float)


def effects(params: Params, users: pd.DataFrame) -> pd.DataFrame:
    """Online vs global per part of the stream: paired bootstrap over users, the paper's change beside ours."""
    rows = []
    for part, (claim, paper_change) in PART_CLAIMS.items():
        r = claims.paired_effect(_wide(users, "online", part), _wide(users, "global", part),
                                 streams.rng(params.seed, f"bootstrap/{part}"), n_boot=params.bootstrap)
        rows.append({"effect": claim, "paper change": paper_change, "our change": r["change"], "ci low": r["ci_low"],
                     "ci high": r["ci_high"], "users": r["users"], "seeds": r["seeds"], "users improved": r["users_improved"],
                     "users worse": r["users_worse"], "sign test p": r["sign_test_p"], "verdict": r["verdict"], "level": 0.95})
    return pd.DataFrame(rows)


def per_user(users: pd.DataFrame) -> pd.DataFrame:
    """One row per (seed, user): both conditions side by side and the relative gain per part."""
    wide = users.pivot(index=["seed", "user"], columns="condition",
                       values=[f"top_k_eff_{p}" for p in ("stream", "last", "later_lines")])
    wide.columns = [f"{c}_{cond}" for c, cond in wide.columns]
    out = wide.reset_index()
    for p in ("stream", "last", "later_lines"):
        out[f"gain_{p}"] = out[f"top_k_eff_{p}_online"] / out[f"top_k_eff_{p}_global"] - 1
    return out


def conclude(params: Params, corpus: Corpus, models: GlobalModels, users: pd.DataFrame, curve: pd.DataFrame,
             wall_time_s: float) -> record.Result:
    """Tables, headline numbers per seed, the paper's numbers beside ours, and the verdicts."""
    med = users.groupby(["seed", "condition"])[[f"top_k_eff_{p}" for p in ("stream", "last", "later_lines")]].median()
    per_seed = {
        "top-k-eff, without online training": med.xs("global", level="condition").top_k_eff_stream.tolist(),
        "top-k-eff, online training": med.xs("online", level="condition").top_k_eff_stream.tolist(),
    }
    for part, name in (("stream", "whole stream"), ("last", "last part of the stream"), ("later_lines", "later lines")):
        g, o = med.xs("global", level="condition")[f"top_k_eff_{part}"], med.xs("online", level="condition")[f"top_k_eff_{part}"]
        per_seed[f"relative gain, {name}"] = (o / g - 1).tolist()
    headline = {q: claims.headline(v) for q, v in per_seed.items()}
    numbers = claims.paper_vs_ours(PAPER, {q: h["value"] for q, h in headline.items()})
    summary = med.reset_index()
    tables = {"data": corpus.table(), "users": users, "per_user": per_user(users), "summary": summary, "curve": curve,
              "global_model_cache": models.cache(), "headline": claims.headline_table(headline),
              "paper_vs_ours": numbers, "effects": effects(params, users)}
    first = users[users.seed == users.seed.min()]
    return record.Result(
        experiment=NAME, params=params.to_dict(), tables=tables, headline=headline,
        artifacts={"split.json": corpus.split.to_dict()},
        data=[corpus.manifest.summary()], stand_in_data=corpus.manifest.stand_in_for, wall_time_s=wall_time_s,
        notes={"vocabulary_size": corpus.vocab.size, "crowd_words": int(sum(map(len, corpus.crowd))),
               "test_users": list(corpus.split.test), "stream_words": int(first.drop_duplicates("user").stream_words.sum()),
               "seeds": sorted(users.seed.unique().tolist()), "online_training": params.online_training,
               "online_optimizer": params.personal_optimizer, "online_learning_rate": params.personal_learning_rate,
               "split_digest": corpus.split.digest, "global_models_from_cache": {s: e.hit for s, e in models.entries.items()}},
    )


def run(params: Params, speeches=None, log=print) -> record.Result:
    """All stages in order, as the notebook runs them."""
    start = time.perf_counter()
    corpus = load_corpus(params, speeches, log)
    models = train_global(params, corpus, log)
    users, curve = emulate(params, corpus, models, log)
    return conclude(params, corpus, models, users, curve, time.perf_counter() - start)


def plot_curve(curve: pd.DataFrame, params: Params):
    """Cumulative top-k-eff along the stream, with and without online training (median over
    users; seed mean), and each user's online gain at the end."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    med = curve.groupby(["seed", "condition", "fraction"], as_index=False).cumulative_top_k_eff.median()
    med = med.groupby(["condition", "fraction"], as_index=False).cumulative_top_k_eff.mean()
    med["condition"] = med.condition.map({"global": "without online training", "online": "online training"})
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    sns.lineplot(data=med, x="fraction", y="cumulative_top_k_eff", hue="condition", marker="o",
                 palette=["#8c8c8c", "#d1495b"], ax=ax)
    ax.axvspan(1 - params.last_fraction, 1, color="0.92", zorder=0)
    ax.set(xlabel="share of the user's stream typed", ylabel=f"cumulative top-{params.k}-eff (median over users)",
           title="Online training while the user types")
    ax.legend(title="", frameon=False)
    sns.despine(fig)
    return fig
