"""Colla C1-C4: next-place prediction on GeoLife devices by device-only training (DT), cloud-only
training on pooled data (CT), warm-started device training (DT-ws) and Colla, over update cycles,
beside non-neural baselines on the same splits.

Stages (one notebook section each): `load_devices`, `bootstrap` (stage 1 cloud model and stage 2
first pull, cached), `run_cycles` (`protocol`: per cycle every method's client update on the
cycle's data, the test on the next cycle's, and Colla's cloud update with model grouping),
`conclude`. Tables and figures are in `report`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ondevice import streams
from ondevice.papers.colla import common
from ondevice.papers.colla.common import Bootstrapped, CollaParams, Devices, bootstrap, load_devices  # noqa: F401  (stages)
from ondevice.papers.colla.protocol import (  # noqa: F401  (stages)
    BASELINES,
    METHODS,
    SeedRun,
    cycles_table,
    groups_table,
    run_cycles,
)
from ondevice.papers.colla.report import (  # noqa: F401  (stages)
    best_shares,
    final,
    model_sizes,
    plot_cdfs,
    plot_cycles,
    shared_places,
    summary_table,
    versus_baselines,
)
from ondevice.params import presets
from ondevice.report import claims, facts, record

NAME = "colla"
PAPER = facts.paper(NAME)  # Table 1, Sec. 3.2 and 5.3 (top-100 devices, mobility prediction)
OWN_PRESETS = {"smoke": dict(seeds=1, bootstrap=300), "default": dict(seeds=2), "paper": dict(seeds=3)}


@dataclass(frozen=True)
class Params(CollaParams):
    bootstrap: int = 2000  # resamples of devices for the effects' intervals

    PRESETS = presets(common.SHARED_PRESETS, OWN_PRESETS)

    def check(self) -> None:
        super().check()
        self.require(self.bootstrap >= 100, "bootstrap", "must be at least 100 resamples")


def conclude(
    params: Params, devices: Devices, boot: Bootstrapped, runs: list[SeedRun], wall_time_s: float
) -> record.Result:
    cycles = cycles_table(runs)
    last = final(cycles)
    summary = summary_table(last)
    groups = groups_table(runs)
    sizes = model_sizes(params, devices)
    per_seed = {f"median accuracy, {m}": [] for m in METHODS} | {f"mean accuracy, {m}": [] for m in METHODS}
    per_seed["share of devices where Colla is best"] = []
    per_seed["groups chosen at the last update"] = []
    shares = best_shares(last)
    for seed, group in last.groupby("seed"):
        for m in METHODS:
            acc = group[group.method == m].accuracy
            per_seed[f"median accuracy, {m}"].append(float(acc.median()))
            per_seed[f"mean accuracy, {m}"].append(float(acc.mean()))
        per_seed["share of devices where Colla is best"].append(
            float(shares[(shares.seed == seed) & (shares.method == "Colla")]["best share"].iloc[0])
        )
        chosen = groups[(groups.seed == seed) & (groups.cycle == params.cycles) & groups.chosen]
        per_seed["groups chosen at the last update"].append(float(chosen.K.iloc[0]) if len(chosen) else 1.0)
    headline = {q: claims.headline(v, resolution=1.0 if q.startswith("groups") else 0.0) for q, v in per_seed.items()}
    counted = sizes.set_index(["places", "model"]).total
    ours = {q: h["value"] for q, h in headline.items()}
    ours["parameters, cloud model (|V| = 368)"] = float(counted[("paper's |V| = 368", "cloud (heavy)")])
    ours["parameters, device model (|V| = 368)"] = float(
        counted[("paper's |V| = 368", "device (light, FC over every place)")]
    )
    wide = {
        m: last[last.method == m].pivot(index="seed", columns="device", values="accuracy").to_numpy() for m in METHODS
    }
    measured = {f"Colla is more accurate than {m}": (wide["Colla"], wide[m]) for m in ("DT", "CT", "DT-ws")}
    effects = claims.effects_table(
        PAPER, measured, streams.rng(params.seed, "bootstrap"), n_boot=params.bootstrap, resampled="devices"
    )
    tables = {
        "data": devices.table(),
        "cycles": cycles.drop(columns=["train_samples"]),
        "summary": summary,
        "best_shares": shares,
        "groups": groups,
        "model_sizes": sizes,
        "bootstrap_training": boot.history(),
        "model_cache": boot.cache(),
        "headline": claims.headline_table(headline),
        "paper_vs_ours": claims.paper_vs_ours(PAPER, ours),
        "effects": effects,
        "versus_baselines": versus_baselines(last),
        "shared_places": shared_places(devices, params),
    }
    crossings = [r.boundary.log for r in runs]
    return record.Result(
        experiment=NAME,
        params=params.to_dict(),
        tables=tables,
        headline=headline,
        data=[devices.summary()],
        stand_in_data=None,
        wall_time_s=wall_time_s,
        notes={
            "devices": len(devices.uids),
            "devices_excluded": len(devices.data.excluded),
            "places": devices.places,
            "seeds": params.seed_list,
            "uploads": sum(1 for log in crossings for c in log if c[0] == "up"),
            "downloads": sum(1 for log in crossings for c in log if c[0] == "down"),
            "parameters_uploaded": sum(sum(u.size for d, _, u in log if d == "up") for log in crossings),
            "cloud_models_from_cache": {s: e.hit for s, e in boot.cloud.items()},
            "limitation": common.LIMITED_DEVICES.format(n=len(devices.uids)),
        },
    )


def run(params: Params, log=print) -> record.Result:
    start = time.perf_counter()
    devices = load_devices(params, log)
    boot = bootstrap(params, devices, log)
    runs = run_cycles(params, devices, boot, log)
    return conclude(params, devices, boot, runs, time.perf_counter() - start)
