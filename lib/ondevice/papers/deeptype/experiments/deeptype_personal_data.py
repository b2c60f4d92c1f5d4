"""DeepType D4 (Fig. 7): how much does more personal data help, and how much the dynamic vocabulary?

Stand-in data: Shakespeare's plays, users = (play, role), the same split and the same cached
global model (per seed) as every DeepType notebook. Each test user's history is split as in D3
(earlier lines for personal training, later lines for testing); the personal model trains on the
most recent 25 / 50 / 100% of the training part (a phone that has collected less history), with
and without the dynamic vocabulary (`techniques.deeptype.dynamic_vocab`), under the shared
personal protocol (`personal_optimizer`, `personal_learning_rate`, `personal_epochs`,
`personal_batch_size`). With and without the dynamic vocabulary a user's model sees the same
batches in the same order, so the two differ only in the vocabulary.

The notebook calls `load_corpus`, `train_global`, `vocabulary_reach`, `personalize`, `conclude`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ondevice import streams
from ondevice.data.splits import split_history
from ondevice.data.typing_samples import UNK_ID, build_samples
from ondevice.metrics import top_k_eff
from ondevice.report import claims, record
from ondevice.tasks.next_word import NextWordTask
from ondevice.papers.deeptype.techniques import dynamic_vocab
from ondevice.papers.deeptype.techniques.incremental import personalize as incremental_training
from ondevice.training.trainer import Trainer
from ondevice.papers.deeptype import common
from ondevice.papers.deeptype.common import Corpus, GlobalModels, load_corpus, train_global  # noqa: F401  (stages the notebook calls)

NAME = "deeptype_personal_data"
GLOBAL = "G-M"

# Fig. 7 (left) gives numbers in the text for the Twitter-trained global model only; our global
# model comes from other users of the same corpus (the paper's right panel, numbers not given).
# 50K and 100K samples are half and all of the paper's personal data: our 50% and 100%.
PAPER = claims.Paper(
    citation="Xu et al., DeepType, IMWUT 2018, Sec. 6.1 and Fig. 7 (left: global model trained on public "
             "Twitter corpora; medians over users)",
    numbers=(
        claims.PaperNumber("top-k-eff, G-M", 0.513, "Fig. 7 left, global model"),
        claims.PaperNumber("top-k-eff, P-M 50%", 0.595, "Fig. 7 left, P-M 50K: personalized on 50K samples"),
        claims.PaperNumber("top-k-eff, P-M 100%", 0.616, "Fig. 7 left, P-M 100K: personalized on 100K samples"),
        claims.PaperNumber("top-k-eff, P-M* 100%", 0.577,
                           "Fig. 7 left, P-M* 100K: 100K samples, no dynamic vocabulary"),
    ),
    effects=(
        claims.Effect("more personal data raises top-k-eff (100% vs 50%)", "top-k-eff, P-M 100%", "top-k-eff, P-M 50%"),
        claims.Effect("dynamic vocabulary raises top-k-eff (100% of the data)", "top-k-eff, P-M 100%", "top-k-eff, P-M* 100%"),
        claims.Effect("personalization raises top-k-eff (50% of the data)", "top-k-eff, P-M 50%", "top-k-eff, G-M"),
    ),
)


@dataclass(frozen=True)
class Params(common.DeepTypeParams):
    data_fractions: tuple[float, ...] = (0.25, 0.5, 1.0)  # of each user's personal training part
    dynamic_vocab_min_count: int = 2   # times a word must be typed to enter the user's vocabulary
    reach_min_counts: tuple[int, ...] = (1, 2, 3, 5, 10)  # thresholds of the counting-only table
    bootstrap: int = 2000              # resamples of users for the intervals

    PRESETS = common.presets({
        "smoke": dict(seeds=2, personal_epochs=1, bootstrap=500),
        # one personal epoch at default (the shared protocol trains 5): 7 conditions x 20 users at
        # 5 epochs would take about 30 minutes on the 2-core CPU; the paper preset trains 5.
        "default": dict(seeds=1, personal_epochs=1),
    })

    def check(self) -> None:
        super().check()
        self.require(all(0 < f <= 1 for f in self.data_fractions), "data_fractions", "must lie in (0, 1]")
        self.require(len(set(self.data_fractions)) == len(self.data_fractions), "data_fractions", "must not repeat")
        self.require({0.5, 1.0} <= set(self.data_fractions), "data_fractions",
                     "must include 0.5 and 1.0 (the paper's 50K and 100K)")
        self.require(self.dynamic_vocab_min_count >= 1, "dynamic_vocab_min_count", "must be at least 1")
        self.require(all(t >= 1 for t in self.reach_min_counts), "reach_min_counts", "must hold counts >= 1")
        self.require(self.bootstrap >= 100, "bootstrap", "must be at least 100 resamples")


def condition(fraction: float | None, dynamic: bool) -> str:
    """Fig. 7's labels: G-M, P-M <size> (dynamic vocabulary), P-M* <size> (without)."""
    return GLOBAL if fraction is None else f"P-M{'' if dynamic else '*'} {fraction:.0%}"


