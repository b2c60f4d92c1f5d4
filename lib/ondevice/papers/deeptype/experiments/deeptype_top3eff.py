"""DeepType D3 (Table 1) and D5 (Fig. 8): global models from the clean crowd of the same corpus (the
paper's "private corpora"), the King James Bible (its BBC row) or none, with and without on-device
personalization (`protocol`; `step_size`; with the user's dynamic vocabulary, `own_vocab`, and without), the
control (`more_training`), the gain per group of users (`user_groups`) and the planted-signal control in the
rows' condition (`planted_condition`). Stages: `load_corpora`, `train_globals`,
`reading_choice.select`, `personalize`, `control`, `planted_condition.control`, `own_vocab.oov_table`, `on_device`,
`conclude`. The protocol's sensitivity (the switched-back choices, the other step-size reading, the validation
users' choice) is deeptype_top3eff_sensitivity's, split off on 2026-12-07 so that each runs cold in a sitting."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ondevice import engine, streams
from ondevice.data.per_user_text import Corpus, load_corpus
from ondevice.device import parity
from ondevice.engine.stage import resumable
from ondevice.metrics import top_k_eff
from ondevice.models import lstm_lm
from ondevice.papers.deeptype import (
    common,
    more_training,
    own_vocab,
    planted,
    planted_condition,
    protocol,
    reading_choice,
    report,
    step_size,
)
from ondevice.papers.deeptype import smoke_presets as smoke
from ondevice.papers.deeptype import user_groups as d5
from ondevice.papers.deeptype.common import GlobalModels, train_global
from ondevice.papers.deeptype.techniques import dynamic_vocab
from ondevice.params import presets
from ondevice.report import facts
from ondevice.report.conclusion import Conclusion
from ondevice.tasks import typing_protocol

NAME = "deeptype_top3eff"
G_CROWD, P_CROWD, CONTROL = "crowd global", "crowd global + personal", "crowd global + more crowd training"
G_FAR, P_FAR, P_ONLY = "far global", "far global + personal", "no global + personal"
P_CROWD_DV, P_FAR_DV = map(own_vocab.condition, (P_CROWD, P_FAR))  # the paper's personalized rows (Sec. 4)
CONDITIONS = (G_CROWD, P_CROWD_DV, P_CROWD, CONTROL, G_FAR, P_FAR_DV, P_FAR, P_ONLY)
GLOBALS = ((G_CROWD, "crowd"), (G_FAR, "far"))  # each global model's condition and corpus
PAPER = facts.paper(NAME)  # our crowd is the paper's "private corpora" row; the Bible its far BBC row
PAPER_GROUPS = facts.paper(NAME, "groups")  # D5 (Fig. 8): users grouped by their amount of text
TABLE1 = facts.load("deeptype")[NAME]["table1"]  # condition -> (global model from, personalization)
ROW = "seed user play role condition train_words test_words test_oov_rate top_k_eff perplexity".split()
TRAINING = {"steps": 0, "steps_run": 0, "kept_epoch": math.nan, "personal_train_seconds": 0.0}
TRAINING |= {"seen_row_shift": math.nan, "unseen_row_shift": math.nan}
OWN_PRESETS = {
    "smoke": smoke.DEEPTYPE_TOP3EFF,
    "default": dict(seeds=1),
    "paper": dict(seeds=3),
}


@dataclass(frozen=True)
class Params(planted.Fields):
    far_words_as_crowd: bool = True  # Bible cut to the crowd's words (Sec. 6.1.1: ~10M samples each "for fairness")
    tflite_check_steps: int = 5  # personal steps run both in TF and in the exported TFLite model
    step_size_tie: float = 0.001  # `reading_choice.RULE`: readings closer than this on validation users tie
    planted_far_doses: tuple[float, ...] = (0.0, 0.5, 1.0)  # the planted control's doses on the far model
    # test users personalized at once in one batched step (`training.many_users`; the same rows to float32 rounding).
    # 1: with 20 together (users of 3.3K-8.2K words, each stopping on its own) a default run was still personalizing
    # after 50 min, against 31.6 one at a time: a batched step costs its longest user's steps for every user
    users_together: int = 1
    dynamic_vocab_min_count: int = dynamic_vocab.MIN_COUNT  # D4's threshold: times a user typed a word it adds

    PRESETS = presets(typing_protocol.PRESETS, planted.PRESETS, OWN_PRESETS)

    def check(self) -> None:
        super().check()
        self.at_least(0, "tflite_check_steps", "step_size_tie")
        self.at_least(1, "personal_epochs", "users_together", "dynamic_vocab_min_count")
        far = self.planted_dose_star in self.planted_far_doses and all(0 <= d <= 1 for d in self.planted_far_doses)
        self.require(far, "planted_far_doses", "must be shares in [0, 1] and include planted_dose_star")
        self.at_least(1, "validation_users")  # the step-size reading is chosen on them


def load_corpora(params: Params, speeches=None, log=print) -> dict[str, Corpus]:
    """The users with the crowd as global text, and with the Bible of as many words (`far_words_as_crowd`)."""
    crowd = load_corpus(params, speeches, log)
    cap = sum(map(len, crowd.crowd)) if params.far_words_as_crowd else params.crowd_max_words
    return {"crowd": crowd, "far": load_corpus(params, speeches, log, global_text="bible", max_words=cap)}


def train_globals(params: Params, corpora: dict[str, Corpus], log=print) -> dict[str, GlobalModels]:
    return {name: train_global(params, corpus, log) for name, corpus in corpora.items()}


def _row(seed, user, condition, data, score: dict, **extra) -> dict:
    """One (seed, user, condition): the user's words (training incl. its hold-out), scores, training."""
    (fit, held, test), (play, _, role) = data, user.partition("/")
    words = len(fit) + (len(held) if held is not None else 0)
    values = (seed, user, play, role, condition, words, len(test), float(np.mean(test.target == 1)))
    row = dict(zip(ROW, values + (score["top_k_eff"], score["perplexity"])))
    trained = {k: v for k, v in {**score, **extra}.items() if k in TRAINING or k == "_curve"}  # steps, shifts
    return {**row, **TRAINING, **trained, "_chars": (test.word_len, score["_chars"])}


