"""Colla C1-C4: next-place prediction on GeoLife devices by device-only training (DT), cloud-only
training on pooled data (CT), warm-started device training (DT-ws) and Colla, over update cycles.

Stages (one notebook section each): `load_devices`, `bootstrap` (stage 1 cloud model and stage 2
first pull, cached), `run_cycles` (per cycle: every method's client update on the cycle's data,
the test on the next cycle's, and Colla's cloud update with model grouping), `conclude`.

Every method sees the same devices, cycles and samples. Device models are the light M-RNN with a
customised FC; CT is the heavy model trained on every device's raw data so far (the one method
whose data crosses to the cloud). Colla's devices and cloud exchange only parameters, through
`techniques.colla.boundary`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from sklearn.metrics import precision_score

from ondevice import streams
from ondevice.models import mrnn
from ondevice.models.markov import Markov, most_frequent
from ondevice.papers.colla import common
from ondevice.papers.colla.common import Bootstrapped, CollaParams, Devices, bootstrap, load_devices  # noqa: F401  (stages)
from ondevice.papers.colla.techniques.boundary import Boundary, Download, Upload
from ondevice.papers.colla.techniques.cloud_update import ClientEnsemble
from ondevice.papers.colla.techniques.distillation import CloudTeacher, DistillationHook
from ondevice.papers.colla.techniques.grouping import choose_groups, output_distances
from ondevice.report import claims, record
from ondevice.training.trainer import Trainer

NAME = "colla"
METHODS = ("DT", "CT", "DT-ws", "Colla")
CONTEXT = "last place"  # predicts the place of the last step: context, not one of the paper's methods
# Non-neural baselines on the same splits: a device's own most frequent place and first-order Markov
# table (its cycles so far, what DT trains on), and a Markov table pooled over every device's raw data
# so far (what CT sees). A neural method below the per-device Markov table is flagged.
MARKOV = "Markov (device)"
BASELINES = (CONTEXT, "most frequent place", MARKOV, "Markov (pooled)")

PAPER = claims.Paper(
    citation=common.PAPER_CITATION + ", Table 1, Sec. 3.2 and 5.3 (top-100 devices, mobility prediction)",
    numbers=(
        *(claims.PaperNumber(f"median accuracy, {m}", v, "Table 1") for m, v in zip(METHODS, (0.40, 0.39, 0.42, 0.51))),
        *(claims.PaperNumber(f"mean accuracy, {m}", v, "Table 1") for m, v in zip(METHODS, (0.40, 0.40, 0.41, 0.47))),
        claims.PaperNumber("share of devices where Colla is best", 0.68, "Table 1"),
        claims.PaperNumber("groups chosen at the last update", 2, "Sec. 5.3, Fig. 9b"),
        claims.PaperNumber("parameters, cloud model (|V| = 368)", 128_796, "Sec. 3.2"),
        claims.PaperNumber("parameters, device model (|V| = 368)", 11_868, "Sec. 3.2"),
    ),
    effects=tuple(
        claims.Effect(f"Colla is more accurate than {m}", "median accuracy, Colla", f"median accuracy, {m}")
        for m in ("DT", "CT", "DT-ws")
    ),
)


@dataclass(frozen=True)
class Params(CollaParams):
    bootstrap: int = 2000  # resamples of devices for the effects' intervals

    PRESETS = common.presets({"smoke": dict(seeds=1, bootstrap=300), "default": dict(seeds=2), "paper": dict(seeds=3)})

    def check(self) -> None:
        super().check()
        self.require(self.bootstrap >= 100, "bootstrap", "must be at least 100 resamples")


GROUP_CANDIDATES = (2, 3, 5, 10)  # the paper's K


class Runtime:
    """The Keras models and compiled trainers of a run, shared by every device, method and seed."""

    def __init__(self, params: Params, devices: Devices):
        self.params, self.places = params, devices.places
        p, n = params, devices.places
        self.device_model = mrnn.build(params.device_config(n), 0)
        self.teacher = CloudTeacher(mrnn.build(params.cloud_config(n), 0), params.device_slots)
        slot_task = common.location_task(p, p.device_slots)
        self.plain = Trainer(self.device_model, slot_task, p.learning_rate)
        self.distill = Trainer(
            self.device_model, slot_task, p.learning_rate, hooks=[DistillationHook(self.teacher, p.lam)]
        )
        self.cloud_model = mrnn.build(params.cloud_config(n), 0)
        self.ensemble = ClientEnsemble(self.device_model.get_weights(), len(devices.uids), p.device_slots, n)
        cloud_task = common.location_task(p, n)
        self.ct = Trainer(self.cloud_model, cloud_task, p.learning_rate)
        self.cloud_distill = Trainer(
            self.cloud_model, cloud_task, p.learning_rate, hooks=[DistillationHook(self.ensemble, p.lam)]
        )


class Cloud:
    """Colla's cloud side: its own data, the base cloud model, one model per group. What it
    learns of devices arrives as `Upload`s (parameters and slot maps) and nothing else."""

    def __init__(self, rt: Runtime, weights: list[np.ndarray], data: tuple[np.ndarray, np.ndarray], seed: int):
        self.rt, self.base, self.data, self.seed = rt, weights, data, seed
        self.group_models: dict[int, list[np.ndarray]] = {}
        self.group_of: dict[str, int] = {}

    def download(self, device: str) -> Download:
        group = self.group_of.get(device, -1)
        return Download(self.group_models.get(group, self.base), group)

    def _distill(self, members: np.ndarray, start: list[np.ndarray], purpose: str) -> list[np.ndarray]:
        p = self.rt.params
        self.rt.ensemble.use(members)
        self.rt.cloud_distill.reset(start)
        self.rt.cloud_distill.fit(self.data, p.cloud_update_epochs, p.batch_size, streams.rng(self.seed, purpose))
        return self.rt.cloud_model.get_weights()

    def update(self, uploads: list[Upload], cycle: int) -> pd.DataFrame:
        """Stage 4: group the client models, distil the base model from all of them and one model
        per group from its members (each from the new base). Returns the grouping table."""
        self.rt.ensemble.assign([list(u.parameters) for u in uploads], np.stack([u.slot_places for u in uploads]))
        distances = output_distances(self.rt.ensemble, self.data[0], len(uploads))
        labels, table = choose_groups(distances, GROUP_CANDIDATES, self.seed)
        self.base = self._distill(np.arange(len(uploads)), self.base, f"cloud/{cycle}/base")
        groups = np.unique(labels)
        self.group_models = (
            {int(g): self._distill(np.nonzero(labels == g)[0], self.base, f"cloud/{cycle}/group{g}") for g in groups}
            if len(groups) > 1
            else {}
        )
        self.group_of = {u.device: int(g) for u, g in zip(uploads, labels)} if len(groups) > 1 else {}
        return table.assign(
            cycle=cycle, devices=len(uploads), group_sizes=" ".join(str(int((labels == g).sum())) for g in groups)
        )


@dataclass
class DeviceState:
    """A device's model under one method: weights and the place held by each FC slot."""

    weights: list[np.ndarray]
    slot_places: np.ndarray


