"""The forgetting ablation: MoIL's three global-AUC effects (GDM(0) forgets, mixing keeps more,
LF(n) keeps more) measured at every candidate Adam rate of the rate choice (`rate_choice`).

The thesis gives no rate for incremental training; the protocol's is chosen on held-out local
training clips, and its runs are the sweeps'. GDM(0), GDM(alpha) and GDM(alpha)+LF(n) are trained
again at each other candidate, from the same pre-trained weights on the same D_M and batch order,
so the rate is the only change. An ablation, never a diagnosis: the rate is our choice, not a cause
outside our implementation, so no effect row is explained by it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from ondevice import streams
from ondevice.papers.moil.protocol import MoilParams, Personalizer, Run
from ondevice.papers.moil.rate_choice import AUC, LOSS, RATE, rate_text
from ondevice.report import claims

PRE = "pre-trained"
ROLES = ("GDM(0)", "GDM(alpha)", "GDM(alpha) + LF(n)")  # the runs of one rate
CLAIMS = {  # the paper's claims this ablation measures: (better, worse) among PRE and ROLES
    "GDM(0) loses global AUC (catastrophic forgetting)": (PRE, "GDM(0)"),
    "mixing global data keeps more global AUC than GDM(0)": ("GDM(alpha)", "GDM(0)"),
    "LF(n) keeps more global AUC than full training": ("GDM(alpha) + LF(n)", "GDM(alpha)"),
}
COLUMNS = [
    "Adam rate",
    "chosen",
    "effect",
    "paper change",
    "our change",
    "ci low",
    "ci high",
    "verdict",
    "lowest local AUC",
]


@dataclass
class Ablation:
    """The runs of ROLES by Adam rate (the protocol's first), the claims' changes at the other
    rates, and the pre-trained model's scores they are judged against."""

    learning_rate: float  # the protocol's (the chosen one)
    runs: dict[float, dict[str, Run]]
    changes: pd.DataFrame  # CLAIMS at every other rate: COLUMNS of `claims.effects_table` rows
    pre_global: pd.Series
    size: pd.DataFrame | None = None  # the forgetting claims against the global set's size (`global_proxy`)

    def summary(self) -> pd.DataFrame:
        """Every run's AUCs after its last epoch, by rate, and its global AUC against the pre-trained model's."""
        rows = [
            {
                "Adam rate": rate,
                "chosen": rate == self.learning_rate,
                "run": role,
                "global AUC": float(r.scores["global"].mean()),
                "local AUC": float(r.scores["local"].mean()),
                "global AUC change": float(r.scores["global"].mean() / self.pre_global.mean() - 1),
            }
            for rate, by_role in self.runs.items()
            for role, r in by_role.items()
        ]
        return pd.DataFrame(rows)

    def shown(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        """The notebook's two tables, the summary and the changes, rates written out, values to 4 places."""
        return tuple(
            t.round(4).assign(**{"Adam rate": t["Adam rate"].map(rate_text)}) for t in (self.summary(), self.changes)
        )

    def history(self) -> pd.DataFrame:
        """Global and local AUC and loss after every epoch of every run, by rate (epoch 0: pre-trained)."""
        rows = [
            {"Adam rate": rate, "run": role, **{k: h[k] for k in ("epoch", "global_auc", "local_auc", "loss")}}
            for rate, by_role in self.runs.items()
            for role, r in by_role.items()
            for h in r.history
        ]
        return pd.DataFrame(rows)

    def table(self, n: int, effects_table: pd.DataFrame) -> pd.DataFrame:
        """Each claim's change at every rate, largest rate first; the protocol's rows are the effects
        table's (the same interval), LF(n) named LF(`n`) as there."""
        named = {c: c.replace("LF(n)", f"LF({n})") for c in CLAIMS}
        ours = effects_table[effects_table.effect.isin(named.values())].assign(
            **{
                "Adam rate": self.learning_rate,
                "chosen": True,
                "lowest local AUC": _lowest_local(self.runs[self.learning_rate]),
            }
        )
        parts = [ours[COLUMNS]]
        if len(self.changes):
            parts.append(self.changes.assign(effect=self.changes.effect.map(named))[COLUMNS])
        both = pd.concat(parts, ignore_index=True)
        return both.sort_values("Adam rate", ascending=False, kind="stable").reset_index(drop=True)

    def plot(self, alpha: float, n: int):
        """Global AUC per epoch of each run, one panel per configuration, one curve per Adam rate."""
        import matplotlib.pyplot as plt
        import seaborn as sns
        from matplotlib.ticker import MaxNLocator

        history = self.history().assign(rate=lambda d: d["Adam rate"].map(rate_text))
        order = [rate_text(r) for r in sorted(self.runs, reverse=True)]
        fig, axes = plt.subplots(1, len(ROLES), figsize=(15, 3.8), sharey=True)
        for ax, role in zip(axes, ROLES):
            h = history[history.run == role]
            sns.lineplot(data=h, x="epoch", y="global_auc", hue="rate", hue_order=order, marker="o", ax=ax)
            ax.set(title=role.replace("alpha", f"{alpha:g}").replace("LF(n)", f"LF({n})"), ylabel="global AUC")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.legend(title="Adam rate", fontsize=8, frameon=False)
        fig.suptitle("Forgetting against the learning rate (epoch 0: the pre-trained model)")
        sns.despine(fig)
        fig.tight_layout()
        return fig


def ablate(
    params: MoilParams,
    personalizer: Callable[[MoilParams], Personalizer],
    sweeps: list[Run],
    paper: claims.Paper,
    pre_global: pd.Series,
    stream: str,
    log=print,
) -> Ablation:
    """The ablation: ROLES at the protocol's rate taken from the `sweeps` (alpha and n sweeps), at
    each other rate of `learning_rates` trained by `personalizer(params with that rate)`; the claims
    at each other rate judged as the effects table judges them (median over the global set's classes,
    paired bootstrap from the random stream `<stream>/<rate>`)."""
    seed, alpha, n = params.seed, params.alpha, params.n
    configurations = dict(zip(ROLES, ((0.0, None), (alpha, None), (alpha, n))))
    by_config = {(r.alpha, r.n): r for r in sweeps if r.seed == seed and not r.fmc}
    runs = {params.learning_rate: {role: by_config[c] for role, c in configurations.items()}}
    others = [r for r in params.learning_rates if r != params.learning_rate]
    for rate in others:
        personal = personalizer(dataclasses.replace(params, learning_rate=rate))
        say = lambda line, r=rate: log(f"Adam {rate_text(r)}: {line}")  # noqa: E731
        runs[rate] = {role: personal.run(a, m, seed, say) for role, (a, m) in configurations.items()}
    judged = claims.Paper(paper.citation, paper.numbers, tuple(e for e in paper.effects if e.claim in CLAIMS))
    tables = []
    for rate in others:
        scores = {PRE: pre_global, **{role: r.scores["global"] for role, r in runs[rate].items()}}
        measured = {c: (scores[b].to_numpy(), scores[w].to_numpy()) for c, (b, w) in CLAIMS.items()}
        table = claims.effects_table(judged, measured, streams.rng(seed, f"{stream}/{rate:g}"), params.bootstrap)
        tables.append(
            table.assign(**{"Adam rate": rate, "chosen": False, "lowest local AUC": _lowest_local(runs[rate])})
        )
    changes = pd.concat(tables, ignore_index=True)[COLUMNS] if tables else pd.DataFrame(columns=COLUMNS)
    return Ablation(params.learning_rate, runs, changes, pre_global)


BY_RATE = {  # the forgetting rows of `by_rate`, by claim
    "GDM(0) loses global AUC (catastrophic forgetting)": "GDM(0) forgetting %",
    "mixing global data keeps more global AUC than GDM(0)": "mixing-global effect %",
}


def by_rate(effects: pd.DataFrame, choice: pd.DataFrame, seeds: int) -> pd.DataFrame:
    """One row per candidate rate: its held-out local loss and AUC (the rate choice's) and each
    forgetting row's change, 95% interval (in %) and verdict there (`Ablation.table`'s rows; the
    chosen rate's are over `seeds` seeds, the others' over the first)."""
    held, rows = choice.set_index(RATE), []
    for rate, t in effects.groupby("Adam rate", sort=False):
        chosen = bool(t.chosen.iloc[0])
        row = {RATE: rate, "chosen": chosen, LOSS: held.loc[rate, LOSS], AUC: held.loc[rate, AUC]}
        row["seeds"] = seeds if chosen else 1
        for claim, name in BY_RATE.items():
            r = t[t.effect == claim].iloc[0]
            row |= {name: 100 * r["our change"], f"{name} ci low": 100 * r["ci low"]}
            row |= {f"{name} ci high": 100 * r["ci high"], f"{name} verdict": r.verdict}
        rows.append(row)
    return pd.DataFrame(rows)


def _lowest_local(by_role: dict[str, Run]) -> float:
    return min(float(r.scores["local"].mean()) for r in by_role.values())
