"""DeepType D1 (Fig. 1b): the LSTM global model against word n-gram baselines.

2-gram and 3-gram models with interpolated Kneser-Ney smoothing (`models.ngram`), each with and
without filtering the suggestions by the typed characters, are counted on the same crowd text
the global LSTM is trained on and scored with the same top-k-eff on the same test samples: the
later lines of each test user. The LSTM is the shared global model of every seed (model cache).

The notebook calls one stage per section: `load_corpus`, `fit_ngrams`, `train_global`, `score`,
`conclude`; `run` calls them all.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
import tensorflow as tf

from ondevice import streams
from ondevice.data.typing_samples import Samples
from ondevice.metrics import top_k_eff
from ondevice.models.ngram import KneserNey, PrefixFilter, chars_needed
from ondevice.report import claims, record
from ondevice.tasks.next_word import NextWordTask
from ondevice.papers.deeptype import common
from ondevice.papers.deeptype.common import Corpus, GlobalModels, load_corpus, train_global  # noqa: F401  (stages the notebook calls)

NAME = "deeptype_ngram"
LSTM = "LSTM"

# Fig. 1b gives bars without numbers in the text; the LSTM's own number is Fig. 2's (default
# configuration, 10M words), which is what Sec. 3.2 compares the n-grams with.
PAPER = claims.Paper(
    citation="Xu et al., DeepType, IMWUT 2018, Sec. 3.2 and Fig. 1b: LSTM vs n-gram models, "
             "with and without filtering by the typed characters",
    numbers=(claims.PaperNumber("top-k-eff, LSTM", 0.573, "Sec. 3.2 / Fig. 2: the LSTM trained on 10M words"),),
    effects=(),
)
PAPER_SAYS = "Fig. 1b: the LSTM significantly outperforms the n-gram models given enough data (bars; no number in the text)"
FILTER_SAYS = "Sec. 3.2: filtering by the typed characters further improves the n-gram's accuracy (no number in the text)"


def ngram_name(order: int, prefix_filter: bool) -> str:
    return f"{order}-gram" + ("+char" if prefix_filter else "")


@dataclass(frozen=True)
class Params(common.DeepTypeParams):
    ngram_orders: tuple[int, ...] = (2, 3)
    bootstrap: int = 2000            # resamples of users for each effect's interval

    # The LSTM fields stay the shared presets', so the global models are the same cache entries
    # as the other DeepType notebooks' (same fields, same seeds -> same model). Nothing here is
    # random but the global model, so the LSTM is scored once per distinct global model
    # (min(seeds, global_seeds) of them: one at default, three at paper scale).
    PRESETS = common.presets({
        "smoke": dict(bootstrap=500),
        "paper": dict(seeds=3),
    })

    def check(self) -> None:
        super().check()
        self.require(len(self.ngram_orders) >= 1 and all(n >= 1 for n in self.ngram_orders), "ngram_orders",
                     "must list n-gram orders of at least 1")
        self.require(max(self.ngram_orders) - 1 <= self.context_words, "ngram_orders",
                     f"must not look further back than context_words ({self.context_words}) previous words")
        self.require(self.bootstrap >= 100, "bootstrap", "must be at least 100 resamples")


@dataclass
class NGrams:
    """The n-gram models counted on the crowd, and the prefix filter over the vocabulary."""

    models: dict[int, KneserNey]
    prefix: PrefixFilter

    def table(self) -> pd.DataFrame:
        """Per model and order of its interpolation: distinct contexts, n-gram types and discount."""
        return pd.DataFrame([{"model": f"{n}-gram", "order": m + 1, "contexts": len(o.keys), "ngram_types": int(o.types.sum()),
                              "counts": "raw" if m + 1 == n else "continuation", "discount": o.discount}
                             for n, model in self.models.items() for m, o in enumerate(model.orders)])


def fit_ngrams(params: Params, corpus: Corpus, log=print) -> NGrams:
    """Count every n-gram order on the crowd text the global LSTM trains on (words outside the
    vocabulary become <unk>, as for the LSTM)."""
    ids = [[corpus.vocab.word_id(w) for w in s] for s in corpus.crowd]
    models = {n: KneserNey.fit(ids, n, corpus.vocab.size) for n in params.ngram_orders}
    log(f"n-grams counted on {sum(map(len, ids))} crowd words: orders {list(params.ngram_orders)}")
    return NGrams(models, PrefixFilter(corpus.vocab))


def lstm_word_log_probs(model, samples: Samples, batch_size: int = 512) -> np.ndarray:
    """log P(word | previous words) of the LSTM before any character is typed, for every sample
    with at least one previous word (NaN for the others): the prediction the n-grams also make,
    so word perplexities compare."""
    out = np.full(len(samples), np.nan)
    idx_all = np.flatnonzero(samples.n_context > 0)
    for start in range(0, len(idx_all), batch_size):
        idx = idx_all[start: start + batch_size]
        nc = samples.n_context[idx]
        x = np.zeros((len(idx), int(nc.max())), np.int32)  # right-padded: a forward LSTM's real positions are exact
        for row, j in enumerate(idx):
            a = samples.offsets[j]
            x[row, : nc[row]] = samples.inputs[a: a + nc[row]]
        logits = model(x, training=False).numpy()[np.arange(len(idx)), nc - 1]
        out[idx] = tf.nn.log_softmax(logits).numpy()[np.arange(len(idx)), samples.target[idx]]
    return out


def _word_perplexity(log_prob: np.ndarray, mask: np.ndarray) -> float:
    return float(np.exp(-np.mean(log_prob[mask])))


def score(params: Params, corpus: Corpus, models: GlobalModels, ngrams: NGrams, log=print) -> pd.DataFrame:
    """One row per (model, seed, test user): top-k-eff on the user's later lines, and the word
    perplexity over the words with a previous word (the n-gram rows have no seed: they are
    counted, not trained)."""
    task = NextWordTask(params.k)
    rows = []
    for n_user, user in enumerate(corpus.split.test, 1):
        _, test = corpus.personal(user, params.personal_train_fraction)
        with_context = test.n_context > 0
        base = {"user": user, "test_words": len(test), "test_words_with_context": int(with_context.sum()),
                "test_oov_rate": float(np.mean(test.target == 1))}
        for n, model in ngrams.models.items():
            for prefix_filter in (False, True):
                needed, log_prob = chars_needed(model, test, ngrams.prefix, params.k, prefix_filter)
                rows.append({"model": ngram_name(n, prefix_filter), "seed": pd.NA, **base,
                             "top_k_eff": top_k_eff(test.word_len, needed),
                             "word_perplexity": np.nan if prefix_filter else _word_perplexity(log_prob, with_context)})
        for seed in models.entries:  # each distinct global model once (run seeds may share one)
            models.model.set_weights(models.weights[seed])
            ev = task.evaluate(models.model, test)
            rows.append({"model": LSTM, "seed": seed, **base, "top_k_eff": ev["top_k_eff"],
                         "word_perplexity": _word_perplexity(lstm_word_log_probs(models.model, test), with_context)})
        mine = [r for r in rows if r["user"] == user]
        log(f"user {n_user}/{len(corpus.split.test)} {user}: top-{params.k}-eff "
            + ", ".join(f"{r['model']}{'' if pd.isna(r['seed']) else ' s' + str(r['seed'])} {r['top_k_eff']:.3f}" for r in mine))
    table = pd.DataFrame(rows)
    table["seed"] = table.seed.astype("Int64")
    return table


def model_names(params: Params) -> list[str]:
    return [LSTM] + [ngram_name(n, f) for n in params.ngram_orders for f in (False, True)]


def _per_seed_users(users: pd.DataFrame, model: str, seeds: list[int]) -> np.ndarray:
    """(seeds, users) top-k-eff of one model, users in a fixed order; a counted n-gram repeats
    its one value in every seed, so it pairs with each seed's LSTM."""
    sel = users[users.model == model]
    if model == LSTM:
        return sel.pivot(index="seed", columns="user", values="top_k_eff").sort_index().sort_index(axis=1).to_numpy(float)
    row = sel.set_index("user").sort_index().top_k_eff.to_numpy(float)
    return np.tile(row, (len(seeds), 1))