@functools.cache  # per process: one model and its trainers per (params, architecture)
def _personal_for(params: Params, config: lstm_lm.LSTMConfig) -> protocol.Personal:
    return protocol.Personal(params, lstm_lm.build(config))


def users_job(shared: dict, seed: int, users: list[str], data: list[dict]) -> list[dict]:
    """A seed's `users_together` test users: each global model as it is and personalised (the chosen step-size
    reading; with and without the user's vocabulary), and a model of the user's data alone."""
    p, w, main = shared["params"], shared["weights"], shared["reading"]
    personal = lambda name: _personal_for(p, shared["configs"][name])
    score = lambda u, d, g, n: _row(seed, u, g, d[n], personal(n).score_weights(w[n][seed], d[n][2]))  # noqa: E731
    rows = {u: [score(u, d, g, n) for g, n in GLOBALS] for u, d in zip(users, data)}
    runs = [(P_CROWD, "crowd", p, main), (P_FAR, "far", p, main), (P_ONLY, "crowd", p, None)]
    runs += [(own_vocab.condition(c), n + own_vocab.DYNAMIC, q, r) for c, n, q, r in runs[:2]]
    for condition, key, q, reading in runs:
        name = key.removesuffix(own_vocab.DYNAMIC)  # the global model; `key` its data
        scratch = condition == P_ONLY
        start, stream = (shared["scratch"][seed], "personal-only") if scratch else (w[name][seed], "personal")
        rates = step_size.schedule(p, reading, shared["kept"][name][seed]) if reading else None
        rngs = [streams.rng(seed, f"{stream}/{u}") for u in users]
        for u, d, g in zip(users, data, personal(name).train_users([d[key] for d in data], start, q, rngs, rates)):
            rows[u].append(_row(seed, u, condition, d[key], g))
    return [r for u in users for r in rows[u]]


