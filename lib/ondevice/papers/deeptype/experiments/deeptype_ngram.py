"""DeepType D1 (Fig. 1b): the LSTM global model against word n-gram baselines.

2-gram and 3-gram models with interpolated Kneser-Ney smoothing (`models.ngram`), each with and
without filtering the suggestions by the typed characters, are counted on the crowd text the
global LSTM trains on and scored with the same top-k-eff on the same test samples: the later
lines of each test user. The LSTM is the shared global model of every seed (model cache).

Stages: `per_user_text.load_corpus`, `fit_ngrams`, `common.train_global`, `score`, `conclude`; `run` calls them all.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
import tensorflow as tf

from ondevice import streams
from ondevice.data.per_user_text import Corpus, load_corpus
from ondevice.data.typing_samples import Samples
from ondevice.metrics import top_k_eff
from ondevice.models.ngram import KneserNey, PrefixFilter, chars_needed
from ondevice.papers.deeptype import common, report
from ondevice.papers.deeptype.common import GlobalModels, train_global
from ondevice.params import presets
from ondevice.report import claims, facts
from ondevice.report.conclusion import Conclusion, effect_row, wide
from ondevice.tasks import typing_protocol

NAME = "deeptype_ngram"
LSTM = "LSTM"
# Fig. 1b has bars without numbers; the LSTM's number is Fig. 2's (10M words), which Sec. 3.2 compares.
PAPER = facts.paper(NAME)
SAYS = facts.load("deeptype")[NAME]["says"]


def ngram_name(order: int, prefix_filter: bool) -> str:
    return f"{order}-gram" + ("+char" if prefix_filter else "")


@dataclass(frozen=True)
class Params(typing_protocol.DeepTypeParams):
    ngram_orders: tuple[int, ...] = (2, 3)

    # The model fields are the shared presets', so the LSTMs are the other notebooks' cache entries.
    PRESETS = presets(typing_protocol.PRESETS, {"paper": dict(seeds=3)})

    def check(self) -> None:
        super().check()
        n = self.ngram_orders
        self.require(len(n) >= 1 and min(n) >= 1, "ngram_orders", "must list n-gram orders of at least 1")
        msg = f"must not look further back than context_words ({self.context_words}) previous words"
        self.require(max(n) - 1 <= self.context_words, "ngram_orders", msg)


@dataclass
class NGrams:
    """The n-gram models counted on the crowd, and the prefix filter over the vocabulary."""

    models: dict[int, KneserNey]
    prefix: PrefixFilter

    def table(self) -> pd.DataFrame:
        """Per model and order of its interpolation: distinct contexts, n-gram types and discount."""
        columns = ("model", "order", "contexts", "ngram_types", "counts", "discount")
        rows = [
            (f"{n}-gram", m + 1, len(o.keys), int(o.types.sum()), "raw" if m + 1 == n else "continuation", o.discount)
            for n, model in self.models.items()
            for m, o in enumerate(model.orders)
        ]
        return pd.DataFrame(rows, columns=columns)


def fit_ngrams(params: Params, corpus: Corpus, log=print) -> NGrams:
    """Count every n-gram order on the crowd text the global LSTM trains on (words outside the
    vocabulary become <unk>, as for the LSTM)."""
    ids = [[corpus.vocab.word_id(w) for w in s] for s in corpus.crowd]
    models = {n: KneserNey.fit(ids, n, corpus.vocab.size) for n in params.ngram_orders}
    log(f"n-grams counted on {sum(map(len, ids))} crowd words: orders {list(params.ngram_orders)}")
    return NGrams(models, PrefixFilter(corpus.vocab))


def lstm_word_log_probs(model, samples: Samples, batch_size: int = 512) -> np.ndarray:
    """log P(word | previous words) of the LSTM before any character is typed, for every sample
    with at least one previous word (NaN for the others): what the n-grams predict too."""
    out, idx_all = np.full(len(samples), np.nan), np.flatnonzero(samples.n_context > 0)
    for start in range(0, len(idx_all), batch_size):
        idx = idx_all[start : start + batch_size]
        nc = samples.n_context[idx]
        x = np.zeros((len(idx), int(nc.max())), np.int32)  # right-padded: a forward LSTM's real positions are exact
        for row, j in enumerate(idx):
            x[row, : nc[row]] = samples.inputs[samples.offsets[j] : samples.offsets[j] + nc[row]]
        logits = model(x, training=False).numpy()[np.arange(len(idx)), nc - 1]
        out[idx] = tf.nn.log_softmax(logits).numpy()[np.arange(len(idx)), samples.target[idx]]
    return out


def _word_perplexity(log_prob: np.ndarray, mask: np.ndarray) -> float:
    return float(np.exp(-np.mean(log_prob[mask])))


def _row(model: str, seed, base: dict, eff: float, perplexity: float) -> dict:
    return {"model": model, "seed": seed, **base, "top_k_eff": eff, "word_perplexity": perplexity}


def score(params: Params, corpus: Corpus, models: GlobalModels, ngrams: NGrams, log=print) -> pd.DataFrame:
    """One row per (model, seed, test user): top-k-eff on the user's later lines, and the word
    perplexity over the words with a previous word (n-gram rows have no seed: counted, not trained)."""
    task, rows, users = common.task(params), [], corpus.split.test
    for n_user, user in enumerate(users, 1):
        _, test = corpus.personal(user, params.personal_train_fraction)
        context, oov = test.n_context > 0, float(np.mean(test.target == 1))
        base = {
            "user": user,
            "test_words": len(test),
            "test_words_with_context": int(context.sum()),
            "test_oov_rate": oov,
        }
        mine = []
        for n, model in ngrams.models.items():
            for prefix_filter in (False, True):
                needed, log_prob = chars_needed(model, test, ngrams.prefix, params.k, prefix_filter)
                ppl = np.nan if prefix_filter else _word_perplexity(log_prob, context)
                mine.append(_row(ngram_name(n, prefix_filter), pd.NA, base, top_k_eff(test.word_len, needed), ppl))
        for seed in models.entries:  # each run seed's global model (seeds may share one)
            models.model.set_weights(models.weights[seed])
            ppl = _word_perplexity(lstm_word_log_probs(models.model, test), context)
            mine.append(_row(LSTM, seed, base, task.evaluate(models.model, test)["top_k_eff"], ppl))
        rows += mine
        names = [
            f"{r['model']}{'' if pd.isna(r['seed']) else ' s' + str(r['seed'])} {r['top_k_eff']:.3f}" for r in mine
        ]
        log(f"user {n_user}/{len(users)} {user}: top-{params.k}-eff " + ", ".join(names))
    table = pd.DataFrame(rows)
    table["seed"] = table.seed.astype("Int64")
    return table


def model_names(params: Params) -> list[str]:
    return [LSTM] + [ngram_name(n, f) for n in params.ngram_orders for f in (False, True)]


def _per_seed_users(users: pd.DataFrame, model: str, seeds: list[int]) -> np.ndarray:
    """(seeds, users) top-k-eff of one model; a counted n-gram repeats its one value in every seed,
    so it pairs with each seed's LSTM."""
    sel = users[users.model == model]
    if model == LSTM:
        return wide(sel, "top_k_eff")
    return np.tile(sel.set_index("user").sort_index().top_k_eff.to_numpy(float), (len(seeds), 1))