def summary(params: Params, users: pd.DataFrame) -> pd.DataFrame:
    """Per model: median over users of top-k-eff and word perplexity (mean over seeds for the LSTM)."""
    rows = []
    for model in model_names(params):
        sel = users[users.model == model]
        keys = sel.seed.dropna().unique()
        groups = [sel[sel.seed == s] for s in keys] if len(keys) else [sel]
        rows.append({"model": model, "top_k_eff_median": float(np.mean([g.top_k_eff.median() for g in groups])),
                     "word_perplexity_median": float(np.mean([g.word_perplexity.median() for g in groups])),
                     "users": sel.user.nunique(), "seeds": len(keys)})
    return pd.DataFrame(rows)


def _lstm_seeds(users: pd.DataFrame) -> list[int]:
    return sorted(int(s) for s in users.seed.dropna().unique())


def effects(params: Params, users: pd.DataFrame) -> pd.DataFrame:
    """The paper's claims, which come without numbers, judged by a paired bootstrap over users:
    the LSTM against each n-gram variant, and the character filter against the plain n-gram."""
    seeds, rows = _lstm_seeds(users), []
    pairs = [(f"the LSTM beats the {ngram_name(n, f)} model", LSTM, ngram_name(n, f), PAPER_SAYS)
             for n in params.ngram_orders for f in (False, True)]
    pairs += [(f"filtering by typed characters improves the {n}-gram model", ngram_name(n, True), ngram_name(n, False),
               FILTER_SAYS) for n in params.ngram_orders]
    for claim, better, worse, says in pairs:
        b, w = _per_seed_users(users, better, seeds), _per_seed_users(users, worse, seeds)
        if better != LSTM:  # two counted models: one value per user, no seeds
            b, w = b[:1], w[:1]
        r = claims.paired_effect(b, w, streams.rng(params.seed, f"bootstrap/{claim}"), n_boot=params.bootstrap)
        rows.append({"effect": claim, "paper": says, "paper change": np.nan, "our change": r["change"],
                     "ci low": r["ci_low"], "ci high": r["ci_high"], "users": r["users"], "seeds": r["seeds"],
                     "users improved": r["users_improved"], "users worse": r["users_worse"],
                     "sign test p": r["sign_test_p"], "verdict": r["verdict"], "level": 0.95})
    return pd.DataFrame(rows)