def scores(y: np.ndarray, predicted: np.ndarray) -> dict:
    """Accuracy and the paper's weighted precision and recall (weights: each place's share of the
    test labels). Weighted recall is sum_i w_i TP_i / n_i = sum_i TP_i / n, i.e. accuracy."""
    labels = np.unique(y)
    return {
        "accuracy": float(np.mean(predicted == y)),
        "precision": float(precision_score(y, predicted, labels=labels, average="weighted", zero_division=0)),
        "recall": float(np.sum([np.sum((predicted == y) & (y == c)) for c in labels]) / len(y)),
    }


def _device_predictions(model, state: DeviceState, x: np.ndarray) -> np.ndarray:
    model.set_weights(state.weights)
    slots = np.argmax(common.logits(model, x), axis=-1)
    return state.slot_places[slots]


@dataclass
class SeedRun:
    rows: list[dict] = field(default_factory=list)  # per (cycle, device, method): scores
    groups: list[pd.DataFrame] = field(default_factory=list)
    boundary: Boundary = field(default_factory=Boundary)


def run_seed(params: Params, devices: Devices, boot: Bootstrapped, rt: Runtime, seed: int, log=print) -> SeedRun:
    """One seed: bootstrapped cloud model, first pull, then every cycle for every method."""
    p, out = params, SeedRun()
    empty = np.full(p.device_slots, -1, np.int64)
    dt_init = mrnn.build(p.device_config(devices.places), streams.tf_seed(seed, "init/device")).get_weights()
    pull = boot.pull[seed].weights
    pulled_columns = (pull[-2], pull[-1])  # the pulled small model's FC over every place
    dt_init[-1] = np.zeros_like(dt_init[-1])
    state = {
        "DT": {u: DeviceState(dt_init, empty) for u in devices.uids},
        "DT-ws": {u: DeviceState(common.customise(pull, dt_init), empty) for u in devices.uids},
    }
    state["Colla"] = dict(state["DT-ws"])
    cloud = Cloud(rt, boot.cloud[seed].weights, devices.cloud_data(), seed)
    ct_weights = boot.cloud[seed].weights
    for cycle in range(1, p.cycles + 1):
        start = time.perf_counter()
        for method in ("DT", "DT-ws", "Colla"):
            for uid in devices.uids:
                s = devices.data.devices[uid]
                x, y = s.take([cycle])
                weights, slots = common.grow(
                    state[method][uid].weights,
                    state[method][uid].slot_places,
                    y,
                    None if method == "DT" else pulled_columns,
                )
                keep = common.to_slots(slots, y)
                train, val = common.split_latest(x[keep >= 0], keep[keep >= 0], p.validation_fraction)
                trainer = rt.plain
                if method == "Colla":
                    pulled = out.boundary.down(uid, cloud.download(uid))
                    rt.teacher.assign(list(pulled.parameters), slots)
                    trainer = rt.distill
                rng = streams.rng(seed, f"client/{method}/{uid}/{cycle}")
                weights, history = (
                    common.fit_early_stopping(trainer, weights, train, val, p, rng, p.client_max_epochs)
                    if len(train[0])
                    else (weights, [])
                )
                state[method][uid] = DeviceState(weights, slots)
                tx, ty = s.take([cycle + 1])
                predicted = _device_predictions(rt.device_model, state[method][uid], tx)
                out.rows.append(
                    {
                        "seed": seed,
                        "cycle": cycle,
                        "device": uid,
                        "method": method,
                        **scores(ty, predicted),
                        "train_samples": len(x),
                        "test_samples": len(tx),
                        "epochs": len(history),
                        "places_held": int((slots >= 0).sum()),
                    }
                )
        # CT: the cloud trains the heavy model on every device's raw data so far (parts 0..cycle)
        parts = [devices.data.devices[u].take(list(range(cycle + 1))) for u in devices.uids]
        rt.ct.reset(ct_weights)
        rt.ct.fit(
            (np.concatenate([a for a, _ in parts]), np.concatenate([b for _, b in parts])),
            p.cloud_update_epochs,
            p.batch_size,
            streams.rng(seed, f"ct/{cycle}"),
        )
        ct_weights = rt.cloud_model.get_weights()
        for uid in devices.uids:
            tx, ty = devices.data.devices[uid].take([cycle + 1])
            predicted = np.argmax(common.logits(rt.cloud_model, tx), axis=-1)
            out.rows.append(
                {
                    "seed": seed,
                    "cycle": cycle,
                    "device": uid,
                    "method": "CT",
                    **scores(ty, predicted),
                    "train_samples": sum(len(b) for _, b in parts),
                    "test_samples": len(tx),
                    "epochs": p.cloud_update_epochs,
                    "places_held": devices.places,
                }
            )
        pooled = Markov(np.concatenate([a[:, -1, 0] for a, _ in parts]), np.concatenate([b for _, b in parts]))
        for uid in devices.uids:
            tx, ty = devices.data.devices[uid].take([cycle + 1])
            for method, predicted in baselines(devices.data.devices[uid], cycle, pooled, tx).items():
                out.rows.append(
                    {
                        "seed": seed,
                        "cycle": cycle,
                        "device": uid,
                        "method": method,
                        **scores(ty, predicted),
                        "train_samples": 0,
                        "test_samples": len(tx),
                        "epochs": 0,
                        "places_held": 0,
                    }
                )
        # Colla stage 4: every device pushes its model; the cloud updates and regroups
        uploads = [
            out.boundary.up(Upload(u, state["Colla"][u].weights, state["Colla"][u].slot_places)) for u in devices.uids
        ]
        out.groups.append(cloud.update(uploads, cycle).assign(seed=seed))
        frame = pd.DataFrame([r for r in out.rows if r["cycle"] == cycle])
        medians = frame.groupby("method").accuracy.median()
        log(
            f"seed {seed} cycle {cycle}/{p.cycles}: median accuracy "
            + ", ".join(f"{m} {medians[m]:.3f}" for m in (*METHODS, *BASELINES))
            + f" ({time.perf_counter() - start:.1f}s)"
        )
    return out


