"""The global models online training and personal data size start from (issue 40). The paper's
online emulation and its Fig. 7 (left) start from a global model trained on *public* Twitter text
(Sec. 6.1.2); ours from LEAF Sent140's tweets, the mirror's public Twitter corpus (`global_texts`'
first entry, the *main* start, whose rows are judged against the paper), with the crowd model (other
roles of the same plays: Fig. 7 right) run beside it. Each start has its own corpus (the same users
and split, its own vocabulary, built as the Bible's is: `per_user_text.load_corpus`) and its own
global model, trained once per machine (`common.train_global`'s model cache)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ondevice import streams
from ondevice.data.per_user_text import GLOBAL_TEXTS, Corpus, load_corpus
from ondevice.papers.deeptype import planted
from ondevice.papers.deeptype.common import GlobalModels, train_global
from ondevice.report.conclusion import effect_row, wide


@dataclass(frozen=True)
class Params(planted.Fields):
    """The starts and the planted-signal control of an experiment personalizing from them."""

    # The paper's public Twitter model: Sent140 (mirror: LEAF's small test split, 8,692 tweets; at
    # `default` 90,744 words of global text + 20,006 held out, vocabulary 5,000), then the crowd's.
    global_texts: tuple[str, ...] = ("sent140", "crowd")
    # the validation users' choice, run from the main start beside the paper's configuration as a diagnosis
    # (`protocol.validation_choice`, which says where it comes from); "" = not run. The effects stay the paper's.
    also_optimizer: str = "adam"
    also_learning_rate: float = 3e-4

    def check(self) -> None:
        super().check()
        texts = self.global_texts
        ok = bool(texts) and len(set(texts)) == len(texts) and set(texts) <= set(GLOBAL_TEXTS)
        self.require(ok, "global_texts", f"must name global texts of {GLOBAL_TEXTS}, each once, the main start first")
        self.require(self.also_optimizer in ("", "sgd", "adam"), "also_optimizer", "must be '', 'sgd' or 'adam'")
        self.require(self.also_learning_rate > 0, "also_learning_rate", "must be positive")


def main(by_start: dict):
    """The main start's entry (the first of `global_texts`)."""
    return next(iter(by_start.values()))


def load(params: Params, speeches=None, log=print) -> dict[str, Corpus]:
    """One corpus per start: the same users and split, each global text with its own vocabulary."""
    return {text: load_corpus(params, speeches, log, global_text=text) for text in params.global_texts}


def train(params: Params, corpora: dict[str, Corpus], log=print) -> dict[str, GlobalModels]:
    """Each start's global models, from the model cache when any DeepType notebook trained them."""
    return {text: train_global(params, corpus, log) for text, corpus in corpora.items()}


def each(params: Params, corpora: dict[str, Corpus], models: dict[str, GlobalModels], stage, log=print) -> dict:
    """`stage(params, corpus, models, log)` from every start; the validation users' choice from the
    main start only (it diagnoses the rows judged against the paper)."""
    out = {}
    for n, text in enumerate(corpora):
        log(f"start: the {text} global model")
        p = params if n == 0 else dataclasses.replace(params, also_optimizer="")
        out[text] = stage(p, corpora[text], models[text], log)
    return out


def sizes(corpora: dict[str, Corpus]) -> pd.DataFrame:
    """Per start: the global text's words (training and held out), its vocabulary, and the share of
    the test users' words out of that vocabulary (never suggested)."""
    rows = []
    for n, (text, c) in enumerate(corpora.items()):
        test = [w for u in c.split.test for s in c.users[u] for w in s]
        held = len(c.holdout_samples) if c.holdout_samples is not None else 0
        words = {"global_words": sum(map(len, c.crowd)), "held_out_words": held, "vocabulary": c.vocab.size}
        rows.append({"global_text": text, "main": n == 0, **words, "test_users_oov_rate": c.oov(test)})
    return pd.DataFrame(rows)


def compare(params: Params, users: dict[str, pd.DataFrame], pairs: list[tuple[str, str, str]]) -> pd.DataFrame:
    """Per start and (value, better, worse) of `pairs`: both conditions' medians over users (mean over
    seeds) and better's relative change over worse with its paired bootstrap interval over users."""
    rows = []
    for text, table in users.items():
        for value, better, worse in pairs:
            b, w = wide(table, value, condition=better), wide(table, value, condition=worse)
            rng = streams.rng(params.seed, f"bootstrap/start/{text}/{value}/{better}")
            first = {"global_text": text, "value": value, "better": better, "worse": worse}
            first |= {f"{k} median": float(np.median(m, axis=1).mean()) for k, m in (("better", b), ("worse", w))}
            rows.append(effect_row(first, b, w, rng, params.bootstrap))
    return pd.DataFrame(rows).drop(columns=["level"], errors="ignore")