def verdict_text(effects_table: pd.DataFrame, stand_in_data: str | None) -> str:
    """Markdown bullets: each claim's verdict and our change with its interval (the paper gives no number)."""
    lines = [f"- **{r['effect']}**: {r['verdict']}: {claims.percent(r['our change'])} (95% interval "
             f"{claims.percent(r['ci low'])} to {claims.percent(r['ci high'])}, {r['users']} users x {r['seeds']} "
             f"seed{'s' * (r['seeds'] != 1)}). The paper: {r['paper']}." for _, r in effects_table.iterrows()]
    if stand_in_data:
        lines.append(f"- Our data is **stand-in data** for {stand_in_data.strip().rstrip('.')}. Absolute numbers "
                     "are not comparable with the paper's; the direction and size of each effect are.")
    return "\n".join(lines)


def conclude(params: Params, corpus: Corpus, models: GlobalModels, ngrams: NGrams, users: pd.DataFrame,
             wall_time_s: float) -> record.Result:
    """Tables, headline numbers per seed, the paper's number beside ours, and the verdicts."""
    seeds = _lstm_seeds(users)
    best = max((m for m in model_names(params) if m != LSTM),
               key=lambda m: users[users.model == m].top_k_eff.median())
    lstm = [float(np.median(v)) for v in _per_seed_users(users, LSTM, seeds)]
    ngram_best = [float(np.median(v)) for v in _per_seed_users(users, best, seeds)]
    per_seed = {"top-k-eff, LSTM": lstm, "top-k-eff, best n-gram": ngram_best,
                "LSTM vs best n-gram, relative": [a / b - 1 for a, b in zip(lstm, ngram_best)]}
    # the n-grams are counted, not trained: the same value in every seed, within rounding elsewhere
    headline = {q: claims.headline(v, resolution=1e-4 if q == "top-k-eff, best n-gram" else 0.0) for q, v in per_seed.items()}
    table = summary(params, users)
    ours = {"top-k-eff, LSTM": headline["top-k-eff, LSTM"]["value"]}
    numbers = claims.paper_vs_ours(PAPER, ours)
    extra = [{"quantity": f"top-k-eff, {m}", "paper": np.nan, "ours": v, "ours / paper": np.nan,
              "paper source": "Fig. 1b: below the LSTM (no number in the text)"}
             for m, v in zip(table.model, table.top_k_eff_median) if m != LSTM]
    numbers = pd.concat([numbers, pd.DataFrame(extra)], ignore_index=True)
    card = common.model_card(models.model)
    tables = {"data": corpus.table(), "ngrams": ngrams.table(), "users": users, "summary": table,
              "global_model_cache": models.cache(), "headline": claims.headline_table(headline),
              "paper_vs_ours": numbers, "effects": effects(params, users)}
    test_words = users.drop_duplicates("user").test_words
    return record.Result(
        experiment=NAME, params=params.to_dict(), tables=tables, headline=headline,
        artifacts={"split.json": corpus.split.to_dict()},
        data=[corpus.manifest.summary()], stand_in_data=corpus.manifest.stand_in_for, wall_time_s=wall_time_s,
        notes={"vocabulary_size": corpus.vocab.size, "crowd_words": int(sum(map(len, corpus.crowd))),
               "test_users": list(corpus.split.test), "test_words": int(test_words.sum()), "seeds": seeds,
               "split_digest": corpus.split.digest, "best_ngram": best, "model_parameters": card["parameters"],
               "global_models_from_cache": {s: e.hit for s, e in models.entries.items()}},
    )


