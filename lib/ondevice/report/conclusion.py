"""One conclusion builder for every experiment: tidy per-user measurements and the paper's facts
(`paper.toml`, through `facts`) in; the headline, paper-vs-ours and effects tables, the diagnoses
(each with its `claims.Kind`) and the run's `record.Result` out. An experiment's `conclude` then
says only what it measured and which claim each measurement answers:

    def conclude(params, users, manifests, wall_time_s):
        c = Conclusion(NAME, params, facts.paper(NAME))
        med = users.groupby(["seed", "condition"]).top_k_eff.median()
        c.headlines({f"top-k-eff, {k}": med.xs(k, level="condition") for k in ("global", "personal")})
        measured = {claim: (wide(users, "top_k_eff", condition="personal"),
                            wide(users, "top_k_eff", condition="global"))}
        why = {claim: claims.Diagnosis("a user keeps 800 of 5,000 words", "Vocabulary", claims.Kind.DATA)}
        c.effects(measured, streams.rng(params.seed, "bootstrap"), n_boot=params.bootstrap, diagnoses=why)
        c.paper_vs_ours()  # the paper's numbers beside the headline values
        return c.result({"users": users}, manifests, STAND_IN, wall_time_s, seeds=params.seed_list)

Effects the paper's numbers do not pair (`claims.effects_table` needs both of an effect's numbers)
are rows from `effect_row` given to `effect_rows`, each with `diagnosed`; a diagnosis that needs the
finished table (the audit's flag) goes in with `diagnose`. A diagnosis names its kind: data, scale,
hardware or the paper read two ways only for a measured cause outside our implementation; left
open, the row counts as ours to fix in SUMMARY.md (`claims.kind_counts`).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from ondevice.report import claims, record

INTERVAL = ("our change", "ci low", "ci high")
COUNTS = ("users", "seeds", "users improved", "users worse", "sign test p", "verdict")


def wide(table: pd.DataFrame, value: str, **where) -> np.ndarray:
    """One measurement of the rows matching `where` (column=value) as (seeds, users), both sorted
    (one row when the table has no seed column): what a paired effect compares."""
    sel = table[np.logical_and.reduce([table[k] == v for k, v in where.items()])] if where else table
    sel = sel if "seed" in sel else sel.assign(seed=0)
    return sel.pivot(index="seed", columns="user", values=value).sort_index().sort_index(axis=1).to_numpy(float)


def effect_row(
    first: dict, better, worse, rng, n_boot: int, statistic: str = "median", after_interval: dict | None = None
) -> dict:
    """An effect's row for claims `claims.effects_table` cannot pair: `first` (its name, the paper's
    change, ...), our change with its paired bootstrap interval over users (`claims.paired_effect`),
    `after_interval`, the user counts, sign test and verdict, and the level."""
    r = claims.paired_effect(better, worse, rng, n_boot=n_boot, statistic=statistic)
    measured = {name: r[name.replace(" ", "_").replace("our_", "")] for name in INTERVAL + COUNTS}
    return {
        **first,
        **{k: measured[k] for k in INTERVAL},
        **(after_interval or {}),
        **{k: measured[k] for k in COUNTS},
        "level": 0.95,
    }


def diagnosed(row: dict, diagnosis: claims.Diagnosis | None) -> dict:
    """`row` with its diagnosis, section and diagnosis kind (empty cells without a diagnosis)."""
    return row | (diagnosis.columns() if diagnosis is not None else claims.NO_DIAGNOSIS)


def diagnose(effects: pd.DataFrame, claim: str, diagnosis: claims.Diagnosis) -> pd.DataFrame:
    """`effects` with `diagnosis` on the row of `claim` (the other rows as they were)."""
    out = effects.copy()
    for column in claims.NO_DIAGNOSIS:
        if column not in out:
            out[column] = ""
    out.loc[out.effect == claim, list(claims.NO_DIAGNOSIS)] = list(diagnosis.columns().values())
    return out


class Conclusion:
    """Collects one run's conclusion: headline numbers over seeds, the paper's numbers beside ours,
    the effects with their diagnoses, and the experiment's own tables; `result` makes the record."""

    def __init__(self, name: str, params, paper: claims.Paper | None = None):
        self.name, self.params, self.paper = name, params, paper
        self.headline: dict[str, dict] = {}
        # the builder's tables: headline, paper_vs_ours, effects; an experiment may replace one, e.g. a
        # headline whose columns say they hold timings
        self.tables: dict[str, pd.DataFrame] = {}

    def headlines(self, per_seed: Mapping, resolution: Mapping | None = None) -> dict[str, dict]:
        """Headline numbers from their per-seed values (`claims.headline`), each with the tolerance a
        re-run should stay within; `resolution` per quantity is its smallest tolerance."""
        for quantity, values in per_seed.items():
            self.headline[quantity] = claims.headline(list(values), (resolution or {}).get(quantity, 0.0))
        return self.headline

    def paper_vs_ours(self, extra: Mapping | None = None, setting: Mapping | None = None, drop=()) -> pd.DataFrame:
        """The paper's numbers beside ours: the headline values and `extra` ones (e.g. means that
        have no tolerance), less the quantities in `drop`; `setting` names what each of ours measured."""
        ours = {q: h["value"] for q, h in self.headline.items()} | dict(extra or {})
        table = claims.paper_vs_ours(self._paper(), ours)
        table = table[~table.quantity.isin(drop)] if drop else table
        if setting is not None:
            table["ours (setting)"] = table.quantity.map(setting)
        self.tables["paper_vs_ours"] = table
        return table

    def effects(self, measured: Mapping, rng, **options) -> pd.DataFrame:
        """One row per effect of the paper's facts (`claims.effects_table`, `options` passed on:
        n_boot, statistic, diagnoses, resampled, repeats)."""
        return self.effect_rows(claims.effects_table(self._paper(), dict(measured), rng, **options))

    def effect_rows(self, rows) -> pd.DataFrame:
        """The effects table from rows made elsewhere (`effect_row`, a paper-specific statistic)."""
        self.tables["effects"] = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows)
        return self.tables["effects"]

    def result(
        self,
        tables: Mapping,
        data: list,
        stand_in: str | None,
        wall_time_s: float,
        models: Mapping | None = None,
        artifacts: Mapping | None = None,
        **notes,
    ) -> record.Result:
        """The run's record: the experiment's `tables`, then the builder's (the headline table
        always, the others when made), with its data sources and notes."""
        own = {"headline": claims.headline_table(self.headline), **self.tables}
        twice = sorted(set(tables) & set(own))
        if twice:
            raise ValueError(f"{self.name}: tables {twice} come from the conclusion builder, not the experiment")
        return record.Result(
            self.name,
            self.params.to_dict(),
            {**tables, **own},
            data,
            stand_in,
            wall_time_s,
            notes=notes,
            headline=self.headline,
            models=dict(models or {}),
            artifacts=dict(artifacts or {}),
        )

    def _paper(self) -> claims.Paper:
        if self.paper is None:
            raise ValueError(f"{self.name}: the conclusion has no paper facts to compare with")
        return self.paper