def history(corpus: Corpus, user: str, train_fraction: float) -> tuple[list, list]:
    """A user's earlier sentences (personal training part) and later ones (test), as D3 splits them."""
    sents = corpus.users[user]
    return split_history(sents, [len(s) for s in sents], train_fraction)


def recent(train: list[list[str]], fraction: float) -> list[list[str]]:
    """The most recent `fraction` of the training part's words (whole sentences, at least that many)."""
    if fraction >= 1:
        return train
    return split_history(train, [len(s) for s in train], 1 - fraction)[1]


def example_swap(params: Params, corpus: Corpus, user: str, rows: int = 10) -> pd.DataFrame:
    """The swap of one user on all of their personal training part: reused id, the global word
    that held it, the user's word that takes it and how often the user typed it."""
    swap = dynamic_vocab.swap(corpus.vocab, history(corpus, user, params.personal_train_fraction)[0],
                              params.dynamic_vocab_min_count)
    return pd.DataFrame({"id": swap.ids, "global word (never typed by the user)": swap.replaced,
                         "user's word": swap.added, "times typed": swap.counts}).head(rows)


def vocabulary_reach(params: Params, corpus: Corpus) -> pd.DataFrame:
    """Counting only, no model: per threshold and data fraction, the words the swap adds and the
    share of test words out of vocabulary before and after it (pooled over test users)."""
    rows = []
    for fraction in params.data_fractions:
        parts = [(recent(train, fraction), test) for train, test in
                 (history(corpus, u, params.personal_train_fraction) for u in corpus.split.test)]
        test_words = sum(len(s) for _, t in parts for s in t)
        before = sum(corpus.vocab.word_id(w) == UNK_ID for _, t in parts for s in t for w in s)
        for min_count in params.reach_min_counts:
            swaps = [dynamic_vocab.swap(corpus.vocab, own, min_count) for own, _ in parts]
            after = sum(sw.vocab.word_id(w) == UNK_ID for sw, (_, test) in zip(swaps, parts) for s in test for w in s)
            rows.append({"data_fraction": fraction, "min_count": min_count,
                         "added_words_median": float(np.median([sw.size for sw in swaps])),
                         "test_oov_global_vocab": before / test_words, "test_oov_user_vocab": after / test_words,
                         "used": min_count == params.dynamic_vocab_min_count})
    return pd.DataFrame(rows)


