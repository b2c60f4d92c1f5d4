"""Personal data sizes (D4, Fig. 7): a user's history split as D3 splits it, the last part of its
training lines held out to stop personal training (`protocol.personalize`), the most recent share of
the rest (a phone that has collected less history), what the dynamic vocabulary can reach at each
size by counting alone, and the planted-signal control (`planted`) at the paper's two sizes, in the
condition of the rows it vouches for."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ondevice import streams
from ondevice.data.per_user_text import Corpus
from ondevice.data.splits import split_history
from ondevice.data.typing_samples import UNK_ID, build_samples
from ondevice.papers.deeptype import planted, protocol, step_size
from ondevice.papers.deeptype.techniques import dynamic_vocab

PLANTED_SIZES = (0.5, 1.0)  # the paper's 50K and 100K; the control's rule is judged at 100%
GLOBAL = "G-M"


def condition(fraction: float | None, dynamic: bool) -> str:
    """Fig. 7's labels: G-M, P-M <size> (dynamic vocabulary), P-M* <size> (without)."""
    return GLOBAL if fraction is None else f"P-M{'' if dynamic else '*'} {fraction:.0%}"


def history(corpus: Corpus, user: str, train_fraction: float) -> tuple[list, list]:
    """A user's earlier sentences (personal training part) and later ones (test), as D3 splits them."""
    sents = corpus.users[user]
    return split_history(sents, [len(s) for s in sents], train_fraction)


def held_out(train: list[list[str]], fraction: float) -> tuple[list, list]:
    """The training lines less their last `fraction` of words, and those last lines (the hold-out that
    stops personal training, as `Corpus.personal_parts` splits it); no hold-out for 0."""
    return split_history(train, [len(s) for s in train], 1 - fraction) if fraction else (train, [])


def recent(train: list[list[str]], fraction: float) -> list[list[str]]:
    """The most recent `fraction` of the training part's words (whole sentences, at least that many)."""
    return train if fraction >= 1 else split_history(train, [len(s) for s in train], 1 - fraction)[1]


def example_swap(params, corpus: Corpus, user: str, rows: int = 10) -> pd.DataFrame:
    """The swap of one user on all of their personal training part: reused id, the global word
    that held it, the user's word that takes it and how often the user typed it."""
    own = history(corpus, user, params.personal_train_fraction)[0]
    swap = dynamic_vocab.swap(corpus.vocab, own, params.dynamic_vocab_min_count)
    return pd.DataFrame(
        {
            "id": swap.ids,
            "global word (never typed by the user)": swap.replaced,
            "user's word": swap.added,
            "times typed": swap.counts,
        }
    ).head(rows)


def vocabulary_reach(params, corpus: Corpus) -> pd.DataFrame:
    """Counting only, no model: per threshold and data fraction, the words the swap adds and the
    share of test words out of vocabulary before and after it (pooled over test users)."""
    rows, users = [], [history(corpus, u, params.personal_train_fraction) for u in corpus.split.test]
    for fraction in params.data_fractions:
        parts = [(recent(train, fraction), [w for s in test for w in s]) for train, test in users]
        words = sum(len(t) for _, t in parts)
        before = sum(corpus.vocab.word_id(w) == UNK_ID for _, t in parts for w in t)
        for n in params.reach_min_counts:
            swaps = [dynamic_vocab.swap(corpus.vocab, own, n) for own, _ in parts]
            after = sum(sw.vocab.word_id(w) == UNK_ID for sw, (_, t) in zip(swaps, parts) for w in t)
            rows.append(
                {
                    "data_fraction": fraction,
                    "min_count": n,
                    "added_words_median": float(np.median([s.size for s in swaps])),
                    "test_oov_global_vocab": before / words,
                    "test_oov_user_vocab": after / words,
                    "used": n == params.dynamic_vocab_min_count,
                }
            )
    return pd.DataFrame(rows)


def _planted_rows(params, models, plant: Corpus, dose: float, log) -> list[dict]:
    """Per seed and test user of `plant`: the global model's top-k-eff on the later lines and, per
    size of `PLANTED_SIZES`, the personal model's (P-M: the user's dynamic vocabulary, the hold-out,
    the step-size reading, the protocol and random stream of the main rows)."""
    rows, personal, cw = [], protocol.Personal(params, models.model), params.context_words
    for seed in params.seed_list:
        start, rates = (
            models.weights[seed],
            step_size.schedule(params, params.step_reading, step_size.kept_epoch(models, seed)),
        )
        for user in plant.split.test:
            train, test = history(plant, user, params.personal_train_fraction)
            train, held = held_out(train, params.personal_holdout_fraction)
            before = personal.score_weights(start, build_samples(test, plant.vocab, cw))["top_k_eff"]
            for f in PLANTED_SIZES:
                rng, own = streams.rng(seed, f"personal/{user}/data{f:g}"), recent(train, f)
                words = dynamic_vocab.swap(plant.vocab, own, params.dynamic_vocab_min_count).vocab
                fit, stop = (build_samples(lines, words, cw) if lines else None for lines in (own, held))
                scored = personal.train(
                    (fit, build_samples(test, words, cw)), start, params, rng, held=stop, schedule=rates
                )
                row = {"seed": seed, "user": user, "data_fraction": f, "kept_epoch": scored[0]["kept_epoch"]}
                rows.append(row | {"top_k_eff_global": before, "top_k_eff": scored[0]["top_k_eff"]})
    log(f"planted dose {dose:g}: {len(rows)} personal models")
    return rows


def planted_control(params, corpus: Corpus, models, users: pd.DataFrame, log=print) -> dict[str, pd.DataFrame]:
    """The planted-signal control from the main start at each size of `PLANTED_SIZES` (dose 0: the main
    rows): the gain of P-M over G-M per dose; the rule (`planted.verdict`) is judged at 100%, the
    curve of every size is in `planted_curve_by_size`."""
    keyed = users.set_index(["seed", "user"])
    glob = keyed[keyed.condition == GLOBAL].top_k_eff.rename("top_k_eff_global")
    main = [
        keyed[keyed.condition == condition(f, True)][["top_k_eff", "kept_epoch"]].join(glob).assign(data_fraction=f)
        for f in PLANTED_SIZES
    ]
    main = [m.reset_index() for m in main]
    measure = lambda plant, dose: _planted_rows(params, models, plant, dose, log)  # noqa: E731
    per_user = planted.doses(params, corpus, measure, pd.concat(main, ignore_index=True))
    by_size = [planted.curve(d, params).assign(data_fraction=f) for f, d in per_user.groupby("data_fraction")]
    tables = planted.tables(params, per_user[per_user.data_fraction == max(PLANTED_SIZES)])
    return tables | {"planted": per_user, "planted_curve_by_size": pd.concat(by_size, ignore_index=True)}
