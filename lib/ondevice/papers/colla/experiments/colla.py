"""Colla C1-C4: next-place prediction on GeoLife devices by device-only training (DT), cloud-only
training on pooled data (CT), warm-started device training (DT-ws) and Colla, over update cycles,
beside non-neural baselines on the same splits.

Stages (one notebook section each, called where they live): `common.load_devices`,
`controls.input_choice` (what every model reads, chosen on held-out training data),
`common.bootstrap` (stage 1 cloud model and stage 2 first pull, cached), `controls.setting_choice`
(the client update's rate and stopping rule, chosen on held-out training data),
`protocol.run_cycles` (per cycle every method's client update on the cycle's data, the test on the
next cycle's, and Colla's cloud update with model grouping), `run_controls` (the known-answer
controls) and `controls.data_scale`, `variant`, `conclude`. Tables and figures are in `report`.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

import pandas as pd

from ondevice import streams
from ondevice.papers.colla import common, controls
from ondevice.papers.colla.common import Bootstrapped, CollaParams, Devices, bootstrap, load_devices
from ondevice.papers.colla.protocol import (
    METHODS,
    SeedRun,
    cycles_table,
    groups_table,
    run_cycles,
)
from ondevice.papers.colla.report import (
    best_shares,
    best_shares_all,
    diagnose,
    final,
    model_sizes,
    shared_places,
    shared_share,
    summary_table,
    training_steps,
    versus_baselines,
)
from ondevice.params import presets
from ondevice.report import facts, record
from ondevice.report.conclusion import Conclusion

NAME = "colla"
PAPER = facts.paper(NAME)  # Table 1, Sec. 3.2 and 5.3 (top-100 devices, mobility prediction)
OTHER_SEQUENCE = {"visits": "bins", "bins": "visits"}  # the variant reported beside the main reading
# default leaves out the 10-minute-bin reading (last run at 71d489d): the client updates' longer patience
# (patience_steps) roughly doubles their cost, and this run is about the visits reading's controls. The
# smoke runs the inputs variant only: both variants run through `variant`
OWN_PRESETS = {
    "smoke": dict(seeds=1, bootstrap=300, sequence_variant=False),
    "default": dict(seeds=3, sequence_variant=False),
    "paper": dict(seeds=3),
}


@dataclass(frozen=True)
class Params(CollaParams):
    bootstrap: int = 2000  # resamples of devices for the effects' intervals
    sequence_variant: bool = True  # also run the other reading of the task (visits <-> bins)
    inputs_variant: bool = True  # also run the models with the other inputs (a sensitivity row)

    PRESETS = presets(common.SHARED_PRESETS, OWN_PRESETS)

    def check(self) -> None:
        super().check()
        self.require(self.bootstrap >= 100, "bootstrap", "must be at least 100 resamples")


def variants(params: Params) -> dict[str, dict]:
    """The variants the preset runs beside the main rows, by name: the fields each changes. The other
    reading of the task (visits <-> 10-minute bins); the other inputs (the last place only, or the
    paper's), the sensitivity row of what the models read."""
    named = {}
    if params.sequence_variant:
        named[OTHER_SEQUENCE[params.sequence]] = dict(sequence=OTHER_SEQUENCE[params.sequence])
    if params.inputs_variant:
        other = next(i for i in common.INPUTS if i != params.inputs)
        named[other.replace(" ", "_").replace("'", "")] = dict(inputs=other)
    return named


def variant(params: Params, change: dict, log=print) -> pd.DataFrame:
    """A variant (`variants`): every method and baseline on its own samples and bootstrapped models,
    with every other setting as the main run's; its cycles table."""
    other = dataclasses.replace(params, **change)
    devices = load_devices(other, log)
    cycles = cycles_table(run_cycles(other, devices, bootstrap(other, devices, log), log))
    return cycles.assign(sequence=other.sequence, inputs=other.inputs)


def sensitivity(main: pd.DataFrame, others: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Per run (the main one and each variant): what it changes, each method's median accuracy over
    devices after the last update (mean over seeds) and Colla's margin over each other method."""
    rows = []
    for name, cycles in {"main": main, **others}.items():
        last = final(cycles)
        medians = last.groupby(["method", "seed"]).accuracy.median().groupby("method").mean()
        row = {"run": name, "sequence": last.sequence.iloc[0], "inputs": last.inputs.iloc[0]}
        row |= {f"median accuracy, {m}": float(medians[m]) for m in METHODS}
        rows.append(row | {f"Colla - {m}": float(medians["Colla"] - medians[m]) for m in METHODS if m != "Colla"})
    return pd.DataFrame(rows)


def run_controls(params: Params, devices: Devices, runs: list[SeedRun], log=print) -> pd.DataFrame:
    """The known-answer controls (`controls`), CT's with the run's inputs on this run's CT models."""
    run_ct = {s: (r.ct_weights, r.ct_steps_to_best) for s, r in zip(params.seed_list, runs)}
    return controls.run_controls(params, devices, run_ct, log)


def per_seed(params: Params, last: pd.DataFrame, groups: pd.DataFrame) -> dict[str, list[float]]:
    """Each headline quantity's value per seed: Table 1's medians and means, Colla's best share and
    the groups chosen at the last cloud update (1 when it kept one group)."""
    values = {f"median accuracy, {m}": [] for m in METHODS} | {f"mean accuracy, {m}": [] for m in METHODS}
    values["share of devices where Colla is best"] = []
    values["groups chosen at the last update"] = []
    shares = best_shares(last)
    for seed, group in last.groupby("seed"):
        for m in METHODS:
            acc = group[group.method == m].accuracy
            values[f"median accuracy, {m}"].append(float(acc.median()))
            values[f"mean accuracy, {m}"].append(float(acc.mean()))
        values["share of devices where Colla is best"].append(
            float(shares[(shares.seed == seed) & (shares.method == "Colla")]["best share"].iloc[0])
        )
        chosen = groups[(groups.seed == seed) & (groups.cycle == params.cycles) & groups.chosen]
        values["groups chosen at the last update"].append(float(chosen.K.iloc[0]) if len(chosen) else 1.0)
    return values


@dataclass
class Checks:
    """The run's measurements beside Table 1, each None when not run: the client update's setting
    (rate and stopping rule) and the inputs chosen on held-out training data, the controls, the
    data-scale probe, the other reading of the task."""

    setting: pd.DataFrame | None = None
    inputs: pd.DataFrame | None = None
    control: pd.DataFrame | None = None
    scale: pd.DataFrame | None = None
    others: dict[str, pd.DataFrame] = field(default_factory=dict)  # variant name -> its cycles table
    tolerance: float = 0.02  # the controls' (`control_tolerance`), which the inputs rule applies

    def tables(self) -> dict[str, pd.DataFrame]:
        named = {"setting_choice": self.setting, "input_choice": self.inputs, "controls": self.control}
        named |= {"data_scale": self.scale}
        if self.control is not None:
            named["controls_summary"] = controls.summary(self.control)
        for name, cycles in self.others.items():
            named[f"summary_{name}"] = summary_table(final(cycles))
            named[f"versus_baselines_{name}"] = versus_baselines(final(cycles))
        return {k: v for k, v in named.items() if v is not None}

    def notes(self) -> dict:
        checked = None if self.control is None else controls.summary(self.control)
        chosen = None if self.inputs is None else controls.chosen_regularization(self.inputs)
        return {
            "inputs_measured": None if self.inputs is None else controls.chosen_inputs(self.inputs, self.tolerance),
            "regularization_measured": None
            if chosen is None
            else dict(zip(("feature_dropout", "weight_decay"), chosen)),
            "client_setting_measured": None
            if self.setting is None
            else dict(zip(controls.SETTING, controls.chosen_setting(self.setting))),
            "controls": None
            if checked is None
            else {f"{r.control}, {r.inputs}": r.verdict for r in checked.itertuples()},
        }


def run_tables(params: Params, devices: Devices, boot: Bootstrapped, cycles: pd.DataFrame, groups, sizes) -> dict:
    """The tables every run saves: the data, Table 1's and the training's (aggregates only)."""
    last = final(cycles)
    return {
        "data": devices.table(),
        "qualification": devices.qualification(params.cycles),
        "cycles": cycles,
        "summary": summary_table(last),
        "best_shares": best_shares(last),
        "groups": groups,
        "model_sizes": sizes,
        "bootstrap_training": boot.history(),
        "model_cache": boot.cache(),
        "versus_baselines": versus_baselines(last),
        "best_shares_all": best_shares_all(last),
        "training_steps": training_steps(cycles),
        "shared_places": shared_places(devices, params),
    }


def conclude(
    params: Params, devices: Devices, boot: Bootstrapped, runs: list[SeedRun], wall_time_s: float, checks: Checks
) -> record.Result:
    cycles = cycles_table(runs)
    last = final(cycles)
    groups = groups_table(runs)
    sizes = model_sizes(params, devices)
    c = Conclusion(NAME, params, PAPER)
    c.headlines(per_seed(params, last, groups), resolution={"groups chosen at the last update": 1.0})
    counted = sizes.set_index(["places", "model"]).total
    c.paper_vs_ours(
        extra={
            "parameters, cloud model (|V| = 368)": float(counted[("paper's |V| = 368", "cloud (heavy)")]),
            "parameters, device model (|V| = 368)": float(
                counted[("paper's |V| = 368", "device (light, FC over every place)")]
            ),
        }
    )
    wide = {
        m: last[last.method == m].pivot(index="seed", columns="device", values="accuracy").to_numpy() for m in METHODS
    }
    measured = {f"Colla is more accurate than {m}": (wide["Colla"], wide[m]) for m in ("DT", "CT", "DT-ws")}
    effects = c.effects(measured, streams.rng(params.seed, "bootstrap"), n_boot=params.bootstrap, resampled="devices")
    tables = run_tables(params, devices, boot, cycles, groups, sizes) | checks.tables()
    if checks.others:
        tables["sensitivity"] = sensitivity(
            cycles.assign(sequence=params.sequence, inputs=params.inputs), checks.others
        )
    if checks.control is not None:
        data = tables["data"]
        samples = float(data[data.part != "bootstrap (cloud)"]["samples per device, median"].median())
        c.effect_rows(diagnose(effects, last, tables["controls_summary"], samples, params.inputs, checks.scale))
    crossings = [r.boundary.log for r in runs]
    return c.result(
        tables,
        [devices.summary()],
        None,
        wall_time_s,
        devices=len(devices.uids),
        devices_excluded=len(devices.data.excluded),
        places=devices.places,
        sequence=params.sequence,
        inputs=params.inputs,
        seeds=params.seed_list,
        **checks.notes(),
        **{"share of test place changes to places seen on other devices": shared_share(tables["shared_places"])},
        uploads=sum(1 for log in crossings for c_ in log if c_[0] == "up"),
        downloads=sum(1 for log in crossings for c_ in log if c_[0] == "down"),
        parameters_uploaded=sum(sum(u.size for d, _, u in log if d == "up") for log in crossings),
        cloud_models_from_cache={s: e.hit for s, e in boot.cloud.items()},
        limitation=common.LIMITED_DEVICES.format(n=len(devices.uids)),
    )


def run(params: Params, log=print) -> record.Result:
    start = time.perf_counter()
    devices = load_devices(params, log)
    inputs = controls.input_choice(params, devices, log)
    boot = bootstrap(params, devices, log)
    setting = controls.setting_choice(params, devices, log)
    runs = run_cycles(params, devices, boot, log)
    control = run_controls(params, devices, runs, log)
    scale = controls.data_scale(params, devices, log)
    others = {name: variant(params, change, log) for name, change in variants(params).items()}
    checks = Checks(setting, inputs, control, scale, others, params.control_tolerance)
    return conclude(params, devices, boot, runs, time.perf_counter() - start, checks)
