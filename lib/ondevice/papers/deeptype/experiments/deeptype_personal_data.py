"""DeepType D4 (Fig. 7): how much does more personal data help, and how much the dynamic vocabulary?

The users and split are every DeepType notebook's; personalization starts from a global model
(`starts`: the paper's Fig. 7 left starts from a public Twitter model, ours from Sent140's tweets, and
the crowd model beside it). Each test user's history is split as in D3 (earlier lines for personal
training, later lines for testing) and personal training follows top3eff's protocol (`protocol`): the
last part of the training lines is held out, and each personal model is kept at the epoch with the
lowest loss on it (the global model, epoch 0, included), at the step-size reading's rates (`step_size`).
The personal model trains on the most recent 25 / 50 / 100% of the rest (`personal_sizes`), with and
without the dynamic vocabulary (`techniques.dynamic_vocab`), on the same batches in the same order, so
the two differ only in the vocabulary. The planted-signal control (`planted`) runs at the paper's two
sizes in the condition of the rows it vouches for (dynamic vocabulary, hold-out, step).

Stages: `starts.load`, `starts.train`, `personal_sizes.vocabulary_reach`, `personalize` from each start (`starts.each`),
`personal_sizes.planted_control`, `conclude`.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ondevice import streams
from ondevice.data.per_user_text import Corpus
from ondevice.data.typing_samples import UNK_ID, build_samples
from ondevice.metrics import top_k_eff
from ondevice.papers.deeptype import common, personal_sizes, planted, protocol, report, starts, step_size
from ondevice.papers.deeptype.common import GlobalModels
from ondevice.papers.deeptype.personal_sizes import GLOBAL, condition, history, recent
from ondevice.papers.deeptype.techniques import dynamic_vocab
from ondevice.params import presets
from ondevice.report import claims, facts
from ondevice.report.conclusion import Conclusion, effect_row, wide
from ondevice.tasks import typing_protocol

NAME = "deeptype_personal_data"
# Fig. 7 (left: a Twitter-trained global model) gives numbers in the text; ours is Sent140's (`starts`),
# the crowd's (its right panel) beside it. 50K and 100K samples are our 50% and 100%.
PAPER = facts.paper(NAME)
ALSO = ", validation choice"  # suffix of a condition trained with the validation users' personal choice
SECTION = "Personal training with the validation users' choice"
PLANTED_SECTION = "Planted-signal control: would personal training see a personal signal if the data had one?"
QUANTITIES = {
    "top-k-eff, G-M": GLOBAL,
    "top-k-eff, P-M 50%": "P-M 50%",
    "top-k-eff, P-M 100%": "P-M 100%",
    "top-k-eff, P-M* 100%": "P-M* 100%",
}


@dataclass(frozen=True)
class Params(starts.Params):
    data_fractions: tuple[float, ...] = (0.25, 0.5, 1.0)  # of each user's personal training part
    dynamic_vocab_min_count: int = dynamic_vocab.MIN_COUNT  # times a word must be typed to enter the user's vocabulary
    reach_min_counts: tuple[int, ...] = (1, 2, 3, 5, 10)  # thresholds of the counting-only table
    # top3eff's protocol (issue 74; until 2026-12-07 one fixed epoch at SGD 1.0, which lowered P-M 50% below
    # G-M for 20 of 20 users from the crowd model): `personal_holdout_fraction` of each user's training lines
    # held out (the same lines for every data fraction), at most `personal_epochs`, the epoch of the lowest
    # held-out loss kept, the rates of `step_reading` (fixed before the run: the reading `step_size.choose`
    # gives on a tie, as top3eff's validation users tied). The validation choice runs at its constant rate.
    step_reading: str = step_size.READINGS[0]

    # Starts (`global_texts`): Sent140 (the paper's public Twitter model; main; 90,744 words + 20,006 held out
    # at default, 12,000 at smoke), the crowd beside it (246,561 words at default). The planted
    # control's gain is P-M minus G-M top-k-eff at 50% and 100%, its rule judged at 100%.
    PRESETS = presets(
        typing_protocol.PRESETS,
        planted.PRESETS,
        {"smoke": dict(seeds=2, personal_epochs=2), "default": dict(seeds=1)},
    )

    def check(self) -> None:
        super().check()
        f = self.data_fractions
        self.require(
            all(0 < x <= 1 for x in f) and len(set(f)) == len(f), "data_fractions", "must lie in (0, 1], once each"
        )
        self.require({0.5, 1.0} <= set(f), "data_fractions", "must include 0.5 and 1.0 (the paper's 50K and 100K)")
        self.require(self.dynamic_vocab_min_count >= 1, "dynamic_vocab_min_count", "must be at least 1")
        self.require(all(t >= 1 for t in self.reach_min_counts), "reach_min_counts", "must hold counts >= 1")
        self.require(self.step_reading in step_size.READINGS, "step_reading", f"must be one of {step_size.READINGS}")


class _Personal:
    """Scores and personal models of one user under every condition, with one protocol trainer."""

    def __init__(self, params: Params, corpus: Corpus, models: GlobalModels):
        self.params, self.corpus, self.models, self.task = params, corpus, models, common.task(params)
        self.trainer = protocol.personal_trainer(params, models.model, self.task)
        also = protocol.validation_choice(params) if params.also_optimizer else None
        self.also = (also, protocol.personal_trainer(also, models.model, self.task)) if also else None

    def _score(self, test: list, vocab, swap, added: set, row: dict) -> dict:
        """top-k-eff on the test lines with `vocab`; `added` are the words the swap would add (also
        scored without it, where they are <unk> and save nothing)."""
        samples = build_samples(test, vocab, self.params.context_words)
        scores, words = self.task.evaluate(self.trainer.model, samples), [w for s in test for w in s]
        new, lengths, needed = np.array([w in added for w in words]), samples.word_len, scores["chars_needed"]
        on_new = top_k_eff(lengths[new], needed[new]) if new.any() else float("nan")
        oov = {"test_oov_global_vocab": self.corpus.oov(words), "test_oov": float(np.mean(samples.target == UNK_ID))}
        row |= {"test_words": len(words), "added_words": swap.size if swap else 0, **oov}
        row |= {"test_share_new_words": float(new.mean()), "top_k_eff": scores["top_k_eff"]}
        return row | {"top_k_eff_on_new_words": on_new, "_chars": (lengths, needed, new)}

    def user(self, user: str, seed: int) -> list[dict]:
        p, weights, vocab = self.params, self.models.weights[seed], self.corpus.vocab
        train, test = history(self.corpus, user, p.personal_train_fraction)
        train, held = personal_sizes.held_out(train, p.personal_holdout_fraction)
        rates = step_size.schedule(p, p.step_reading, step_size.kept_epoch(self.models, seed))
        self.trainer.reset(weights)
        row = dict(seed=seed, user=user, condition=GLOBAL, data_fraction=0.0, dynamic_vocab=False, train_words=0)
        rows = [self._score(test, vocab, None, set(), {**row, "personal_train_seconds": 0.0})]
        runs = [(f, d, "") for f in p.data_fractions for d in (False, True)]  # with and without the swap
        runs += [(f, True, ALSO) for f in (0.5, 1.0) if self.also]  # the effects' personal models, again
        for fraction, dynamic, suffix in runs:
            own = recent(train, fraction)
            swap = dynamic_vocab.swap(vocab, own, p.dynamic_vocab_min_count)
            words = swap.vocab if dynamic else vocab
            samples = build_samples(own, words, p.context_words)  # same batches: only ids differ
            stop = build_samples(held, words, p.context_words) if held else None
            start, rng = time.perf_counter(), streams.rng(seed, f"personal/{user}/data{fraction:g}")
            trainer, how, schedule = (self.trainer, p, rates) if not suffix else (*self.also[::-1], None)
            kept = protocol.personalize(trainer, weights, samples, how, rng, held=stop, schedule=schedule).best_epoch
            row |= dict(condition=condition(fraction, dynamic) + suffix, data_fraction=fraction, dynamic_vocab=dynamic)
            row |= dict(train_words=len(samples), kept_epoch=kept, personal_train_seconds=time.perf_counter() - start)
            used = (swap.vocab, swap) if dynamic else (vocab, None)
            rows.append(self._score(test, *used, set(swap.added), dict(row)))
        return rows


def personalize(params: Params, corpus: Corpus, models: GlobalModels, log=print) -> list[dict]:
    """Every seed, every test user: the global model, then a personal model per data fraction,
    with and without the dynamic vocabulary, each trained from the global weights."""
    personal, rows, users = _Personal(params, corpus, models), [], corpus.split.test
    for seed in params.seed_list:
        for n, user in enumerate(users, 1):
            start, got = time.perf_counter(), personal.user(user, seed)
            rows += got
            scores = ", ".join(f"{r['condition']} {r['top_k_eff']:.3f}" for r in got)
            log(f"seed {seed} user {n}/{len(users)} {user}: {scores} ({time.perf_counter() - start:.1f}s)")
    return rows


def _wide(users: pd.DataFrame, name: str) -> np.ndarray:
    return wide(users, "top_k_eff", condition=name)


def contrasts(params: Params, users: pd.DataFrame) -> pd.DataFrame:
    """Every pairwise comparison the figure suggests, each with a paired bootstrap interval over
    users: more data (with and without the dynamic vocabulary), the dynamic vocabulary at each
    data size, and each personal model against the global model."""
    fr, rng = sorted(params.data_fractions), streams.rng(params.seed, "bootstrap/contrasts")
    pairs = [(condition(b, d), condition(a, d)) for d in (True, False) for i, a in enumerate(fr) for b in fr[i + 1 :]]
    pairs += [(condition(f, True), condition(f, False)) for f in fr]
    pairs += [(condition(f, d), GLOBAL) for f in fr for d in (True, False)]
    rows = [
        effect_row({"better": b, "worse": w}, _wide(users, b), _wide(users, w), rng, params.bootstrap) for b, w in pairs
    ]
    return pd.DataFrame(rows).drop(columns=["users", "seeds", "level"])


def summary_table(users: pd.DataFrame, rows: list[dict]) -> pd.DataFrame:
    """Per seed and condition: medians over users, and top-k-eff pooled over every test word."""
    how = {c: (c, "first") for c in ("data_fraction", "dynamic_vocab")} | {"top_k_eff_median": ("top_k_eff", "median")}
    how |= {f"{c}_median": (c, "median") for c in ("test_oov", "added_words", "train_words")}
    summary = users.groupby(["seed", "condition"], as_index=False, sort=False).agg(**how)
    pooled = report.pooled(rows)
    chars = [pooled[k] for k in zip(summary.seed, summary.condition)]
    on_new = [top_k_eff(n[new], c[new]) if new.any() else float("nan") for n, c, new in chars]
    summary.insert(5, "top_k_eff_pooled", [top_k_eff(n, c) for n, c, _ in chars])
    summary.insert(6, "top_k_eff_on_new_words_pooled", on_new)
    return summary


def paper_conditions(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of Fig. 7's conditions (the validation choice's reruns left out)."""
    return table[~table.condition.str.endswith(ALSO)]


