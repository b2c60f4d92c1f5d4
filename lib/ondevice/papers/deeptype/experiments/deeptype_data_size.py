"""DeepType D2 (Sec. 3.2, Fig. 2): how the global model's top-3-eff grows with its training data
and with epochs.

Global LSTMs train on nested shares of the crowd text (the smaller set is part of the larger), each
to a plateau of its held-out global-text loss, the rate decayed on that plateau (`plateau_decay`:
one rule for every size, the lowest-loss epoch kept), scored after every epoch on the test users'
later lines; the effects compare the kept epochs. Each size is one model-cache entry. The
vocabulary is the shared one (the paper keeps a fixed vocabulary). A 2-gram+char counted on the
same words is every size's baseline: an LSTM below it on held-out text is not converged
(`size_convergence.control`) and trains again under the remedies fixed before any run; each size
keeps the lowest held-out loss of its models (`size_convergence.choose`).

Stages (`run`: all): `load_corpus`, `training_sets`, `train_sizes`, `baselines`, `convergence`, `remedies`,
`choose`, `conclude`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ondevice import streams
from ondevice.data.per_user_text import Corpus, load_corpus
from ondevice.data.typing_samples import Samples, build_samples
from ondevice.models.ngram import PrefixFilter
from ondevice.papers.deeptype import common, report
from ondevice.papers.deeptype import size_convergence as conv
from ondevice.papers.deeptype.plateau_decay import PlateauDecay
from ondevice.params import ParameterError, presets
from ondevice.report import facts
from ondevice.report.conclusion import Conclusion, diagnosed, effect_row, wide
from ondevice.tasks import typing_protocol
from ondevice.training import model_cache
from ondevice.training.trainer import seed_everything

NAME = "deeptype_data_size"
TRAINING_CODE = common.TRAINING_CODE + ("ondevice.metrics", "ondevice.papers.deeptype.plateau_decay")
MODEL_FIELDS = tuple(
    "vocab_size embedding_dim hidden_units lstm_layers context_words global_batch_size global_learning_rate optimizer "
    "size_epochs size_patience personal_train_fraction eval_max_words k global_clip_norm global_lr_decay dropout "
    "global_loss_per global_holdout_words global_min_improvement".split()
)
# Our sizes map onto the paper's three by rank: smallest <-> 1M, second largest <-> 10M, largest <-> 20M words.
PAPER = facts.paper(NAME)
SIZE_EFFECTS = facts.load("deeptype")[NAME]["size_effects"]


@dataclass(frozen=True)
class Params(typing_protocol.DeepTypeParams):
    size_fractions: tuple[float, ...] = (0.05, 0.5, 1.0)  # shares of size_max_words (the paper: 1M, 10M, 20M)
    size_max_words: int = 0  # words of crowd text in the largest set; 0 = the whole crowd text
    # The rule of every size (`plateau_decay`), fixed before any run: the global rate (1.0) until an
    # epoch lowers the held-out loss by less than `global_min_improvement` (1%), then x `global_lr_decay`
    # (0.5) after each such epoch; `size_patience` of them in a row stop it; the lowest-loss epoch is kept.
    size_epochs: int = 60  # a cap only (Fig. 2 plots 10); the plateau ends training, `stopping` says which did
    size_patience: int = 3  # epochs in a row without improvement (each one halving the rate) before stopping
    # Remedies for a size below its 2-gram+char on held-out text (`size_convergence`), fixed before any
    # run: the same rule counting a tenth of the improvement, then that rule with PTB medium's dropout.
    # 15K words (held-out loss, top-k-eff; 2-gram+char 0.464): main 4.457, 0.356; patient 4.450, 0.357 (probe).
    remedy_min_improvement: float = 0.001
    remedy_dropout: float = 0.5
    eval_max_words: int = 0  # per test user, words of the later lines scored each epoch; 0 = all

    PRESETS = presets(
        typing_protocol.PRESETS,
        {
            "smoke": dict(size_fractions=(0.25, 0.5, 1.0), size_max_words=4000, size_epochs=15, eval_max_words=150),
            # the decay by epoch (13 at most) left the 15K-word model at 0.121 against its 2-gram's 0.443
            "default": dict(size_fractions=(0.1, 0.5, 1.0), size_max_words=150000, size_epochs=60, eval_max_words=500),
        },
    )

    def check(self) -> None:
        super().check()
        f, msg = self.size_fractions, "must hold at least three increasing shares in (0, 1]"
        self.require(len(f) >= 3 and all(0 < a < b for a, b in zip(f, f[1:])) and f[-1] <= 1, "size_fractions", msg)
        self.at_least(0, "size_max_words", "eval_max_words")  # 0: the whole crowd text, every later word
        self.at_least(1, "size_epochs", "size_patience", "global_holdout_words")  # the plateau reads held-out text
        self.require(0 <= self.remedy_min_improvement < 1, "remedy_min_improvement", "must be in [0, 1)")
        self.require(0 <= self.remedy_dropout < 1, "remedy_dropout", "must be in [0, 1)")


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
        test = corpus.personal(user, params.personal_train_fraction)[1]
        evaluation[user] = _head(test, min(len(test), params.eval_max_words or len(test)))
    count = sum(map(len, evaluation.values()))
    log(f"training sets of {list(sets)} crowd words; evaluation on {len(evaluation)} test users, {count} samples")
    return TrainingSets(sets, evaluation)


def _head(s: Samples, n: int) -> Samples:
    """The first n samples."""
    end = s.offsets[n]
    return Samples(s.inputs[:end], s.labels[:end], s.offsets[: n + 1], s.n_context[:n], s.word_len[:n], s.target[:n])


def size_model(
    params: Params, corpus: Corpus, sets: TrainingSets, words: int, seed: int, log=print, every_epoch: bool = True
) -> model_cache.Entry:
    """The global model trained on `words` words of crowd text to a plateau of its held-out
    global-text loss, the rate decayed on the plateau (`PlateauDecay`; at most `size_epochs`),
    keeping the lowest-loss epoch, and scored on every test user after each epoch (without
    `every_epoch`, at the kept epoch only: a remedy's curve is not Fig. 2's, and scoring the users
    costs more than an epoch of the small sets); from the model cache when it exists."""
    data, task = build_samples(sets.sets[words], corpus.vocab, params.context_words), common.task(params)
    held = corpus.holdout_samples

    def users(model) -> dict:
        scored = {u: task.evaluate(model, s) for u, s in sets.evaluation.items()}
        median = np.median([r["top_k_eff"] for r in scored.values()])
        log(f"{words} words (seed {seed}): median top-{params.k}-eff {median:.4f}")
        return {u: {"top_k_eff": r["top_k_eff"], "perplexity": r["perplexity"]} for u, r in scored.items()}

    def scores(model) -> dict:
        h = task.evaluate(model, held)
        loss = {"holdout_loss": float(np.log(h["perplexity"])), "holdout_top_k_eff": h["top_k_eff"]}
        return loss | ({"users": users(model)} if every_epoch else {})

    def train():
        model = common.build_model(params, corpus, seed)
        trainer, _ = common.global_trainer(params, model)  # the global regime; its by-epoch decay unused
        rng = streams.rng(seed, f"batches/data_size/{words}")
        rule = PlateauDecay(
            params.global_learning_rate, params.global_lr_decay, params.size_patience, params.global_min_improvement
        )
        args = (params.size_epochs, params.global_batch_size, rng, log, f"{words} words", scores, rule)
        history = trainer.fit(data, *args, schedule=rule)  # the model is left with the kept epoch's weights
        keys = ("epoch", "learning_rate", "loss", "seconds", "steps", "holdout_loss", "holdout_top_k_eff", "users")
        epochs = [{k: h[k] for k in keys if k in h} for h in history]
        if not every_epoch:
            next(e for e in epochs if e["epoch"] == history.best_epoch)["users"] = users(model)
        return model.get_weights(), {"epochs": epochs, "kept_epoch": history.best_epoch, "plateau": history.plateau}

    fields = {name: getattr(params, name) for name in MODEL_FIELDS} | {"seed": seed, "training_words": words}
    fields |= {} if every_epoch else {"users_scored": "kept epoch"}
    digests = [a.sha256 for a in corpus.manifest.artifacts] + [data.digest(), held.digest()]
    digests += [f"{u}:{s.digest()}" for u, s in sorted(sets.evaluation.items())]
    return model_cache.cached_train(NAME, fields, digests, TRAINING_CODE, train, log, sources=(size_model,))


def train_sizes(
    params: Params, corpus: Corpus, sets: TrainingSets, log=print
) -> dict[tuple[int, int], model_cache.Entry]:
    """One cached model per (seed, training-set size)."""
    seed_everything(params.seed)
    return {(seed, w): size_model(params, corpus, sets, w, seed, log) for seed in params.seed_list for w in sets.sets}


def baselines(params: Params, corpus: Corpus, sets: TrainingSets, log=print) -> pd.DataFrame:
    """One row per (size, test user): top-k-eff of the 2-gram counted on that size's words (no seeds)."""
    prefix, rows = PrefixFilter(corpus.vocab), []
    for words, sentences in sets.sets.items():
        model = conv.ngram(corpus.vocab, sentences)
        effs = {u: conv.ngram_eff(model, s, prefix, params.k) for u, s in sets.evaluation.items()}
        rows += [{"model": conv.BASELINE, "training_words": words, "user": u, "top_k_eff": e} for u, e in effs.items()]
        log(f"{conv.BASELINE} on {words} words: median top-{params.k}-eff {np.median(list(effs.values())):.4f}")
    return pd.DataFrame(rows)


