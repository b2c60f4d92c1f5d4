"""top3eff's planted-signal control (`planted`) in the condition of the rows it vouches for (issue 74):
P-M, personalized with the user's dynamic vocabulary (`own_vocab`), stopped on the user's held-out
lines, at the chosen step-size reading, from the global model of those rows: the crowd's (the crowd
rows and D5's groups) and the far corpus's (the far row). Until 2026-12-07 the control ran without the
dynamic vocabulary on the crowd model alone. Dose 0 is the main rows themselves, not run again; every
other (model, dose, seed, user) is an `engine` job (`personal_jobs`)."""

from __future__ import annotations

import dataclasses
import functools

import pandas as pd

from ondevice.data.per_user_text import Corpus
from ondevice.papers.deeptype import own_vocab, personal_jobs, planted, sensitivity
from ondevice.papers.deeptype.common import GlobalModels
from ondevice.tasks import typing_protocol

# global model -> (the rows' global condition, their personalized one) and the prefix of its tables
ROWS = {
    "crowd": ("crowd global", "crowd global + personal, dynamic vocabulary", "planted"),
    "far": ("far global", "far global + personal, dynamic vocabulary", "planted_far"),
}


def _measure(params, name: str, models: GlobalModels, config, reading: str, log):
    """(plant, dose) -> the rows of every seed and test user on the corpus planted at that dose: the
    global model scored in the global vocabulary (as the rows' G-M), P-M as the rows' (`personal_jobs`)."""

    def data(plant: Corpus, user: str) -> dict:
        parts = own_vocab.parts({name: plant}, user, params)
        return {"parts": parts[name + own_vocab.DYNAMIC], "scored": parts[name][2]}

    def measure(plant: Corpus, dose: float) -> list[dict]:
        got, key = functools.partial(data, plant), f"planted-{name}-{dose:g}"
        rows = personal_jobs.run(params, models, config, reading, plant.split.test, got, key, log)
        log(f"planted dose {dose:g}, {name} model: {len(rows)} personal models")
        return rows

    return measure


def control(params, corpora: dict, models: dict, reading: str, users: pd.DataFrame, log=print) -> dict:
    """Per global model of `ROWS`: the per-user rows of every dose (dose 0: the main rows), the gain
    per dose and the verdict, as `planted.tables` names them (the far model's prefixed `planted_far`);
    the far model runs `planted_far_doses`."""
    tables = {}
    for name, (before, after, prefix) in ROWS.items():
        p = params if name == "crowd" else dataclasses.replace(params, planted_doses=params.planted_far_doses)
        config = typing_protocol.model_config(p, corpora[name])
        measure = _measure(p, name, models[name], config, reading, log)
        main = sensitivity.from_rows(users, before, after, "main").drop(columns="protocol")
        per_user = planted.doses(p, corpora[name], measure, main)
        named = planted.tables(p, per_user.assign(model=name))
        tables |= {key.replace("planted", prefix, 1): table for key, table in named.items()}
    return tables
