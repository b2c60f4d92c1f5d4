"""DeepType D3's personalization effect with the crowd or the global regime switched back: the two
protocol choices of top3eff that need a global model of their own.

The users, split and step-size choice are deeptype_top3eff's (`reading_choice` on the same validation
users, from the same crowd model-cache entry). Each switch (`sensitivity.SWITCHES`: the crowd that
includes the test and validation users' plays; the global model by Adam on the per-position mean loss)
trains its own global model, and the effect (that global model -> personalized at the chosen reading,
without the dynamic vocabulary, paired over the test users) is measured from it. Split from
deeptype_top3eff_sensitivity on 2026-12-07 so that each runs cold within a sitting: these two switches
train two global models (top3eff's last record: the leaky crowd, 2.6x the clean crowd's words, 3,593 s
with its personalization, the Adam regime 960 s); the switches that reuse the crowd model stay there.
top3eff's crowd row reads both tables at publish (its claims' protocols).

Stages: `load`, `train`, `reading_choice.select`, `sensitivity.switched`, `conclude`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pandas as pd

from ondevice import streams
from ondevice.data.per_user_text import Corpus, load_corpus
from ondevice.papers.deeptype import common, reading_choice, report, sensitivity
from ondevice.papers.deeptype import smoke_presets as smoke
from ondevice.papers.deeptype.common import GlobalModels, train_global
from ondevice.params import presets
from ondevice.report import facts
from ondevice.report.conclusion import Conclusion
from ondevice.tasks import typing_protocol
from ondevice.tasks.typing_protocol import DeepTypeParams

NAME = "deeptype_top3eff_global_sensitivity"
PAPER = facts.paper(NAME)  # a citation only: the claim is top3eff's, judged there
GLOBAL_SWITCHES = tuple(s for s in sensitivity.SWITCHES if s in ("leaky_crowd", "adam_global"))


@dataclass(frozen=True)
class Params(DeepTypeParams):
    step_size_tie: float = 0.001  # `reading_choice.RULE`, as top3eff's
    sensitivity: tuple[str, ...] = GLOBAL_SWITCHES  # the switches that train a global model of their own

    PRESETS = presets(
        typing_protocol.PRESETS,
        {"smoke": smoke.DEEPTYPE_TOP3EFF_GLOBAL_SENSITIVITY, "default": dict(seeds=1), "paper": dict(seeds=3)},
    )

    def check(self) -> None:
        super().check()
        self.at_least(0, "step_size_tie")
        self.at_least(1, "personal_epochs", "validation_users")
        known = bool(self.sensitivity) and set(self.sensitivity) <= set(sensitivity.SWITCHES)
        self.require(known, "sensitivity", f"must name switches of {sorted(sensitivity.SWITCHES)}")


def load(params: Params, speeches=None, log=print) -> Corpus:
    """The users with the crowd as global text (top3eff's crowd corpus)."""
    return load_corpus(params, speeches, log)


def train(params: Params, corpus: Corpus, log=print) -> GlobalModels:
    """The crowd model, for the step-size choice only: top3eff's model-cache entry."""
    return train_global(params, corpus, log)


def conclude(params, corpus, models, steps, rows, costs, wall_time_s):
    """The effect under each switch with its interval (`sensitivity.table`), each switch's global and
    personalized medians as headline numbers, and the runs' tables."""
    effects = sensitivity.table(rows, params, streams.rng(params.seed, "bootstrap/sensitivity"))
    per_user = pd.DataFrame(rows)
    c = Conclusion(NAME, params, PAPER)
    medians = per_user.groupby(["protocol", "seed"], sort=False)[["top_k_eff_global", "top_k_eff"]].median()
    for p in effects.protocol:
        c.headlines({f"top-k-eff, global, {p}": medians.loc[p].top_k_eff_global.tolist()})
        c.headlines({f"top-k-eff, personalized, {p}": medians.loc[p].top_k_eff.tolist()})
    kept = per_user.assign(kept_epoch=per_user.kept_epoch.astype(float).fillna(-1).astype(int))
    kept = kept.groupby(["protocol", "kept_epoch"], sort=False).size().rename("user_runs").reset_index()
    tables = {"sensitivity": effects, "sensitivity_cost": costs, "users": per_user, "step_size": steps}
    tables |= {"training": models.history(), "kept_epochs": kept}
    notes = dict(model_parameters=common.model_card(models.model)["parameters"], switches=list(params.sensitivity))
    return report.record(c, corpus, tables, wall_time_s, models, **notes)


def conclusion(effects: pd.DataFrame) -> str:
    """The table in words, generated from it: each switch's effect and verdict, and where its users stopped."""
    says = {"holds": "raises top-k-eff", "does not hold": "lowers top-k-eff", "within noise": "is within noise"}
    line = lambda r: (  # noqa: E731
        f"**{r.protocol}**: personalization {says.get(r.verdict, r.verdict)} ({r['our change']:+.1%} "
        f"[{r['ci low']:+.1%}, {r['ci high']:+.1%}]), median kept epoch {r.median_kept_epoch:g}"
    )
    return "; ".join(line(r) for _, r in effects.iterrows()) + "."


def run(params: Params, speeches=None, log=print):
    """All stages in order, as the notebook runs them."""
    start = time.perf_counter()
    corpus = load(params, speeches, log)
    models = train(params, corpus, log)
    reading, steps = reading_choice.select(params, corpus, models, log)
    rows, costs = sensitivity.switched(params, corpus, reading, log)
    return conclude(params, corpus, models, steps, rows, costs, time.perf_counter() - start)