def baselines(device, cycle: int, pooled: Markov, tx: np.ndarray) -> dict[str, np.ndarray]:
    """Each baseline's predictions for test inputs `tx`: the last step's place, and the device's
    most frequent place and Markov table from its cycles 1..`cycle` (DT's data), and `pooled`."""
    x, y = device.take(list(range(1, cycle + 1)))
    current = tx[:, -1, 0]
    return {
        CONTEXT: current,
        "most frequent place": np.full(len(tx), most_frequent(y)),
        MARKOV: Markov(x[:, -1, 0], y).predict(current) if len(y) else np.full(len(tx), -1),
        "Markov (pooled)": pooled.predict(current),
    }


def versus_baselines(last: pd.DataFrame) -> pd.DataFrame:
    """Median accuracy over devices (mean over seeds) of every method beside the per-device Markov
    table's, and whether a neural method falls below it."""
    medians = last.groupby(["method", "seed"]).accuracy.median().groupby("method").mean()
    markov = float(medians[MARKOV])
    rows = [
        {
            "method": m,
            "kind": "neural" if m in METHODS else "baseline",
            "median accuracy": float(medians[m]),
            "minus Markov (device)": float(medians[m]) - markov,
            "below Markov (device)": bool(m in METHODS and medians[m] < markov),
        }
        for m in (*METHODS, *BASELINES)
        if m in medians.index
    ]
    return pd.DataFrame(rows)