def personalize(params: Params, corpora: dict, models: dict, reading: str, log=print) -> list:
    """Every (seed, group of test users) as a resumable job on `ondevice.engine`; `reading`: the chosen one."""
    p, config = params, typing_protocol.model_config(params, corpora["crowd"])
    init = lambda s: lstm_lm.build(config, seed=streams.tf_seed(s, "init/personal-only")).get_weights()
    shared = {
        "params": p,
        "configs": {k: typing_protocol.model_config(p, c) for k, c in corpora.items()},
        "weights": {k: m.weights for k, m in models.items()},
        "scratch": {s: init(s) for s in p.seed_list},
        "reading": reading,
        "kept": {k: {s: step_size.kept_epoch(m, s) for s in p.seed_list} for k, m in models.items()},
    }
    data = lambda user: own_vocab.parts(corpora, user, p)
    jobs = protocol.group_jobs(p.seed_list, corpora["crowd"].split.test, p.users_together, users_job, data)
    results = engine.run_jobs(jobs, shared, run_dir=engine.jobs_dir(f"{NAME}-personalize"), log=log)
    rows = [r for got in results for r in got]
    protocol.log_users(rows, log)
    return rows


@resumable("control")
def control(params: Params, corpora: dict, models: dict, reading: str, log=print) -> list[dict]:
    """The paper's control (`more_training`): the crowd model trained on for five personal epochs of the median user."""
    rates = step_size.schedules(params, models["crowd"], reading)
    return more_training.run(params, corpora["crowd"], models["crowd"], rates, _row, CONTROL, log)


def on_device(params: Params, corpora: dict, models: dict, log=print):
    """The first test user's first personal steps from the crowd model in TensorFlow and in TFLite (`parity`)."""
    if not params.tflite_check_steps:
        return None, None
    corpus, task, p, crowd = corpora["crowd"], common.task(params), params, models["crowd"]
    train, _ = corpus.personal(corpus.split.test[0], p.personal_train_fraction)
    batches = task.batches(train, p.personal_batch_size, streams.rng(p.seed, "diagnostics/tflite"))
    steps = list(itertools.islice(batches, p.tflite_check_steps))
    crowd.model.set_weights(crowd.weights[p.seed])
    rate, opt, clip = p.personal_learning_rate, p.personal_optimizer, p.personal_clip_norm
    return parity.parity_table(crowd.model, task, rate, steps, opt, log=log, clip_norm=clip)


def summary_table(rows: list[dict]) -> pd.DataFrame:
    """Per seed and condition: median top-k-eff over test users, pooled top-k-eff, data used."""
    users, med = report.rows_table(rows), lambda c: (c, "median")
    how = {"users": ("user", "size"), "top_k_eff_median": med("top_k_eff"), "perplexity_median": med("perplexity")}
    how |= {c: (c, "sum") for c in ("test_words", "train_words")}
    how["unseen_row_shift_median"] = med("unseen_row_shift")
    summary = users.groupby(["seed", "condition"], as_index=False).agg(**how)
    chars = report.pooled(rows)
    summary.insert(4, "top_k_eff_pooled", [top_k_eff(*chars[k][:2]) for k in zip(summary.seed, summary.condition)])
    return summary


