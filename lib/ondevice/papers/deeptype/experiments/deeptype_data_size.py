"""DeepType D2 (Sec. 3.2, Fig. 2): how the global model's top-3-eff grows with its training data
and with epochs.

Global LSTMs are trained on nested shares of the crowd text (the smaller set is part of the
larger), through the platform's Trainer, and after every epoch scored on the test users' later
lines, the text the other DeepType notebooks test on. Each size is one model-cache entry holding
its weights and its per-epoch scores, so a re-run reads them instead of training again. The
vocabulary is the shared one (built from the whole crowd), as the paper keeps a fixed vocabulary.

The notebook calls one stage per section: `load_corpus`, `training_sets`, `train_sizes`,
`conclude`; `run` calls them all.
"""
from __future__ import annotations

import inspect
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ondevice import streams
from ondevice.data.typing_samples import Samples, build_samples
from ondevice.params import ParameterError
from ondevice.report import claims, provenance, record
from ondevice.tasks.next_word import NextWordTask
from ondevice.training import model_cache
from ondevice.training.trainer import Trainer, seed_everything
from ondevice.papers.deeptype import common
from ondevice.papers.deeptype.common import Corpus, load_corpus  # noqa: F401  (a stage the notebook calls)

NAME = "deeptype_data_size"
TRAINING_CODE = ("ondevice.training.trainer", "ondevice.tasks.next_word", "ondevice.models.lstm_lm",
                 "ondevice.streams", "ondevice.metrics")
MODEL_FIELDS = ("vocab_size", "embedding_dim", "hidden_units", "lstm_layers", "context_words", "global_batch_size",
                "global_learning_rate", "optimizer", "size_epochs", "personal_train_fraction", "eval_max_words", "k")

# Our sizes map onto the paper's three by rank: smallest <-> 1M, second largest <-> 10M, largest
# <-> 20M words (the last step doubles the data in both).
PAPER = claims.Paper(
    citation="Xu et al., DeepType, IMWUT 2018, Sec. 3.2 and Fig. 2: global LSTM trained on 1M, 10M and 20M words",
    numbers=(
        claims.PaperNumber("top-k-eff, smallest training set", 0.524, "Sec. 3.2: 1M words"),
        claims.PaperNumber("top-k-eff, second largest training set", 0.573, "Sec. 3.2: 10M words"),
        claims.PaperNumber("relative gain, smallest -> second largest set", 0.092, "Sec. 3.2: +9.2% (1M -> 10M words)"),
        claims.PaperNumber("relative gain, second largest -> largest set", 0.008,
                           "Sec. 3.2: +0.8% (10M -> 20M words; Sec. 6.1 says 0.571, +0.5%)"),
        claims.PaperNumber("epochs to converge (largest set)", 5, "Sec. 3.2 and 6.1: around 5 epochs"),
    ),
    effects=(),
)
EFFECTS = (
    ("more global training data raises top-k-eff (smallest -> second largest set)", 0, -2, 0.092),
    ("doubling the global training data raises top-k-eff (second largest -> largest set)", -2, -1, 0.008),
)
CONVERGED = 0.01  # an epoch is "converged" when its median top-k-eff is within 1% of the best epoch's


@dataclass(frozen=True)
class Params(common.DeepTypeParams):
    size_fractions: tuple[float, ...] = (0.05, 0.5, 1.0)  # shares of size_max_words (the paper: 1M, 10M, 20M)
    size_max_words: int = 0          # words of crowd text in the largest set; 0 = the whole crowd text
    size_epochs: int = 10            # epochs per size, each followed by an evaluation (Fig. 2: 10)
    eval_max_words: int = 0          # per test user, words of the later lines scored each epoch; 0 = all
    bootstrap: int = 2000

    PRESETS = common.presets({
        "smoke": dict(size_fractions=(0.25, 0.5, 1.0), size_max_words=4000, size_epochs=2, eval_max_words=150,
                      bootstrap=500),
        "default": dict(size_fractions=(0.1, 0.5, 1.0), size_max_words=150000, size_epochs=5, eval_max_words=500),
    })

    def check(self) -> None:
        super().check()
        f = self.size_fractions
        self.require(len(f) >= 3 and all(0 < a < b for a, b in zip(f, f[1:])) and f[-1] <= 1, "size_fractions",
                     "must hold at least three increasing shares in (0, 1]")
        self.require(self.size_max_words >= 0, "size_max_words", "must be >= 0 (0 = the whole crowd text)")
        self.require(self.size_epochs >= 1, "size_epochs", "must be at least 1")
        self.require(self.eval_max_words >= 0, "eval_max_words", "must be >= 0 (0 = all)")
        self.require(self.bootstrap >= 100, "bootstrap", "must be at least 100 resamples")


