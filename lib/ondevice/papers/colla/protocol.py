"""Colla's method, once: every method's client update on each cycle's data and the test on the
next cycle's (DT, CT, DT-ws, Colla), the non-neural baselines on the same splits, and Colla's
cloud update with model grouping.

Every method sees the same devices, cycles and samples. Device models are the light M-RNN with a
customised FC; CT is the heavy model trained on every device's raw data so far (the one method
whose data crosses to the cloud). Colla's devices and cloud exchange only parameters, through
`techniques.boundary`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from sklearn.metrics import precision_score

from ondevice import streams
from ondevice.data.places import ELSEWHERE
from ondevice.models import mrnn
from ondevice.models.markov import Markov, most_frequent
from ondevice.papers.colla import common
from ondevice.papers.colla.common import Bootstrapped, CollaParams, Devices
from ondevice.papers.colla.techniques.boundary import Boundary, Download, Upload
from ondevice.papers.colla.techniques.cloud_update import ClientEnsemble
from ondevice.papers.colla.techniques.distillation import CloudTeacher, DistillationHook
from ondevice.papers.colla.techniques.grouping import choose_groups, output_distances
from ondevice.training.trainer import Trainer

METHODS = ("DT", "CT", "DT-ws", "Colla")
CONTEXT = "last place"  # predicts the place of the last step: context, not one of the paper's methods
# Non-neural baselines on the same splits: a device's own most frequent place and first-order Markov
# table (its cycles so far, what DT trains on), and a Markov table pooled over every device's raw data
# so far (what CT sees). A neural method below the per-device Markov table is flagged.
MARKOV = "Markov (device)"
BASELINES = (CONTEXT, "most frequent place", MARKOV, "Markov (pooled)")


GROUP_CANDIDATES = (2, 3, 5, 10)  # the paper's K


class Runtime:
    """The Keras models and compiled trainers of a run, shared by every device, method and seed."""

    def __init__(self, params: CollaParams, devices: Devices):
        self.params, self.places = params, devices.places
        p, n = params, devices.places
        self.device_model = p.model(params.device_config(n), 0)
        self.teacher = CloudTeacher(mrnn.build(params.cloud_config(n), 0), params.device_slots)
        slot_task = common.location_task(p, p.device_slots)
        self.plain = p.trainer(self.device_model, slot_task, p.device_learning_rate)
        self.distill = p.trainer(
            self.device_model, slot_task, p.device_learning_rate, hooks=[DistillationHook(self.teacher, p.lam)]
        )
        self.cloud_model = p.model(params.cloud_config(n), 0)
        self.ensemble = ClientEnsemble(self.device_model.get_weights(), len(devices.uids), p.device_slots, n)
        cloud_task = common.location_task(p, n)
        self.ct = p.trainer(self.cloud_model, cloud_task, p.learning_rate)
        self.cloud_distill = p.trainer(
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
    test labels), where a label that is no known place (0, "elsewhere") is always a miss. Weighted
    recall is sum_i w_i TP_i / n_i = sum_i TP_i / n, i.e. accuracy."""
    predicted = np.where(predicted == ELSEWHERE, -1, predicted)  # predicting "elsewhere" never scores
    labels = np.unique(y)
    return {
        "accuracy": float(np.mean(predicted == y)),
        "precision": float(precision_score(y, predicted, labels=labels, average="weighted", zero_division=0)),
        "recall": float(np.sum([np.sum((predicted == y) & (y == c)) for c in labels]) / len(y)),
        "test_samples": len(y),
        "test_unknown_places": int(np.sum(y == ELSEWHERE)),
    }


def device_predictions(model, state: DeviceState, x: np.ndarray) -> np.ndarray:
    """The places a device model predicts (the place held by the top slot)."""
    model.set_weights(state.weights)
    slots = np.argmax(common.logits(model, x), axis=-1)
    return state.slot_places[slots]


