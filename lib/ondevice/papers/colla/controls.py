"""Colla's known-answer controls: a neural model that can represent a first-order Markov table
and sees the table's data must reach the table's accuracy on the same test places.

(1) CT's M-RNN (a place embedding into a softmax over places can be the pooled table) against
the pooled Markov table; (2) the light device model on the devices with the most data against
each one's own table. Each is run twice: with the paper's inputs (six features over `history`
steps) and with the table's input only (the last step's place, every other id blanked), which
separates "training cannot reach the table" from "the extra inputs generalise worse than the
table". Both sides see the same training samples: the table is counted on exactly the part the
model takes gradient steps on (not its early-stopping part). Accuracy is pooled over the test
samples (every label counts once); a control passes when the model is at most `tolerance` below.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ondevice import streams
from ondevice.models import mrnn
from ondevice.models.markov import Markov
from ondevice.papers.colla import common, protocol
from ondevice.papers.colla.common import CollaParams, Devices
from ondevice.training.trainer import Trainer

INPUTS = ("paper's inputs", "last place only")


def last_place_only(x: np.ndarray) -> np.ndarray:
    """The samples with every id but the last step's place set to 0: a first-order table's input."""
    out = np.zeros_like(x)
    out[:, -1, 0] = x[:, -1, 0]
    return out


def with_inputs(x: np.ndarray, inputs: str) -> np.ndarray:
    return x if inputs == INPUTS[0] else last_place_only(x)


def verdict(model: float, markov: float, tolerance: float) -> str:
    return "passes" if model >= markov - tolerance else "fails"


def row(control: str, inputs: str, seed: int, model: float, markov: float, tolerance: float, **extra) -> dict:
    return {
        "control": control,
        "inputs": inputs,
        "seed": seed,
        "model accuracy": model,
        "Markov accuracy": markov,
        "model - Markov": model - markov,
        "tolerance": tolerance,
        "verdict": verdict(model, markov, tolerance),
        **extra,
    }


def pooled_accuracy(predicted: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(np.where(y == 0, False, predicted == y)))


def ct_control(params: CollaParams, devices: Devices, seed: int, inputs: str, ct_weights=None) -> dict:
    """CT's M-RNN on the last cycle's pooled data (`ct_weights`: the run's CT model, else one
    trained here from scratch by CT's procedure) against the pooled table on its training part."""
    p, c = params, params.cycles
    (tx, ty), val = protocol.ct_split(p, devices, c, seed)
    test_x, test_y = protocol.last_period(devices)
    model = mrnn.build(p.cloud_config(devices.places), streams.tf_seed(seed, "init/control/ct"))
    steps = 0
    if ct_weights is None:
        train = (with_inputs(tx, inputs), ty)
        val = (with_inputs(val[0], inputs), val[1])
        trainer = Trainer(model, common.location_task(p, devices.places), p.learning_rate)
        ct_weights, history = common.fit_until_plateau(
            trainer,
            model.get_weights(),
            train,
            val,
            p,
            streams.rng(seed, "control/ct"),
            p.ct_max_epochs,
            p.cloud_patience,
        )
        steps = int(sum(h["steps"] for h in history[: history.best_epoch]))
    model.set_weights(ct_weights)
    predicted = np.argmax(common.logits(model, with_inputs(test_x, inputs)), axis=-1)
    table = Markov(tx[:, -1, 0], ty).predict(test_x[:, -1, 0])
    return row(
        "(1) CT vs pooled Markov",
        inputs,
        seed,
        pooled_accuracy(predicted, test_y),
        pooled_accuracy(table, test_y),
        p.control_tolerance,
        devices=len(devices.uids),
        train_samples=len(ty),
        test_samples=len(test_y),
        steps_to_best=steps,
    )


def top_devices(params: CollaParams, devices: Devices) -> list[str]:
    """The `control_devices` devices with the most samples in cycles 1..cycles (ties by uid)."""
    parts = list(range(1, params.cycles + 1))
    n = {u: len(devices.samples(u, parts, params.cycles, places_only=True)[1]) for u in devices.uids}
    return sorted(devices.uids, key=lambda u: (-n[u], u))[: params.control_devices]


def device_control(params: CollaParams, devices: Devices, rt: protocol.Runtime, seed: int, inputs: str) -> dict:
    """DT's light model, fresh, trained by the client update on each top device's cycles 1..cycles
    and tested on the last period, against that device's table on the same training part."""
    p, c = params, params.cycles
    init = mrnn.build(p.device_config(devices.places), streams.tf_seed(seed, "init/device")).get_weights()
    init[-1] = np.zeros_like(init[-1])
    start = protocol.DeviceState(init, np.full(p.device_slots, -1, np.int64))
    model, table, labels, train_n, steps = [], [], [], [], []
    for uid in top_devices(p, devices):
        x, y = devices.samples(uid, list(range(1, c + 1)), known_by=c, places_only=True)
        test_x, test_y = devices.samples(uid, [c + 1], known_by=c)
        state, fit = protocol.client_update(
            rt, rt.plain, start, with_inputs(x, inputs), y, None, seed, f"control/{uid}"
        )
        model.append(protocol.device_predictions(rt.device_model, state, with_inputs(test_x, inputs)))
        (trained_x, trained_y), _ = common.split_latest(x, y, p.validation_fraction)
        table.append(Markov(trained_x[:, -1, 0], trained_y).predict(test_x[:, -1, 0]))
        labels.append(test_y)
        train_n.append(len(trained_y))
        steps.append(fit["steps_to_best"])
    y = np.concatenate(labels)
    return row(
        "(2) device model vs its Markov",
        inputs,
        seed,
        pooled_accuracy(np.concatenate(model), y),
        pooled_accuracy(np.concatenate(table), y),
        p.control_tolerance,
        devices=len(labels),
        train_samples=int(np.median(train_n)),
        test_samples=len(y),
        steps_to_best=int(np.median(steps)),
    )


def run_controls(params: CollaParams, devices: Devices, ct_models: dict, log=print) -> pd.DataFrame:
    """Both controls with both inputs: (1) with the paper's inputs is the run's own CT model (every
    seed); with the last place only, a CT model trained here (first seed: one heavy fit); (2) every
    seed, both inputs."""
    rt = protocol.Runtime(params, devices)
    rows = [ct_control(params, devices, s, INPUTS[0], ct_models[s]) for s in params.seed_list]
    rows.append(ct_control(params, devices, params.seed_list[0], INPUTS[1]))
    rows += [device_control(params, devices, rt, s, i) for s in params.seed_list for i in INPUTS]
    frame = pd.DataFrame(rows)
    for _, r in summary(frame).iterrows():
        log(
            f"control {r.control}, {r.inputs}: model {r['model accuracy']:.3f} "
            f"vs Markov {r['Markov accuracy']:.3f} ({r.verdict})"
        )
    return frame


def summary(controls: pd.DataFrame) -> pd.DataFrame:
    """Per control and inputs: the means over seeds and the verdict of the means."""
    mean = (
        controls.groupby(["control", "inputs"], sort=False)[["model accuracy", "Markov accuracy", "tolerance"]]
        .mean()
        .reset_index()
    )
    mean["seeds"] = controls.groupby(["control", "inputs"], sort=False).size().to_numpy()
    mean["verdict"] = [
        verdict(m, k, t) for m, k, t in zip(mean["model accuracy"], mean["Markov accuracy"], mean.tolerance)
    ]
    return mean[["control", "inputs", "model accuracy", "Markov accuracy", "tolerance", "seeds", "verdict"]]