def also_diagnoses(params: Params, users: pd.DataFrame) -> dict[str, claims.Diagnosis]:
    """Each effect whose personal models were trained again with the validation users' choice: the
    same effect with them (SUMMARY.md shows it where the audit rule flags the paper's)."""
    named = lambda q: QUANTITIES[q] + ("" if QUANTITIES[q] == GLOBAL else ALSO)  # noqa: E731
    out, have, choice = {}, set(users.condition), f"{params.also_optimizer} {params.also_learning_rate:g}"
    for e in PAPER.effects:
        better, worse = named(e.better), named(e.worse)
        if {better, worse} <= have and ALSO in better + worse:
            rng = streams.rng(params.seed, f"bootstrap/also/{e.claim}")
            r = effect_row({}, _wide(users, better), _wide(users, worse), rng, params.bootstrap)
            line = f"{r['our change']:+.1%} [{r['ci low']:+.1%}, {r['ci high']:+.1%}]"
            text = f"with the validation users' choice ({choice}): {line}"
            out[e.claim] = claims.Diagnosis(text, SECTION, claims.Kind.OPEN)  # our choice of setting, so ours
    return out


def reach_diagnoses(params: Params, reach: pd.DataFrame) -> dict[str, claims.Diagnosis]:
    """The dynamic vocabulary's effect beside what it can reach (`vocabulary_reach`, no model):
    only the test words it brings into the vocabulary get new suggestions, which the users' data sets."""
    out = {}
    for e in PAPER.effects:
        if "dynamic vocabulary" in e.claim:
            r = reach[reach.used & (reach.data_fraction == max(params.data_fractions))].iloc[0]
            before, after = r.test_oov_global_vocab, r.test_oov_user_vocab
            line = f"the swap adds a median {r.added_words_median:g} words per user, bringing {before - after:.1%} of "
            line += f"test words into the vocabulary (out of it: {before:.1%} -> {after:.1%}): few words to gain on"
            out[e.claim] = claims.Diagnosis(line, "The dynamic vocabulary of one user", claims.Kind.DATA)
    return out