@dataclass
class SeedRun:
    rows: list[dict] = field(default_factory=list)  # per (cycle, device, method): scores
    groups: list[pd.DataFrame] = field(default_factory=list)
    boundary: Boundary = field(default_factory=Boundary)
    ct_weights: list[np.ndarray] | None = None  # CT's model after the last cycle
    ct_steps_to_best: int = 0  # optimizer steps of CT's last fit up to the weights it kept


def client_update(rt: Runtime, trainer: Trainer, state: DeviceState, x, y, columns, seed: int, label: str):
    """Stage 3 on one device: the customised FC grows with the cycle's new places, then the model
    trains on 80% of the cycle until the held-out 20% (`common.client_split`) plateaus (best epoch
    kept; loss or accuracy by `client_monitor`), counted on the validation labels whose place the
    training part has: a label at a place absent from it cannot be learnt from this data, and its
    loss only rises as the model grows sure of the places it can learn, which stopped fits early
    (the device control, with the table's input, 0.224 -> 0.292 against the table's 0.314 on the 8
    devices with the most data). Returns the new
    state and what the fit did (`training_row`, plus the share of such validation labels)."""
    p = rt.params
    weights, slots = common.grow(state.weights, state.slot_places, y, columns)
    keep = common.to_slots(slots, y)
    if (keep >= 0).sum() < 2:
        return DeviceState(weights, slots), training_row([])
    train, val = common.client_split(p, x[keep >= 0], keep[keep >= 0], seed, label)
    learnable = np.isin(val[1], train[1])
    stop_on = (val[0][learnable], val[1][learnable]) if learnable.any() else val
    rng = streams.rng(seed, f"client/{label}")
    weights, history = common.fit_until_plateau(trainer, weights, train, stop_on, p, rng, p.client_max_epochs)
    return DeviceState(weights, slots), training_row(history) | {"validation_new_places": float(np.mean(~learnable))}


def training_row(history) -> dict:
    """Epochs and optimizer steps of one fit, in all and up to the epoch kept, and its best loss."""
    best = getattr(history, "best_epoch", None)
    best = len(history) if best is None else best
    return {
        "epochs": len(history),
        "best_epoch": best,
        "steps": int(sum(h["steps"] for h in history)),
        "steps_to_best": int(sum(h["steps"] for h in history[:best])),
        "best_validation_loss": min((h["validation_loss"] for h in history), default=float("nan")),
        "validation_new_places": float("nan"),
    }