def shared_places(devices: Devices, params: Params) -> pd.DataFrame:
    """Per device, over the last test period: the place changes (next place differs from the last
    step's) and how many of them go to a place seen on other devices up to then (their parts
    0..cycles). Aggregate counts only."""
    parts = list(range(params.cycles + 1))
    seen = {u: set(np.unique(devices.data.devices[u].take(parts)[1]).tolist()) for u in devices.uids}
    rows = []
    for uid in devices.uids:
        others = set().union(*(seen[o] for o in devices.uids if o != uid))
        tx, ty = devices.data.devices[uid].take([params.cycles + 1])
        changes = ty[ty != tx[:, -1, 0]]
        rows.append(
            {
                "device": uid,
                "changes": len(changes),
                "to places seen on other devices": int(np.isin(changes, list(others)).sum()),
                "to places seen on this device": int(np.isin(changes, list(seen[uid])).sum()),
            }
        )
    return pd.DataFrame(rows)


def run_cycles(params: Params, devices: Devices, boot: Bootstrapped, log=print) -> list[SeedRun]:
    rt = Runtime(params, devices)
    return [run_seed(params, devices, boot, rt, s, log) for s in params.seed_list]


def cycles_table(runs: list[SeedRun]) -> pd.DataFrame:
    """Per (seed, cycle, device, method): accuracy, precision, recall (aggregate metrics only)."""
    return pd.DataFrame([r for run in runs for r in run.rows])


def final(cycles: pd.DataFrame) -> pd.DataFrame:
    """The models at the end of the last cycle, tested on the last period (the paper's Table 1)."""
    return cycles[cycles.cycle == cycles.cycle.max()]