def summary(params: Params, users: pd.DataFrame) -> pd.DataFrame:
    """Per model: median over users of top-k-eff and word perplexity (mean over seeds for the LSTM)."""
    rows = []
    for model in model_names(params):
        sel = users[users.model == model]
        keys = sel.seed.dropna().unique()
        groups = [sel[sel.seed == s] for s in keys] if len(keys) else [sel]
        rows.append(
            {
                "model": model,
                "top_k_eff_median": float(np.mean([g.top_k_eff.median() for g in groups])),
                "word_perplexity_median": float(np.mean([g.word_perplexity.median() for g in groups])),
                "users": sel.user.nunique(),
                "seeds": len(keys),
            }
        )
    return pd.DataFrame(rows)


def _lstm_seeds(users: pd.DataFrame) -> list[int]:
    return sorted(int(s) for s in users.seed.dropna().unique())


def effects(params: Params, users: pd.DataFrame) -> pd.DataFrame:
    """The paper's claims, which come without numbers, judged by a paired bootstrap over users:
    the LSTM against each n-gram variant, and the character filter against the plain n-gram."""
    seeds, rows, orders = _lstm_seeds(users), [], params.ngram_orders
    pairs = [
        (f"the LSTM beats the {ngram_name(n, f)} model", LSTM, ngram_name(n, f), SAYS["lstm"])
        for n in orders
        for f in (False, True)
    ]
    pairs += [
        (
            f"filtering by typed characters improves the {n}-gram model",
            ngram_name(n, True),
            ngram_name(n, False),
            SAYS["filter"],
        )
        for n in orders
    ]
    for claim, better, worse, says in pairs:
        b, w = _per_seed_users(users, better, seeds), _per_seed_users(users, worse, seeds)
        if better != LSTM:  # two counted models: one value per user, no seeds
            b, w = b[:1], w[:1]
        rng = streams.rng(params.seed, f"bootstrap/{claim}")
        rows.append(effect_row({"effect": claim, "paper": says, "paper change": np.nan}, b, w, rng, params.bootstrap))
    return pd.DataFrame(rows)