def run_seed(params: CollaParams, devices: Devices, boot: Bootstrapped, rt: Runtime, seed: int, log=print) -> SeedRun:
    """One seed: bootstrapped cloud model, first pull, then every cycle for every method. A cycle's
    models see places known by its end only; they are tested on the next cycle's samples."""
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
        tests = {u: devices.samples(u, [cycle + 1], known_by=cycle) for u in devices.uids}
        base = {"seed": seed, "cycle": cycle}
        for method in ("DT", "DT-ws", "Colla"):
            for uid in devices.uids:
                x, y = devices.samples(uid, [cycle], known_by=cycle, places_only=True)
                trainer = rt.plain
                if method == "Colla":
                    pulled = out.boundary.down(uid, cloud.download(uid))
                    slots = common.grow(state[method][uid].weights, state[method][uid].slot_places, y)[1]
                    rt.teacher.assign(list(pulled.parameters), slots)
                    trainer = rt.distill
                columns = None if method == "DT" else pulled_columns
                label = f"{method}/{uid}/{cycle}"
                state[method][uid], fit = client_update(rt, trainer, state[method][uid], x, y, columns, seed, label)
                tx, ty = tests[uid]
                predicted = device_predictions(rt.device_model, state[method][uid], tx)
                out.rows.append(
                    {**base, "device": uid, "method": method, **scores(ty, predicted), "train_samples": len(x)}
                    | fit
                    | {"places_held": int((state[method][uid].slot_places >= 0).sum())}
                )
        # CT: the cloud trains the heavy model on every device's raw data so far (parts 0..cycle)
        pooled_x, pooled_y = devices.pooled(list(range(cycle + 1)), known_by=cycle)
        train, val = ct_split(p, devices, cycle, seed)
        ct_weights, history = common.fit_until_plateau(
            rt.ct, ct_weights, train, val, p, streams.rng(seed, f"ct/{cycle}"), p.ct_max_epochs, p.cloud_patience
        )
        for uid in devices.uids:
            tx, ty = tests[uid]
            predicted = np.argmax(common.logits(rt.cloud_model, tx), axis=-1)
            out.rows.append(
                {**base, "device": uid, "method": "CT", **scores(ty, predicted), "train_samples": len(pooled_y)}
                | training_row(history)
                | {"places_held": devices.places}
            )
        pooled = Markov(pooled_x[:, -1, 0], pooled_y)
        for uid in devices.uids:
            tx, ty = tests[uid]
            for method, predicted in baselines(devices, uid, cycle, pooled, tx).items():
                out.rows.append(
                    {**base, "device": uid, "method": method, **scores(ty, predicted), "train_samples": 0}
                    | training_row([])
                    | {"places_held": 0}
                )
        # Colla stage 4: every device pushes its model; the cloud updates and regroups
        uploads = [
            out.boundary.up(Upload(u, state["Colla"][u].weights, state["Colla"][u].slot_places)) for u in devices.uids
        ]
        out.groups.append(cloud.update(uploads, cycle).assign(seed=seed))
        out.ct_weights, out.ct_steps_to_best = ct_weights, training_row(history)["steps_to_best"]
        frame = pd.DataFrame([r for r in out.rows if r["cycle"] == cycle])
        medians = frame.groupby("method").accuracy.median()
        log(
            f"seed {seed} cycle {cycle}/{p.cycles}: median accuracy "
            + ", ".join(f"{m} {medians[m]:.3f}" for m in (*METHODS, *BASELINES))
            + f" ({time.perf_counter() - start:.1f}s)"
        )
    return out


def ct_split(params: CollaParams, devices: Devices, cycle: int, seed: int):
    """CT's (train, validation) of a cycle: every device's raw data so far, split at random."""
    x, y = devices.pooled(list(range(cycle + 1)), known_by=cycle)
    return common.split_random(x, y, params.validation_fraction, streams.rng(seed, f"ct/val/{cycle}"))


def last_period(devices: Devices) -> tuple[np.ndarray, np.ndarray]:
    """Every device's samples of the last test period, places known by the last cycle."""
    c = devices.data.rule.cycles
    taken = [devices.samples(u, [c + 1], known_by=c) for u in devices.uids]
    return np.concatenate([x for x, _ in taken]), np.concatenate([y for _, y in taken])


def baselines(devices: Devices, uid: str, cycle: int, pooled: Markov, tx: np.ndarray) -> dict[str, np.ndarray]:
    """Each baseline's predictions for test inputs `tx`: the last step's place, and the device's
    most frequent place and Markov table from its cycles 1..`cycle` (DT's data), and `pooled`."""
    x, y = devices.samples(uid, list(range(1, cycle + 1)), known_by=cycle, places_only=True)
    current = tx[:, -1, 0]
    return {
        CONTEXT: current,
        "most frequent place": np.full(len(tx), most_frequent(y)),
        MARKOV: Markov(x[:, -1, 0], y).predict(current) if len(y) else np.full(len(tx), -1),
        "Markov (pooled)": pooled.predict(current),
    }


def run_cycles(params: CollaParams, devices: Devices, boot: Bootstrapped, log=print) -> list[SeedRun]:
    rt = Runtime(params, devices)
    return [run_seed(params, devices, boot, rt, s, log) for s in params.seed_list]


def cycles_table(runs: list[SeedRun]) -> pd.DataFrame:
    """Per (seed, cycle, device, method): accuracy, precision, recall (aggregate metrics only)."""
    return pd.DataFrame([r for run in runs for r in run.rows])


def groups_table(runs: list[SeedRun]) -> pd.DataFrame:
    return pd.concat([g for run in runs for g in run.groups], ignore_index=True)