def conclude(params, corpora, models, rows, on_device_table, flatbuffer, wall_time_s, more=None):
    """Tables (one row per user and condition), medians per condition, the paper's numbers beside
    ours, and each claimed effect's paired interval and three-way verdict; D5's groups likewise."""
    users, summary = report.rows_table(rows), summary_table(rows)
    medians = summary.pivot(index="seed", columns="condition", values="top_k_eff_median")
    groups = d5.user_groups(users)
    users["group"] = users.user.map(groups)
    group_rows, group_values = d5.group_table(users, G_CROWD, P_CROWD_DV)
    members = {e.claim: groups.index[groups == e.claim.split()[-2]] for e in PAPER_GROUPS.effects}
    judged = tuple(e for e in PAPER_GROUPS.effects if len(members[e.claim]) >= 2)
    # Table 1's and D5's facts as one paper; D5's effects judged only in groups of two users or more
    both = dataclasses.replace(PAPER, numbers=PAPER.numbers + PAPER_GROUPS.numbers, effects=PAPER.effects + judged)
    c = Conclusion(NAME, params, both)
    c.headlines({f"top-k-eff, {q}": medians[q].tolist() for q in CONDITIONS if q in medians})
    pair = lambda e: tuple(d5.matrix(users, q.removeprefix("top-k-eff, ")) for q in (e.better, e.worse))
    # D5's effects compare the personalized and the global crowd model within a group
    group_pair = lambda e: tuple(d5.matrix(users, q, members[e.claim]) for q in (P_CROWD_DV, G_CROWD))
    measured = {e.claim: pair(e) for e in PAPER.effects} | {e.claim: group_pair(e) for e in judged}
    effects = c.effects(measured, streams.rng(params.seed, "bootstrap"), n_boot=params.bootstrap)
    c.effect_rows(planted_condition.diagnose(effects, users, more, params.planted_dose_star))
    c.paper_vs_ours(extra=group_values)
    text = lambda k: dict(global_text=corpora[k].global_text)
    tables = {
        "data": pd.concat([x.table().assign(vocabulary=x.global_text) for x in corpora.values()], ignore_index=True),
        "users": users,
        "summary": summary,
        "groups": group_rows,
        "training": pd.concat([m.history().assign(**text(k)) for k, m in models.items()]),
        "global_model_cache": pd.concat([m.cache().assign(**text(k)) for k, m in models.items()], ignore_index=True),
        "personal_curves": report.personal_curves(rows),
        "kept_epochs": report.kept_epochs(users),
        "crowd_overlap": pd.concat([x.overlap(params.personal_train_fraction) for x in corpora.values()]),
    }
    tables |= ({"on_device": on_device_table} if on_device_table is not None else {}) | (more or {})
    notes = dict(paper_config=protocol.config(params))
    notes |= dict(model_parameters=common.model_card(models["crowd"].model)["parameters"])
    notes |= dict(global_models_from_cache={k: m.from_cache for k, m in models.items()})
    data = [m.summary() for m in corpora["far"].manifests]
    result = report.record(c, corpora["crowd"], tables, wall_time_s, data=data, **notes)
    result.models = {"deeptype_lstm_trainable.tflite": flatbuffer} if flatbuffer else {}
    return result


def run(params: Params, speeches=None, log=print):
    """All stages in order, as the notebook runs them."""
    start = time.perf_counter()
    corpora = load_corpora(params, speeches, log)
    models = train_globals(params, corpora, log)
    reading, steps = reading_choice.select(params, corpora["crowd"], models["crowd"], log)
    rows = personalize(params, corpora, models, reading, log)
    rows += control(params, corpora, models, reading, log)
    more = {"step_size": steps} | planted_condition.control(
        params, corpora, models, reading, report.rows_table(rows), log
    )
    more |= {"dynamic_vocabulary": own_vocab.oov_table(params, corpora)}
    table, flatbuffer = on_device(params, corpora, models, log)
    return conclude(params, corpora, models, rows, table, flatbuffer, time.perf_counter() - start, more)


def paper_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Table 1's layout: global corpus x personalization, median top-k-eff (mean over seeds)."""
    med, paper = summary.groupby("condition").top_k_eff_median.mean(), {n.quantity: n.value for n in PAPER.numbers}
    rows = [(*TABLE1[c], med.get(c, math.nan), paper.get(f"top-k-eff, {c}", math.nan)) for c in CONDITIONS]
    return pd.DataFrame(rows, columns=["global model from", "personalization", "ours", "paper"])