def known_diagnoses(params: Params, users: pd.DataFrame, more: dict | None, also: dict) -> dict[str, claims.Diagnosis]:
    """Personalization against the global model, once the planted control in `more` passed: the data
    as the cause (`planted.known_answer`, on the curve of the effect's data size), then `also`'s line."""
    if not planted.passed(more):
        return {}
    out, by_size = {}, more["planted_curve_by_size"]
    for e in PAPER.effects:
        fraction = next((f for f in params.data_fractions if QUANTITIES[e.better] == f"P-M {f:.0%}"), None)
        if QUANTITIES[e.worse] != GLOBAL or fraction is None or not np.isclose(by_size.data_fraction, fraction).any():
            continue
        curve = by_size[np.isclose(by_size.data_fraction, fraction)]
        words = float(users[users.condition == QUANTITIES[e.better]].drop_duplicates("user").train_words.median())
        known = planted.known_answer(curve, params.planted_dose_star, words, PLANTED_SECTION)
        out[e.claim] = (
            dataclasses.replace(known, text=f"{known.text}; {also[e.claim].text}") if e.claim in also else known
        )
    return out


def conclude(params: Params, corpora: dict, models: dict, reach, rows: dict, wall_time_s: float, more=None):
    """Tables, headline numbers with tolerances (main start), the paper's numbers beside ours, the
    effects' intervals and three-way verdicts, every start's gains, and `more` (the planted control's)."""
    main_rows, main_models = starts.main(rows), starts.main(models)
    users, every = report.rows_table(main_rows), {t: report.rows_table(r) for t, r in rows.items()}
    summary = summary_table(users, main_rows)
    medians = summary.pivot(index="seed", columns="condition", values="top_k_eff_median")
    per_seed = {q: np.array(medians[c].tolist()) for q, c in QUANTITIES.items()}
    per_seed |= {f"relative change: {e.claim}": per_seed[e.better] / per_seed[e.worse] - 1 for e in PAPER.effects}
    c = Conclusion(NAME, params, PAPER)
    c.headlines(per_seed)
    measured = {e.claim: (_wide(users, QUANTITIES[e.better]), _wide(users, QUANTITIES[e.worse])) for e in PAPER.effects}
    also = also_diagnoses(params, users)
    why = reach_diagnoses(params, reach) | also | known_diagnoses(params, users, more, also)
    c.effects(measured, streams.rng(params.seed, "bootstrap"), n_boot=params.bootstrap, diagnoses=why)
    c.paper_vs_ours()
    pairs = [("top_k_eff", QUANTITIES[e.better], QUANTITIES[e.worse]) for e in PAPER.effects]
    tables = {"users": users, "summary": summary, "vocabulary_reach": reach, "contrasts": contrasts(params, users)}
    tables |= {"starts": starts.sizes(corpora), "start_gains": starts.compare(params, every, pairs)}
    tables |= {"users_every_start": pd.concat([u.assign(global_text=t) for t, u in every.items()], ignore_index=True)}
    tables |= {"training": pd.concat([m.history().assign(global_text=t) for t, m in models.items()])}
    tables |= {"global_model_cache": pd.concat([m.cache().assign(global_text=t) for t, m in models.items()])}
    test_words = int(users[users.condition == GLOBAL].groupby("seed").test_words.sum().iloc[0])
    tables |= more or {}
    return report.record(c, starts.main(corpora), tables, wall_time_s, main_models, test_words=test_words)


def run(params: Params, speeches=None, log=print):
    """All stages in order, as the notebook runs them."""
    start = time.perf_counter()
    corpora = starts.load(params, speeches, log)
    models = starts.train(params, corpora, log)
    reach = personal_sizes.vocabulary_reach(params, starts.main(corpora))
    rows = starts.each(params, corpora, models, personalize, log)
    users = report.rows_table(starts.main(rows))
    more = personal_sizes.planted_control(params, starts.main(corpora), starts.main(models), users, log)
    return conclude(params, corpora, models, reach, rows, time.perf_counter() - start, more)