def run(params: Params, speeches=None, log=print) -> record.Result:
    """All stages in order, as the notebook runs them."""
    start = time.perf_counter()
    corpus = load_corpus(params, speeches, log)
    ngrams = fit_ngrams(params, corpus, log)
    models = train_global(params, corpus, log)
    users = score(params, corpus, models, ngrams, log)
    return conclude(params, corpus, models, ngrams, users, time.perf_counter() - start)


def plot_models(users: pd.DataFrame, params: Params):
    """Fig. 1b: top-k-eff per model (bar: median over users, seed mean for the LSTM; dots: users),
    and the word perplexity of the models that predict words."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    order = model_names(params)
    per_user = users.groupby(["model", "user"], as_index=False)[["top_k_eff", "word_perplexity"]].mean()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [3, 2]})
    medians = per_user.groupby("model").top_k_eff.median().reindex(order)
    axes[0].bar(order, medians, color=["#d1495b"] + ["#8c8c8c", "#5b7ea4"] * len(params.ngram_orders), alpha=0.8)
    sns.stripplot(data=per_user, x="model", y="top_k_eff", order=order, color="k", size=3, ax=axes[0])
    axes[0].set(xlabel="", ylabel=f"top-{params.k}-eff (test users' later lines)", title="LSTM vs n-grams (Fig. 1b)")
    ppl = per_user.dropna(subset=["word_perplexity"])
    ppl_order = [m for m in order if m in set(ppl.model)]
    sns.boxplot(data=ppl, x="model", y="word_perplexity", order=ppl_order, color="0.85", ax=axes[1], fliersize=2)
    axes[1].set(xlabel="", ylabel="word perplexity (per user)", title="next word before any character")
    sns.despine(fig)
    fig.tight_layout()
    return fig