def verdict_text(effects_table: pd.DataFrame, stand_in_data: str | None) -> str:
    """Markdown bullets: each claim's verdict and our change with its interval (the paper gives no number)."""
    pct = claims.percent
    lines = [
        f"- **{r['effect']}**: {r['verdict']}: {pct(r['our change'])} (95% interval {pct(r['ci low'])} to "
        f"{pct(r['ci high'])}, {r['users']} users x {r['seeds']} seed{'s' * (r['seeds'] != 1)}). "
        f"The paper: {r['paper']}."
        for _, r in effects_table.iterrows()
    ]
    if stand_in_data:
        lines.append(
            f"- Our data is **stand-in data** for {stand_in_data.strip().rstrip('.')}. Absolute numbers "
            "are not comparable with the paper's; the direction and size of each effect are."
        )
    return "\n".join(lines)


def conclude(params: Params, corpus: Corpus, models: GlobalModels, ngrams: NGrams, users, wall_time_s: float):
    """Tables, headline numbers per seed, the paper's number beside ours, and the verdicts."""
    seeds = _lstm_seeds(users)
    best = max((m for m in model_names(params) if m != LSTM), key=lambda m: users[users.model == m].top_k_eff.median())
    lstm, ngram = ([float(np.median(v)) for v in _per_seed_users(users, m, seeds)] for m in (LSTM, best))
    per_seed = {"top-k-eff, LSTM": lstm, "top-k-eff, best n-gram": ngram}
    per_seed["LSTM vs best n-gram, relative"] = [a / b - 1 for a, b in zip(lstm, ngram)]
    c = Conclusion(NAME, params, PAPER)
    # the n-grams are counted, not trained: the same value in every seed, within rounding elsewhere
    c.headlines(per_seed, {"top-k-eff, best n-gram": 1e-4})
    table = summary(params, users)
    extra = [
        (f"top-k-eff, {m}", np.nan, v, np.nan, SAYS["ngram_number"])
        for m, v in zip(table.model, table.top_k_eff_median)
    ]
    numbers = c.paper_vs_ours()
    c.tables["paper_vs_ours"] = pd.concat(
        [numbers, pd.DataFrame(extra[1:], columns=numbers.columns)], ignore_index=True
    )
    c.effect_rows(effects(params, users))
    tables = {"ngrams": ngrams.table(), "users": users, "summary": table}
    test_words = int(users.drop_duplicates("user").test_words.sum())
    return report.record(c, corpus, tables, wall_time_s, models, test_words=test_words, best_ngram=best)


def run(params: Params, speeches=None, log=print):
    """All stages in order, as the notebook runs them."""
    start = time.perf_counter()
    corpus = load_corpus(params, speeches, log)
    ngrams = fit_ngrams(params, corpus, log)
    models = train_global(params, corpus, log)
    users = score(params, corpus, models, ngrams, log)
    return conclude(params, corpus, models, ngrams, users, time.perf_counter() - start)