def convergence(params: Params, corpus: Corpus, sets: TrainingSets, entries: dict, base: pd.DataFrame, log=print):
    """`size_convergence.control`: each size's LSTM against the 2-gram+char counted on its words, on
    the held-out global text (and, for the reader, on the test users)."""
    prefix = PrefixFilter(corpus.vocab)
    held = {
        w: conv.ngram_eff(conv.ngram(corpus.vocab, s), corpus.holdout_samples, prefix, params.k)
        for w, s in sets.sets.items()
    }
    table = conv.control(entries, held, base, curve(entries))
    for r in table.itertuples():
        lstm, ngram = f"{r.lstm_holdout_top_k_eff:.4f}", f"{r.ngram_holdout_top_k_eff:.4f}"
        verdict = "BELOW its 2-gram: not converged" if r.below_ngram else "at or above its 2-gram"
        log(f"{r.training_words} words (seed {r.seed}): held-out LSTM {lstm} vs {conv.BASELINE} {ngram}, {verdict}")
    return table


def remedies(params: Params, corpus: Corpus, sets: TrainingSets, checks: pd.DataFrame, log=print) -> dict:
    """(seed, size) -> remedy name -> cached model (`size_convergence.remedy_params`), for every size
    whose main-rule LSTM is below its 2-gram+char on held-out text (`checks`: `convergence`)."""
    below, variants = checks[checks.below_ngram], conv.remedy_params(params)
    train = lambda p, s, w: size_model(p, corpus, sets, w, s, log, every_epoch=False)  # noqa: E731
    return {(s, w): {n: train(p, s, w) for n, p in variants.items()} for s, w in zip(below.seed, below.training_words)}