class _Personal:
    """Scores and personal models of one user under every condition, with one compiled trainer."""

    def __init__(self, params: Params, corpus: Corpus, models: GlobalModels):
        self.params, self.corpus, self.models = params, corpus, models
        self.task = NextWordTask(params.k)
        self.trainer = Trainer(models.model, self.task, params.personal_learning_rate, params.personal_optimizer)

    def _score(self, test: list, vocab, swap, added: set, **row) -> dict:
        """top-k-eff on the test lines with `vocab`; `added` are the words the swap would add (also
        scored without it, where they are <unk> and save nothing)."""
        samples = build_samples(test, vocab, self.params.context_words)
        scores = self.task.evaluate(self.trainer.model, samples)
        words = [w for s in test for w in s]
        new = np.array([w in added for w in words])
        lengths, needed = samples.word_len, scores["chars_needed"]
        return {**row, "test_words": len(words), "added_words": swap.size if swap else 0,
                "test_oov_global_vocab": float(np.mean([self.corpus.vocab.word_id(w) == UNK_ID for w in words])),
                "test_oov": float(np.mean(samples.target == UNK_ID)),
                "test_share_new_words": float(new.mean()),
                "top_k_eff": scores["top_k_eff"],
                "top_k_eff_on_new_words": top_k_eff(lengths[new], needed[new]) if new.any() else float("nan"),
                "_chars": (lengths, needed, new)}

    def user(self, user: str, seed: int) -> list[dict]:
        p, weights = self.params, self.models.weights[seed]
        train, test = history(self.corpus, user, p.personal_train_fraction)
        base = {"seed": seed, "user": user}
        self.trainer.reset(weights)
        rows = [self._score(test, self.corpus.vocab, None, set(), **base, condition=GLOBAL, data_fraction=0.0,
                            dynamic_vocab=False, train_words=0, personal_train_seconds=0.0)]
        for fraction in p.data_fractions:
            own = recent(train, fraction)
            swap = dynamic_vocab.swap(self.corpus.vocab, own, p.dynamic_vocab_min_count)
            for dynamic in (False, True):
                vocab = swap.vocab if dynamic else self.corpus.vocab
                samples = build_samples(own, vocab, p.context_words)
                start = time.perf_counter()
                # the same batches with and without the dynamic vocabulary: only the ids differ
                incremental_training(self.trainer, weights, samples, p.personal_epochs, p.personal_batch_size,
                                     streams.rng(seed, f"personal/{user}/data{fraction:g}"))
                rows.append(self._score(test, vocab, swap if dynamic else None, set(swap.added),
                                        **base, condition=condition(fraction, dynamic), data_fraction=fraction,
                                        dynamic_vocab=dynamic, train_words=len(samples),
                                        personal_train_seconds=time.perf_counter() - start))
        return rows


def personalize(params: Params, corpus: Corpus, models: GlobalModels, log=print) -> list[dict]:
    """Every seed, every test user: the global model, then a personal model per data fraction,
    with and without the dynamic vocabulary, each trained from the global weights."""
    personal = _Personal(params, corpus, models)
    rows = []
    for seed in params.seed_list:
        for n, user in enumerate(corpus.split.test, 1):
            start = time.perf_counter()
            user_rows = personal.user(user, seed)
            rows += user_rows
            scores = ", ".join(f"{r['condition']} {r['top_k_eff']:.3f}" for r in user_rows)
            log(f"seed {seed} user {n}/{len(corpus.split.test)} {user}: {scores} ({time.perf_counter() - start:.1f}s)")
    return rows


def users_table(rows: list[dict]) -> pd.DataFrame:
    """One row per (seed, user, data fraction, dynamic vocabulary), plus the global model's row."""
    return pd.DataFrame([{k: v for k, v in r.items() if not k.startswith("_")} for r in rows])


def _wide(users: pd.DataFrame, name: str) -> np.ndarray:
    """top-k-eff of one condition as (seeds, users)."""
    return users[users.condition == name].pivot(index="seed", columns="user", values="top_k_eff").to_numpy()