def best_shares(last: pd.DataFrame) -> pd.DataFrame:
    """Share of devices on which each of the paper's methods has the highest accuracy (mean over
    seeds); a tie shares the device equally among the tied methods."""
    rows = []
    for seed, group in last[last.method.isin(METHODS)].groupby("seed"):
        wide = group.pivot(index="device", columns="method", values="accuracy")[list(METHODS)]
        best = wide.to_numpy() == wide.to_numpy().max(axis=1, keepdims=True)
        share = (best / best.sum(axis=1, keepdims=True)).mean(axis=0)
        rows += [{"seed": seed, "method": m, "best share": float(v)} for m, v in zip(METHODS, share)]
    return pd.DataFrame(rows)


def summary_table(last: pd.DataFrame) -> pd.DataFrame:
    """Table 1's columns per method: best share, mean and median accuracy (means over seeds), and
    the medians of weighted precision and recall."""
    shares = best_shares(last).groupby("method")["best share"].mean()
    stats = (
        last.groupby(["method", "seed"])
        .agg(
            mean_accuracy=("accuracy", "mean"),
            median_accuracy=("accuracy", "median"),
            median_precision=("precision", "median"),
            median_recall=("recall", "median"),
        )
        .groupby("method")
        .mean()
    )
    stats["best share"] = shares
    order = [m for m in (*METHODS, *BASELINES) if m in stats.index]
    return stats.loc[order].reset_index()


def groups_table(runs: list[SeedRun]) -> pd.DataFrame:
    return pd.concat([g for run in runs for g in run.groups], ignore_index=True)


def model_sizes(params: Params, devices: Devices) -> pd.DataFrame:
    """C1: parameter counts of both models at the paper's 368 places and at ours."""
    rows = []
    for label, n in (("paper's |V| = 368", 368), (f"ours, |V| = {devices.places}", devices.places)):
        for model, config in (
            ("cloud (heavy)", params.cloud_config(n)),
            ("device (light, FC over every place)", params.device_config(n, customised=False)),
        ):
            rows.append(
                {
                    "places": label,
                    "model": model,
                    "embedding": config.embedding_dim,
                    "hidden": config.hidden_units,
                    **mrnn.parameter_count(config),
                }
            )
    return pd.DataFrame(rows)


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


COLOURS = {
    "DT": "#8c8c8c",
    "CT": "#edae49",
    "DT-ws": "#00798c",
    "Colla": "#d1495b",
    CONTEXT: "#30638e",
    "most frequent place": "#6a4c93",
    MARKOV: "#2a9d8f",
    "Markov (pooled)": "#264653",
}


def plot_cdfs(last: pd.DataFrame):
    """Fig. 4/5: CDFs over devices of accuracy, weighted precision and recall after the last
    update (all seeds' devices pooled); the non-neural baselines dashed."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6), sharey=True)
    for ax, metric in zip(axes, ("accuracy", "precision", "recall")):
        for m in (*METHODS, *BASELINES):
            values = np.sort(last[last.method == m][metric].to_numpy())
            ax.step(
                values,
                np.arange(1, len(values) + 1) / len(values),
                where="post",
                color=COLOURS[m],
                ls="--" if m in BASELINES else "-",
                lw=2 if m == "Colla" else 1.3,
                label=m,
            )
        ax.set(xlabel=f"{'weighted ' if metric != 'accuracy' else ''}{metric}", xlim=(0, 1))
    axes[0].set_ylabel("share of devices")
    axes[-1].legend(frameon=False, loc="lower right")
    fig.suptitle("Per-device scores after the last update (CDF over devices)")
    fig.tight_layout()
    return fig


def plot_cycles(cycles: pd.DataFrame):
    """Fig. 8: median accuracy over devices after each update, per method (mean over seeds)."""
    import matplotlib.pyplot as plt

    medians = (
        cycles.groupby(["method", "seed", "cycle"]).accuracy.median().groupby(["method", "cycle"]).mean().reset_index()
    )
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for m in (*METHODS, *BASELINES):
        d = medians[medians.method == m]
        ax.plot(d.cycle, d.accuracy, marker="o", color=COLOURS[m], ls="--" if m in BASELINES else "-", label=m)
    ax.set(
        xlabel="update cycle",
        ylabel="median accuracy over devices",
        xticks=sorted(medians.cycle.unique()),
        title="Accuracy after each update",
    )
    ax.legend(frameon=False)
    fig.tight_layout()
    return fig