@dataclass
class TrainingSets:
    """The nested training sets (words -> sentences) and the evaluation samples per test user."""

    sets: dict[int, list[list[str]]]
    evaluation: dict[str, Samples]

    def table(self) -> pd.DataFrame:
        return pd.DataFrame([{"training_words": w, "sentences": len(s)} for w, s in self.sets.items()])


def training_sets(params: Params, corpus: Corpus, log=print) -> TrainingSets:
    """Nested shares of the crowd text (one shuffled order of its sentences, cut at each size) and
    each test user's evaluation text (the first `eval_max_words` words of the later lines)."""
    order = streams.rng(params.seed, "data_size/order").permutation(len(corpus.crowd))
    words = np.cumsum([len(corpus.crowd[i]) for i in order])
    largest = params.size_max_words or int(words[-1])
    if largest > words[-1]:
        raise ParameterError(f"parameter 'size_max_words' asks for {largest} words, but the crowd text has {words[-1]}")
    sets = {}
    for f in params.size_fractions:
        n = int(np.searchsorted(words, round(f * largest)) + 1)
        sets[int(words[n - 1])] = [corpus.crowd[i] for i in order[:n]]
    evaluation = {}
    for user in corpus.split.test:
        _, test = corpus.personal(user, params.personal_train_fraction)
        n = min(len(test), params.eval_max_words or len(test))
        evaluation[user] = _head(test, n)
    log(f"training sets of {list(sets)} crowd words; evaluation on {len(evaluation)} test users, "
        f"{sum(map(len, evaluation.values()))} samples")
    return TrainingSets(sets, evaluation)


def _head(samples: Samples, n: int) -> Samples:
    """The first n samples."""
    end = samples.offsets[n]
    return Samples(samples.inputs[:end], samples.labels[:end], samples.offsets[: n + 1], samples.n_context[:n],
                   samples.word_len[:n], samples.target[:n])


def size_model(params: Params, corpus: Corpus, sets: TrainingSets, words: int, seed: int, log=print) -> model_cache.Entry:
    """The global model trained on `words` words of crowd text for `size_epochs`, scored on every
    test user after each epoch; from the model cache when it exists."""
    data = build_samples(sets.sets[words], corpus.vocab, params.context_words)
    task = NextWordTask(params.k)

    def train():
        model = common.build_model(params, corpus, seed)
        trainer = Trainer(model, task, params.global_learning_rate, params.optimizer)
        rng = streams.rng(seed, f"batches/data_size/{words}")
        epochs = []
        for epoch in range(1, params.size_epochs + 1):
            fit = trainer.fit(data, 1, params.global_batch_size, rng, log, f"{words} words (seed {seed}) epoch {epoch}:")[0]
            scores = {u: task.evaluate(model, s) for u, s in sets.evaluation.items()}
            epochs.append({"epoch": epoch, "loss": fit["loss"], "seconds": fit["seconds"],
                           "users": {u: {"top_k_eff": r["top_k_eff"], "perplexity": r["perplexity"]} for u, r in scores.items()}})
            log(f"{words} words (seed {seed}) epoch {epoch}: loss {fit['loss']:.3f}, median top-{params.k}-eff "
                f"{np.median([r['top_k_eff'] for r in scores.values()]):.4f}")
        return model.get_weights(), {"epochs": epochs}

    fields = {name: getattr(params, name) for name in MODEL_FIELDS}
    fields.update(seed=seed, training_words=words)
    digests = [a.sha256 for a in corpus.manifest.artifacts] + [data.digest()] + \
        [f"{u}:{s.digest()}" for u, s in sorted(sets.evaluation.items())]
    code = model_cache.code_digest([f for m in TRAINING_CODE for f in provenance.module_files(m)],
                                   extra=inspect.getsource(size_model))
    return model_cache.load_or_train("deeptype_data_size", fields, digests, code, train, log)


