"""top3eff's planted-signal control (`planted`) in the condition of the rows it vouches for (issue 74):
P-M, personalized with the user's dynamic vocabulary (`own_vocab`), stopped on the user's held-out
lines, at the chosen step-size reading, from the global model of those rows: the crowd's (the crowd
rows and D5's groups) and the far corpus's (the far row). Until 2026-12-07 the control ran without the
dynamic vocabulary on the crowd model alone. Dose 0 is the main rows themselves, not run again; every
other (model, dose, seed, user) is an `engine` job (`personal_jobs`). A flagged row's diagnosis (`diagnose`)
names the data as its cause only once its own model's control has passed."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pandas as pd

from ondevice.data.per_user_text import Corpus
from ondevice.papers.deeptype import own_vocab, personal_jobs, planted, sensitivity
from ondevice.papers.deeptype.common import GlobalModels
from ondevice.report import claims
from ondevice.report.conclusion import diagnose as with_diagnosis
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
        named = planted.tables(p, per_user.assign(model=name, condition=after))  # the condition it ran in
        tables |= {key.replace("planted", prefix, 1): table for key, table in named.items()}
    return tables


# The personalized condition behind each of top3eff's personalization effects, by a phrase of its claim:
# the paper's configuration, with the dynamic vocabulary (`own_vocab`).
PERSONALIZED = {
    "(same-corpus crowd global model)": ROWS["crowd"][1],
    "light users": ROWS["crowd"][1],
    "heavy users": ROWS["crowd"][1],
    "more global training": ROWS["crowd"][1],
    "(far-corpus global model)": ROWS["far"][1],
}
KEPT_SECTION = "Table 1: every global model, with and without personalization"


def diagnose(effects: pd.DataFrame, users: pd.DataFrame, more: dict | None, dose_star: float = 0.5) -> pd.DataFrame:
    """Fill the diagnosis of each personalization effect the audit rule flags (interval excludes the
    paper's change, >3x off or of the other sign) with this run's measurements: in how many user runs
    no personal epoch lowered the loss on the user's own held-out lines (the global model scored), and
    the median change of those that trained against their global model. When the planted-signal
    control of the row's global model in `more` passed (`planted.passed`, judged at `dose_star`), the
    protocol is shown to learn a personal signal, so the cause is named as the data's
    (`planted.known_answer`); else the row stays open. The switched-back protocols' changes are
    deeptype_top3eff_sensitivity's, read beside the rows at publish (paper.toml)."""
    more = more or {}
    passed = {
        name: planted.passed({"planted_verdict": more.get(f"{prefix}_verdict")}) for name, (*_, prefix) in ROWS.items()
    }
    for _, row in effects.iterrows():
        condition = next((c for phrase, c in PERSONALIZED.items() if phrase in row.effect), None)
        flagged = claims.audit(row["paper change"], row["our change"], row["ci low"], row["ci high"]) == "unexplained"
        if condition is None or not flagged:
            continue
        personal = users[users.condition == condition]
        group = next((g for g in ("light", "heavy") if f"{g} users" in row.effect), None)
        if group and "group" in personal:  # D5's rows: that group's users (`group` set by the experiment)
            personal = personal[personal.group == group]
        kept, trained = personal.kept_epoch, personal[personal.kept_epoch > 0]
        line = f"in {int((kept == 0).sum())} of {len(kept)} user runs no personal epoch lowered the held-out loss"
        if len(trained):
            start = users[users.condition == condition.split(" + personal")[0]].set_index(["seed", "user"])
            change = trained.top_k_eff.to_numpy() / start.top_k_eff[list(zip(trained.seed, trained.user))].to_numpy()
            line += f"; the {len(trained)} that trained changed top-k-eff by {np.median(change) - 1:+.1%} (median)"
        why = claims.Diagnosis(line, KEPT_SECTION, claims.Kind.OPEN)
        name = "crowd" if condition == ROWS["crowd"][1] else "far"
        if passed[name]:
            why = _known(more[f"{ROWS[name][2]}_curve"], dose_star, personal, name, line)
        effects = with_diagnosis(effects, row.effect, why)
    return effects


def _known(curve: pd.DataFrame, dose_star: float, personal: pd.DataFrame, name: str, line: str):
    """A flagged effect's diagnosis after a passing planted control on its rows' own global model: the
    crowd's rows by the control itself; the far model's by the personal words it adapts with (the
    paper's users: 100K entries), with its control saying the protocol learns what the lines carry.
    Whether those words are the cause, the judge's curve shows at publish (`report.curves`)."""
    words = float(personal.drop_duplicates("user").train_words.median())
    if name == "crowd":
        known = planted.known_answer(curve, dose_star, words, planted.SECTION)
        return claims.Diagnosis(f"{known.text}; {line}", known.section, known.kind)
    star = curve[np.isclose(curve.dose, dose_star)].iloc[0]
    text = f"the far-corpus model adapts to a user's language from a median {words:,.0f} personal training words "
    text += f"(the paper's users: {planted.PAPER_ENTRIES_PER_USER}, Sec. 6.1), and the planted-signal control on the "
    text += f"far model passes ({star.gain:+.3f} [{star['ci low']:+.3f}, {star['ci high']:+.3f}] top-k-eff at dose "
    text += f"{dose_star:g}), so the protocol learns what the lines carry; {line}"
    return claims.Diagnosis(text, planted.SECTION, claims.Kind.DATA)