def choose(params: Params, corpus: Corpus, sets: TrainingSets, entries: dict, tried: dict, base, log=print):
    """(each size's model, by `size_convergence.choose`: the lowest held-out loss; the control on
    them; every model tried, `size_convergence.remedies_table`)."""
    chosen, names = conv.choose(entries, tried)
    checks = convergence(params, corpus, sets, chosen, base, log)
    table = conv.remedies_table(entries, tried, names, dict(zip(checks.training_words, checks.ngram_holdout_top_k_eff)))
    return chosen, checks.assign(model=[names[k] for k in zip(checks.seed, checks.training_words)]), table


def curve(entries: dict[tuple[int, int], model_cache.Entry]) -> pd.DataFrame:
    """One row per (seed, size, epoch, test user): top-k-eff and perplexity after that epoch, and
    whether it is the epoch whose weights the model keeps."""
    return pd.DataFrame(
        [
            {"seed": seed, "training_words": words, "epoch": e["epoch"], "kept": e["epoch"] == entry.info["kept_epoch"]}
            | {"user": user, **s}
            for (seed, words), entry in entries.items()
            for e in entry.info["epochs"]
            for user, s in e.get("users", {}).items()
        ]
    )


def _final(points: pd.DataFrame, words: int) -> np.ndarray:
    """(seeds, users) top-k-eff at the kept epoch of one size."""
    return wide(points[(points.training_words == words) & points.kept], "top_k_eff")


