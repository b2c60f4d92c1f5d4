"""DeepType D3's personalization effect under our other protocols: which choice drives its sign.

The crowd model and test users are deeptype_top3eff's (the same model-cache entry, split and step-size
choice, `reading_choice`). The effect (crowd global model -> personalized, without the dynamic
vocabulary, paired over the test users) is measured under the main protocol, under the step-size
reading the validation users did not prefer, with the personal configuration best on the validation
users (a deviation, `protocol.select`), and with each protocol choice on the crowd model switched back
to the suite's earlier one (`sensitivity.SWITCHES`; the two that switch the crowd or the global regime
train a global model of their own and run in deeptype_top3eff_global_sensitivity). Split from
deeptype_top3eff on 2026-12-07 so that each notebook runs cold within a sitting; top3eff's rows read
these runs at publish (its claims' protocols in paper.toml).

Stages: `load`, `train`, `reading_choice.select`, `select_personal`, `sensitivity.main_rows`,
`sensitivity.switched`, `conclude`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pandas as pd

from ondevice import streams
from ondevice.data.per_user_text import Corpus, load_corpus
from ondevice.engine.stage import resumable
from ondevice.papers.deeptype import common, protocol, reading_choice, report, sensitivity
from ondevice.papers.deeptype import smoke_presets as smoke
from ondevice.papers.deeptype.common import GlobalModels, train_global
from ondevice.params import presets
from ondevice.report import facts
from ondevice.report.conclusion import Conclusion
from ondevice.tasks import typing_protocol
from ondevice.tasks.typing_protocol import DeepTypeParams

NAME = "deeptype_top3eff_sensitivity"
PAPER = facts.paper(NAME)  # a citation only: the claim is top3eff's, judged there


@dataclass(frozen=True)
class Params(DeepTypeParams):
    sgd_lr_grid: tuple[float, ...] = (0.03, 0.1, 0.3, 1.0, 3.0)  # candidates tried on the validation users
    adam_lr_grid: tuple[float, ...] = (3e-5, 1e-4, 3e-4, 1e-3)  # (each with 1..personal_epochs epochs)
    step_size_tie: float = 0.001  # `reading_choice.RULE`, as top3eff's
    # protocol choices switched back one at a time (`sensitivity.SWITCHES`) on the crowd model; the two that train
    # a global model of their own (leaky_crowd, adam_global) run in deeptype_top3eff_global_sensitivity
    sensitivity: tuple[str, ...] = ("fixed_epochs", "mean_loss_personal")

    PRESETS = presets(
        typing_protocol.PRESETS,
        {
            "smoke": smoke.DEEPTYPE_TOP3EFF_SENSITIVITY,
            "default": dict(seeds=1, sgd_lr_grid=(0.03, 0.1, 0.3, 1.0), adam_lr_grid=(3e-5, 1e-4, 3e-4, 1e-3)),
            "paper": dict(seeds=3),
        },
    )

    def check(self) -> None:
        super().check()
        self.at_least(0, "step_size_tie")
        self.at_least(1, "personal_epochs", "validation_users")
        for name in ("sgd_lr_grid", "adam_lr_grid"):
            self.require(all(lr > 0 for lr in getattr(self, name)), name, "must hold positive rates")
        known = set(self.sensitivity) <= set(sensitivity.SWITCHES)
        self.require(known, "sensitivity", f"must name switches of {sorted(sensitivity.SWITCHES)}")


def load(params: Params, speeches=None, log=print) -> Corpus:
    """The users with the crowd as global text (top3eff's crowd corpus)."""
    return load_corpus(params, speeches, log)


def train(params: Params, corpus: Corpus, log=print) -> GlobalModels:
    """The crowd model: top3eff's model-cache entry (trained here when the cache lacks it)."""
    return train_global(params, corpus, log)


@resumable("select_personal")
def select_personal(params: Params, corpus: Corpus, models: GlobalModels, log=print):
    """The validation users' choice: the personal configuration best on them (`protocol.select`, crowd
    model of the first seed), from SGD and fresh-state Adam candidates; None without candidates."""
    candidates = [("sgd", lr) for lr in params.sgd_lr_grid] + [("adam", lr) for lr in params.adam_lr_grid]
    if not candidates:
        return None, pd.DataFrame()
    data = {u: corpus.personal(u, params.personal_train_fraction) for u in corpus.split.validation}
    start = models.weights[params.seed]
    return protocol.select(params, protocol.Personal(params, models.model), start, data, candidates, log)


def conclude(params, corpus, models, steps, tuned, selection, rows, costs, wall_time_s):
    """The effect under every protocol with its interval (`sensitivity.table`), the medians per
    protocol as headline numbers, and the runs' tables."""
    effects = sensitivity.table(rows, params, streams.rng(params.seed, "bootstrap/sensitivity"))
    per_user = pd.DataFrame(rows)
    c = Conclusion(NAME, params, PAPER)
    medians = per_user.groupby(["protocol", "seed"], sort=False)[["top_k_eff_global", "top_k_eff"]].median()
    main = medians.loc[sensitivity.MAIN]
    c.headlines({"top-k-eff, crowd global": main.top_k_eff_global.tolist()})
    c.headlines({f"top-k-eff, personalized, {p}": medians.loc[p].top_k_eff.tolist() for p in effects.protocol})
    tables = {"sensitivity": effects, "sensitivity_cost": costs, "users": per_user, "step_size": steps}
    tables |= {"selection": selection, "training": models.history(), "kept_epochs": _kept(per_user)}
    notes = dict(paper_config=protocol.config(params), tuned_config=tuned)
    notes |= dict(model_parameters=common.model_card(models.model)["parameters"])
    return report.record(c, corpus, tables, wall_time_s, models, **notes)


def _kept(per_user: pd.DataFrame) -> pd.DataFrame:
    """Per protocol, how many user runs kept each personal epoch (0: the global model)."""
    kept = per_user.assign(kept_epoch=per_user.kept_epoch.astype(float).fillna(-1).astype(int))
    return kept.groupby(["protocol", "kept_epoch"], sort=False).size().rename("user_runs").reset_index()


def run(params: Params, speeches=None, log=print):
    """All stages in order, as the notebook runs them."""
    start = time.perf_counter()
    corpus = load(params, speeches, log)
    models = train(params, corpus, log)
    reading, steps = reading_choice.select(params, corpus, models, log)
    tuned, selection = select_personal(params, corpus, models, log)
    rows = sensitivity.main_rows(params, corpus, models, reading, tuned, log)
    switched, costs = sensitivity.switched(params, corpus, reading, log)
    wall = time.perf_counter() - start
    return conclude(params, corpus, models, steps, tuned, selection, rows + switched, costs, wall)