def contrasts(params: Params, users: pd.DataFrame) -> pd.DataFrame:
    """Every pairwise comparison the figure suggests, each with a paired bootstrap interval over
    users: more data (with and without the dynamic vocabulary), the dynamic vocabulary at each
    data size, and each personal model against the global model."""
    fr = sorted(params.data_fractions)
    pairs = [(condition(b, d), condition(a, d)) for d in (True, False) for i, a in enumerate(fr) for b in fr[i + 1:]]
    pairs += [(condition(f, True), condition(f, False)) for f in fr]
    pairs += [(condition(f, d), GLOBAL) for f in fr for d in (True, False)]
    rng = streams.rng(params.seed, "bootstrap/contrasts")
    rows = []
    for better, worse in pairs:
        r = claims.paired_effect(_wide(users, better), _wide(users, worse), rng, n_boot=params.bootstrap)
        rows.append({"better": better, "worse": worse, "our change": r["change"], "ci low": r["ci_low"],
                     "ci high": r["ci_high"], "users improved": r["users_improved"], "users worse": r["users_worse"],
                     "sign test p": r["sign_test_p"], "verdict": r["verdict"]})
    return pd.DataFrame(rows)


def conclude(params: Params, corpus: Corpus, models: GlobalModels, reach: pd.DataFrame, rows: list[dict],
             wall_time_s: float) -> record.Result:
    """Tables, headline numbers with tolerances, the paper's numbers beside ours, and the effects'
    intervals and three-way verdicts."""
    users = users_table(rows)
    summary = []
    for (seed, name), group in users.groupby(["seed", "condition"], sort=False):
        chosen = [r for r in rows if r["seed"] == seed and r["condition"] == name]
        lengths, needed, new = (np.concatenate([r["_chars"][i] for r in chosen]) for i in range(3))
        summary.append({"seed": seed, "condition": name, "data_fraction": group.data_fraction.iloc[0],
                        "dynamic_vocab": group.dynamic_vocab.iloc[0], "top_k_eff_median": group.top_k_eff.median(),
                        "top_k_eff_pooled": top_k_eff(lengths, needed),
                        "top_k_eff_on_new_words_pooled": top_k_eff(lengths[new], needed[new]) if new.any() else float("nan"),
                        "test_oov_median": group.test_oov.median(), "added_words_median": group.added_words.median(),
                        "train_words_median": group.train_words.median()})
    summary = pd.DataFrame(summary)
    conditions = {"top-k-eff, G-M": GLOBAL, "top-k-eff, P-M 50%": condition(0.5, True),
                  "top-k-eff, P-M 100%": condition(1.0, True), "top-k-eff, P-M* 100%": condition(1.0, False)}
    medians = summary.pivot(index="seed", columns="condition", values="top_k_eff_median")
    per_seed = {q: medians[c].tolist() for q, c in conditions.items()}
    for e in PAPER.effects:
        per_seed[f"relative change: {e.claim}"] = (np.array(per_seed[e.better]) / np.array(per_seed[e.worse]) - 1).tolist()
    headline = {q: claims.headline(v) for q, v in per_seed.items()}
    measured = {e.claim: (_wide(users, conditions[e.better]), _wide(users, conditions[e.worse])) for e in PAPER.effects}
    effects = claims.effects_table(PAPER, measured, streams.rng(params.seed, "bootstrap"), n_boot=params.bootstrap)
    numbers = claims.paper_vs_ours(PAPER, {q: h["value"] for q, h in headline.items()})
    tables = {"data": corpus.table(), "users": users, "summary": summary, "vocabulary_reach": reach,
              "contrasts": contrasts(params, users), "training": models.history(), "global_model_cache": models.cache(),
              "headline": claims.headline_table(headline), "paper_vs_ours": numbers, "effects": effects}
    card = common.model_card(models.model)
    return record.Result(
        experiment=NAME, params=params.to_dict(), tables=tables, headline=headline,
        artifacts={"split.json": corpus.split.to_dict()},
        data=[m.summary() for m in corpus.manifests], stand_in_data=corpus.manifest.stand_in_for, wall_time_s=wall_time_s,
        notes={"vocabulary_size": corpus.vocab.size, "crowd_words": int(sum(map(len, corpus.crowd))),
               "split_digest": corpus.split.digest, "test_users": list(corpus.split.test), "seeds": params.seed_list,
               "test_words": int(users[users.condition == GLOBAL].groupby("seed").test_words.sum().iloc[0]),
               "model_parameters": card["parameters"],
               "global_models_from_cache": {s: e.hit for s, e in models.entries.items()}},
    )