def effects(params: Params, points: pd.DataFrame, checks=None, base=None, tried=None) -> pd.DataFrame:
    """The paper's data-size claims, judged at the kept epochs by a paired bootstrap over users;
    a flagged row's diagnosis (`size_convergence.diagnosis`, with `checks`, `base` and the
    remedies' table `tried`) reads this run's measurements."""
    sizes, paper, rows = sorted(points.training_words.unique()), {n.quantity: n.value for n in PAPER.numbers}, []
    for e in SIZE_EFFECTS:
        better, worse, rng = sizes[e["better"]], sizes[e["worse"]], streams.rng(params.seed, f"bootstrap/{e['claim']}")
        first = {"effect": e["claim"], "words": f"{worse} -> {better}", "paper change": paper[e["paper"]]}
        row = effect_row(first, _final(points, better), _final(points, worse), rng, params.bootstrap)
        rows.append(diagnosed(row, conv.diagnosis(row, checks, base, points[points.kept], worse, better, tried)))
    return pd.DataFrame(rows)


def conclude(params: Params, corpus: Corpus, sets, entries, base, checks, wall_time_s: float, chosen=None, tried=None):
    """Tables, headline numbers per seed, the paper's numbers beside ours, and the verdicts: Fig. 2's
    curves are the main rule's (`entries`), the effects each size's chosen model's (`chosen`,
    `checks`: `choose`; `tried`: every model tried, `size_convergence.remedies_table`)."""
    points, kept = curve(entries), curve(chosen or entries)
    stops, (small, *_, second, large) = checks, sorted(sets.sets)
    final = {w: np.median(_final(kept, w), axis=1) for w in (small, second, large)}
    per_seed = {
        "top-k-eff, smallest training set": final[small],
        "top-k-eff, second largest training set": final[second],
        "top-k-eff, largest training set": final[large],
        "relative gain, smallest -> second largest set": final[second] / final[small] - 1,
        "relative gain, second largest -> largest set": final[large] / final[second] - 1,
    }
    converge = {"epochs to converge (largest set)": stops[stops.training_words == large].kept_epoch.tolist()}
    c = Conclusion(NAME, params, PAPER)
    c.headlines(per_seed | converge, {q: 1.0 for q in converge})
    numbers = c.paper_vs_ours()
    numbers["ours: words"] = [small, second, f"{small} -> {second}", f"{second} -> {large}", large]
    c.effect_rows(effects(params, kept, stops, base, tried))
    evaluation = pd.DataFrame([{"user": u, "evaluation_words": len(s)} for u, s in sets.evaluation.items()])
    tables = {
        "training_sets": sets.table(),
        "evaluation": evaluation,
        "curve": points,
        "summary": conv.summary_table(points),
        "training": conv.training(entries),
        "stopping": stops,
        "baseline": base,
        "medians": conv.medians(kept, base),
    } | ({"remedies": tried} if tried is not None else {})
    cached = {f"{s}/{w}": e.hit for (s, w), e in entries.items()}
    below = {f"{s}/{w}": bool(b) for s, w, b in zip(stops.seed, stops.training_words, stops.below_ngram)}
    notes = dict(models_from_cache=cached, lstm_below_its_2gram_on_held_out_text=below)
    return report.record(c, corpus, tables, wall_time_s, **notes)


def run(params: Params, speeches=None, log=print):
    """All stages in order, as the notebook runs them."""
    start = time.perf_counter()
    corpus = load_corpus(params, speeches, log)
    sets = training_sets(params, corpus, log)
    entries = train_sizes(params, corpus, sets, log)
    base = baselines(params, corpus, sets, log)
    tried = remedies(params, corpus, sets, convergence(params, corpus, sets, entries, base, log), log)
    chosen, checks, table = choose(params, corpus, sets, entries, tried, base, log)
    return conclude(params, corpus, sets, entries, base, checks, time.perf_counter() - start, chosen, table)
