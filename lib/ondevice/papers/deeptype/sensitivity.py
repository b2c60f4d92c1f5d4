"""Which protocol choice drives the sign of DeepType's personalization effect: the effect (crowd
global model -> personalized, on the test users, paired over users) under this protocol, under the
other step-size reading, with the validation users' choice of personal configuration, and with each
choice switched back to the suite's earlier one, one at a time. A switched-back crowd needs its own
global model (from the model cache when an earlier run trained it; else trained now, and the run
says how long it took). Every run is `personal_jobs`' (engine jobs per seed and user)."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pandas as pd

from ondevice.data import per_user_text
from ondevice.engine.stage import resumable
from ondevice.papers.deeptype import common, personal_jobs, protocol, step_size
from ondevice.report.conclusion import effect_row, wide
from ondevice.tasks import typing_protocol

CLAIM = "personalization raises top-k-eff (crowd global model)"
MAIN = "this protocol"
# the main protocol's neighbours, beside the switches: the step-size reading the validation users did
# not prefer (`step_size`) and their choice of personal optimizer, rate and epochs (`protocol.select`)
OTHER_READING, VALIDATION_CHOICE = "other step-size reading", "validation choice"
# id -> (what is switched back to the suite's earlier protocol, the fields that do it) (issue 22)
SWITCHES = {
    "leaky_crowd": ("crowd includes the test and validation users' plays", dict(crowd_excludes_groups=False)),
    "fixed_epochs": ("fixed personal epochs, no per-user hold-out", dict(personal_holdout_fraction=0.0)),
    "adam_global": (
        "global model by Adam 0.002 on the per-position mean loss (no clipping, no decay)",
        dict(
            optimizer="adam",
            global_learning_rate=0.002,
            global_clip_norm=0.0,
            global_lr_decay=1.0,
            global_loss_per="position",
            global_epochs=8,
            global_patience=1,
        ),
    ),
    "mean_loss_personal": (
        "personal SGD 1.0 on the per-position mean loss, no clipping",
        dict(personal_loss_per="position", personal_clip_norm=0.0),
    ),
}
CORPUS_FIELDS = {"crowd_excludes_groups"}  # switches that change the crowd, hence the global model


def effect_rows(params, name: str, key: str, corpus, models: common.GlobalModels, reading, log=print) -> list:
    """Per seed and test user: top-k-eff of the global model and of its personalized model under
    `params` at the step-size `reading` (None: the constant `personal_learning_rate`), as the protocol `name`."""
    config = typing_protocol.model_config(params, corpus)
    data = lambda user: {"parts": corpus.personal_parts(user, params)}  # noqa: E731
    rows = personal_jobs.run(params, models, config, reading, corpus.split.test, data, f"sensitivity-{key}", log)
    log(f"sensitivity, {name}: {len(rows)} user runs personalized")
    return [dict(protocol=name, **r) for r in rows]


@resumable("sensitivity_main")
def main_rows(params, corpus, models: common.GlobalModels, reading: str, tuned: dict | None, log=print) -> list:
    """This protocol (the chosen step-size `reading`), the other reading, and the validation users'
    choice `tuned` (at its constant rate; left out when it is the paper's configuration)."""
    runs = [(MAIN, "main", params, reading), (OTHER_READING, "other_reading", params, step_size.other(reading))]
    if tuned and tuned != protocol.config(params):
        runs += [(VALIDATION_CHOICE, "validation_choice", protocol.with_config(params, tuned), None)]
    return [r for name, key, p, how in runs for r in effect_rows(p, name, key, corpus, models, how, log)]


@resumable("sensitivity_switched")
def switched(params, base: per_user_text.Corpus, reading=None, log=print) -> tuple[list[dict], pd.DataFrame]:
    """Every switch's rows, and what each switch cost: global model from the cache or trained (seconds);
    personal training at the main step-size `reading`, from each switched global model's kept epoch."""
    rows, costs = [], []
    for switch in params.sensitivity:
        name, change = SWITCHES[switch]
        p, started = dataclasses.replace(params, **change), time.perf_counter()
        corpus = per_user_text.load_corpus(p, log=log) if CORPUS_FIELDS & set(change) else base
        models = common.train_global(p, corpus, log)
        rows += effect_rows(p, name, switch, corpus, models, reading, log)
        trained = [not e.hit for e in models.unique().values()]
        costs.append({"switched back": name, "from_cache": not any(trained), **_words(corpus)})
        costs[-1]["seconds"] = time.perf_counter() - started
    return rows, pd.DataFrame(costs)


def _words(corpus: per_user_text.Corpus) -> dict:
    return {"crowd_words": sum(map(len, corpus.crowd)), "crowd_users": len(corpus.split.crowd)}


def from_rows(users: pd.DataFrame, before: str, after: str, name: str) -> pd.DataFrame:
    """Per seed and user, the main rows' `before` and `after` top-k-eff as one protocol's rows."""
    d = users[users.condition.isin([before, after])]
    kept = d[d.condition == after].set_index(["seed", "user"]).kept_epoch
    d = d.pivot_table(index=["seed", "user"], columns="condition", values="top_k_eff").assign(kept_epoch=kept)
    return d.reset_index().rename(columns={before: "top_k_eff_global", after: "top_k_eff"}).assign(protocol=name)


def table(rows: list[dict], params, rng) -> pd.DataFrame:
    """The effect of personalization per protocol (in the order of `rows`), with its paired interval over users."""
    out = []
    for name, d in pd.DataFrame(rows).groupby("protocol", sort=False):
        first = {"protocol": name, "claim": CLAIM}
        row = effect_row(first, wide(d, "top_k_eff"), wide(d, "top_k_eff_global"), rng, params.bootstrap)
        out.append({**row, "median_kept_epoch": float(np.median(d["kept_epoch"]))})
    return pd.DataFrame(out)


def conclusion(effects: pd.DataFrame) -> str:
    """The table in words, generated from it: this protocol's effect and where its users stopped,
    then which other protocols change the verdict (what drives the sign) and which leave it."""
    here, others = effects.iloc[0], effects.iloc[1:]
    says = {"holds": "raises top-k-eff", "does not hold": "lowers top-k-eff", "within noise": "is within noise"}
    change = lambda r: f"{r['our change']:+.1%} [{r['ci low']:+.1%}, {r['ci high']:+.1%}]"
    line = lambda r: f"{r.protocol}: {change(r)}, {r.verdict}"
    text = f"**Under this protocol personalization {says[here.verdict]}** ({change(here)})"
    if here.median_kept_epoch == 0:
        text += "; for the median user no personal epoch lowers the held-out loss, so the global model is scored"
    moved, same = others[others.verdict != here.verdict], others[others.verdict == here.verdict]
    if len(moved):
        text += ". **Changes the verdict:** " + "; ".join(map(line, (r for _, r in moved.iterrows())))
    if len(same):
        text += ". Leave the verdict as it is: " + "; ".join(map(line, (r for _, r in same.iterrows())))
    return text + "."