def train_sizes(params: Params, corpus: Corpus, sets: TrainingSets, log=print) -> dict[tuple[int, int], model_cache.Entry]:
    """One cached model per (seed, training-set size)."""
    seed_everything(params.seed)
    return {(seed, words): size_model(params, corpus, sets, words, seed, log)
            for seed in params.seed_list for words in sets.sets}


def curve(entries: dict[tuple[int, int], model_cache.Entry]) -> pd.DataFrame:
    """One row per (seed, size, epoch, test user): top-k-eff and perplexity after that epoch."""
    return pd.DataFrame([{"seed": seed, "training_words": words, "epoch": e["epoch"], "user": user,
                          "top_k_eff": s["top_k_eff"], "perplexity": s["perplexity"]}
                         for (seed, words), entry in entries.items() for e in entry.info["epochs"]
                         for user, s in e["users"].items()])


def training(entries: dict[tuple[int, int], model_cache.Entry]) -> pd.DataFrame:
    return pd.DataFrame([{"seed": seed, "training_words": words, "epoch": e["epoch"], "loss": e["loss"],
                          "seconds": e["seconds"], "from_cache": entry.hit}
                         for (seed, words), entry in entries.items() for e in entry.info["epochs"]])


def summary_table(points: pd.DataFrame) -> pd.DataFrame:
    """Median over test users per (seed, size, epoch): the points of Fig. 2."""
    summary = points.groupby(["seed", "training_words", "epoch"], as_index=False)[["top_k_eff", "perplexity"]].median()
    return summary.rename(columns={"top_k_eff": "top_k_eff_median", "perplexity": "perplexity_median"})


def _final(points: pd.DataFrame, words: int) -> np.ndarray:
    """(seeds, users) top-k-eff after the last epoch of one size, users in a fixed order."""
    sel = points[(points.training_words == words) & (points.epoch == points.epoch.max())]
    return sel.pivot(index="seed", columns="user", values="top_k_eff").sort_index().sort_index(axis=1).to_numpy(float)


def epochs_to_converge(points: pd.DataFrame, words: int) -> list[int]:
    """Per seed, the first epoch whose median top-k-eff is within CONVERGED of the best epoch's."""
    med = points[points.training_words == words].groupby(["seed", "epoch"]).top_k_eff.median()
    out = []
    for _, m in med.groupby(level="seed"):
        m = m.droplevel("seed")
        out.append(int(m[m >= (1 - CONVERGED) * m.max()].index.min()))
    return out


def effects(params: Params, points: pd.DataFrame) -> pd.DataFrame:
    """The paper's data-size claims, judged on the final epoch by a paired bootstrap over users."""
    sizes, rows = sorted(points.training_words.unique()), []
    for claim, worse, better, paper_change in EFFECTS:
        r = claims.paired_effect(_final(points, sizes[better]), _final(points, sizes[worse]),
                                 streams.rng(params.seed, f"bootstrap/{claim}"), n_boot=params.bootstrap)
        rows.append({"effect": claim, "words": f"{sizes[worse]} -> {sizes[better]}", "paper change": paper_change,
                     "our change": r["change"], "ci low": r["ci_low"], "ci high": r["ci_high"], "users": r["users"],
                     "seeds": r["seeds"], "users improved": r["users_improved"], "users worse": r["users_worse"],
                     "sign test p": r["sign_test_p"], "verdict": r["verdict"], "level": 0.95})
    return pd.DataFrame(rows)