def run(params: Params, speeches=None, log=print) -> record.Result:
    """All stages in order, as the notebook runs them."""
    start = time.perf_counter()
    corpus = load_corpus(params, speeches, log)
    models = train_global(params, corpus, log)
    reach = vocabulary_reach(params, corpus)
    rows = personalize(params, corpus, models, log)
    return conclude(params, corpus, models, reach, rows, time.perf_counter() - start)


def plot_conditions(summary: pd.DataFrame, users: pd.DataFrame, k: int):
    """Fig. 7's layout: median top-k-eff of the global model and of each personal data size, with
    (P-M) and without (P-M*) the dynamic vocabulary; dots are users (mean over seeds)."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    seeds = summary.seed.nunique()
    order = list(dict.fromkeys(summary.sort_values(["data_fraction", "dynamic_vocab"]).condition))
    palette = {c: "#8c8c8c" if c == GLOBAL else "#d1495b" if c.startswith("P-M ") else "#edae49" for c in order}
    bars = summary.groupby("condition", as_index=False).top_k_eff_median.mean()
    dots = users.groupby(["condition", "user"], as_index=False).top_k_eff.mean()
    fig, ax = plt.subplots(figsize=(1.0 * len(order) + 2, 4))
    sns.barplot(data=bars, x="condition", y="top_k_eff_median", order=order, hue="condition", palette=palette,
                legend=False, ax=ax)
    sns.stripplot(data=dots, x="condition", y="top_k_eff", order=order, color="0.2", size=3, alpha=0.5, ax=ax)
    for i, c in enumerate(order):
        v = bars.set_index("condition").top_k_eff_median[c]
        ax.annotate(f"{v:.3f}", (i, v), ha="center", va="bottom", fontsize=8, xytext=(0, 2), textcoords="offset points")
    ax.set(xlabel="personal data (share of each user's training part); * = without dynamic vocabulary",
           ylabel=f"top-{k}-eff (median over users; mean of {seeds} seed{'s' * (seeds > 1)})",
           title="Personal data size and dynamic vocabulary (DeepType Fig. 7)")
    sns.despine(fig)
    fig.tight_layout()
    return fig


def plot_oov(users: pd.DataFrame):
    """Share of each user's test words that are out of vocabulary: global vocabulary vs the
    user's dynamic vocabulary, per personal data size (mean over seeds; one line per user)."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    dyn = users[users.dynamic_vocab].groupby(["user", "data_fraction"], as_index=False)[
        ["test_oov_global_vocab", "test_oov"]].mean()
    long = dyn.melt(id_vars=["user", "data_fraction"], var_name="vocabulary", value_name="oov")
    long["vocabulary"] = long.vocabulary.map({"test_oov_global_vocab": "global vocabulary",
                                              "test_oov": "user's dynamic vocabulary"})
    long["oov"] *= 100
    fig, ax = plt.subplots(figsize=(6, 3.8))
    sns.pointplot(data=long, x="data_fraction", y="oov", hue="vocabulary", estimator="median", errorbar=None,
                  palette=["#8c8c8c", "#d1495b"], dodge=0.2, ax=ax)
    ax.set(xlabel="personal data (share of the training part)", ylabel="test words out of vocabulary (%, median)",
           title="What the dynamic vocabulary brings into reach")
    ax.legend(title="", frameon=False)
    sns.despine(fig)
    fig.tight_layout()
    return fig