def conclude(params: Params, corpus: Corpus, sets: TrainingSets, entries: dict, wall_time_s: float) -> record.Result:
    """Tables, headline numbers per seed, the paper's numbers beside ours, and the verdicts."""
    points = curve(entries)
    sizes = sorted(sets.sets)
    final = {w: np.median(_final(points, w), axis=1) for w in sizes}
    per_seed = {
        "top-k-eff, smallest training set": final[sizes[0]].tolist(),
        "top-k-eff, second largest training set": final[sizes[-2]].tolist(),
        "top-k-eff, largest training set": final[sizes[-1]].tolist(),
        "relative gain, smallest -> second largest set": (final[sizes[-2]] / final[sizes[0]] - 1).tolist(),
        "relative gain, second largest -> largest set": (final[sizes[-1]] / final[sizes[-2]] - 1).tolist(),
        "epochs to converge (largest set)": epochs_to_converge(points, sizes[-1]),
    }
    headline = {q: claims.headline(v, resolution=1.0 if q.startswith("epochs") else 0.0) for q, v in per_seed.items()}
    numbers = claims.paper_vs_ours(PAPER, {q: h["value"] for q, h in headline.items()})
    numbers["ours: words"] = [sizes[0], sizes[-2], f"{sizes[0]} -> {sizes[-2]}", f"{sizes[-2]} -> {sizes[-1]}", sizes[-1]]
    summary = summary_table(points)
    evaluation = pd.DataFrame([{"user": u, "evaluation_words": len(s)} for u, s in sets.evaluation.items()])
    tables = {"data": corpus.table(), "training_sets": sets.table(), "evaluation": evaluation, "curve": points,
              "summary": summary, "training": training(entries), "headline": claims.headline_table(headline),
              "paper_vs_ours": numbers, "effects": effects(params, points)}
    return record.Result(
        experiment=NAME, params=params.to_dict(), tables=tables, headline=headline,
        artifacts={"split.json": corpus.split.to_dict()},
        data=[corpus.manifest.summary()], stand_in_data=corpus.manifest.stand_in_for, wall_time_s=wall_time_s,
        notes={"vocabulary_size": corpus.vocab.size, "crowd_words": int(sum(map(len, corpus.crowd))),
               "training_words": sizes, "test_users": list(corpus.split.test),
               "evaluation_words": int(evaluation.evaluation_words.sum()), "seeds": params.seed_list,
               "split_digest": corpus.split.digest, "models_from_cache": {f"{s}/{w}": e.hit for (s, w), e in entries.items()}},
    )


def run(params: Params, speeches=None, log=print) -> record.Result:
    """All stages in order, as the notebook runs them."""
    start = time.perf_counter()
    corpus = load_corpus(params, speeches, log)
    sets = training_sets(params, corpus, log)
    entries = train_sizes(params, corpus, sets, log)
    return conclude(params, corpus, sets, entries, time.perf_counter() - start)


def plot_curve(summary: pd.DataFrame, k: int):
    """Fig. 2: median top-k-eff and perplexity over the test users after each epoch, one line per
    training-set size (mean over seeds)."""
    import matplotlib.pyplot as plt
    import seaborn as sns
    from matplotlib.ticker import MaxNLocator

    mean = summary.groupby(["training_words", "epoch"], as_index=False)[["top_k_eff_median", "perplexity_median"]].mean()
    mean["training set"] = mean.training_words.map(lambda w: f"{w:,} words")
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, col, label in ((axes[0], "top_k_eff_median", f"top-{k}-eff"), (axes[1], "perplexity_median", "perplexity")):
        sns.lineplot(data=mean, x="epoch", y=col, hue="training set", marker="o", palette="crest", ax=ax)
        ax.set(ylabel=f"{label} (median over test users)", title=f"{label} per epoch (Fig. 2)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[1].get_legend().remove()
    axes[0].legend(title="", frameon=False)
    sns.despine(fig)
    fig.tight_layout()
    return fig
