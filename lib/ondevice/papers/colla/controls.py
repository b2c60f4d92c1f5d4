"""Colla's known-answer controls, the choice of inputs they lead to, and the data-scale probe.

A neural model that can represent a first-order Markov table and sees the table's data must
reach the table's accuracy on the same test places. (1) CT's M-RNN (a place embedding into a
softmax over places can be the pooled table) against the pooled Markov table; (2) the light
device model on the devices with the most data against each one's own table. Each runs with the
paper's inputs (six features over `history` steps) and with the table's input only (the last
step's place, every other id 0), which separates "training cannot reach the table" from "the
extra inputs generalise worse than the table". Both sides see the same training samples: the
table is counted on exactly the part the model takes gradient steps on. Accuracy is pooled over
the test samples (every label counts once); a control passes when the model is at most
`tolerance` below the table.

`input_choice` picks, on held-out *training* data (never a test period), how the M-RNN is
regularized with the paper's inputs and whether the models read them (they do unless their
held-out control fails); `data_scale` measures control (1)'s gap against the amount of pooled
training data.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from ondevice import streams
from ondevice.models import mrnn
from ondevice.models.markov import Markov
from ondevice.papers.colla import common, protocol
from ondevice.papers.colla.common import INPUTS, CollaParams, Devices

SCALE_FRACTIONS = (0.25, 0.5, 1.0)  # shares of CT's pooled training data in `data_scale`


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


def reading(params: CollaParams, devices: Devices, inputs: str) -> tuple[CollaParams, Devices]:
    """The parameters and the devices' view of models that read `inputs` (with the regularization
    that applies to them, `CollaParams.regularized`)."""
    return dataclasses.replace(params, inputs=inputs), dataclasses.replace(devices, inputs=inputs)


def fit_ct(params: CollaParams, devices: Devices, train, val, seed: int, purpose: str):
    """CT's M-RNN from scratch by CT's procedure (Adam at `learning_rate`, the paper's stopping on
    `val`, the regularization of `params`): its weights and the optimizer steps up to the weights kept."""
    model = params.model(params.cloud_config(devices.places), streams.tf_seed(seed, "init/control/ct"))
    trainer = params.trainer(model, common.location_task(params, devices.places), params.learning_rate)
    weights, history = common.fit_until_plateau(
        trainer,
        model.get_weights(),
        train,
        val,
        params,
        streams.rng(seed, purpose),
        params.ct_max_epochs,
        params.cloud_patience,
    )
    return model, weights, int(sum(h["steps"] for h in history[: history.best_epoch]))


def ct_control(params: CollaParams, devices: Devices, seed: int, run_ct: tuple | None = None) -> dict:
    """CT's M-RNN on the last cycle's pooled data (`run_ct`: the run's CT weights and steps, else
    one trained here from scratch by CT's procedure) against the pooled table on its training part.
    `devices.inputs` says what the model reads."""
    p = params
    (tx, ty), val = protocol.ct_split(p, devices, p.cycles, seed)
    test_x, test_y = protocol.last_period(devices)
    if run_ct is None:
        model, weights, steps = fit_ct(p, devices, (tx, ty), val, seed, "control/ct")
    else:
        model, (weights, steps) = mrnn.build(p.cloud_config(devices.places), 0), run_ct
    model.set_weights(weights)
    predicted = np.argmax(common.logits(model, test_x), axis=-1)
    table = Markov(tx[:, -1, 0], ty).predict(test_x[:, -1, 0])
    return row(
        "(1) CT vs pooled Markov",
        devices.inputs,
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


def device_control(params: CollaParams, devices: Devices, rt: protocol.Runtime, seed: int, holdout: bool = False):
    """DT's light model, fresh, trained by the client update on each top device's cycles 1..cycles
    and tested on the last period, against that device's table on the same training part (the
    client update's own split). With `holdout`, no test period is read: the latest fifth of the
    cycles' data is the test, and the rest what the model and the table learn from."""
    p, c = params, params.cycles
    init = mrnn.build(p.device_config(devices.places), streams.tf_seed(seed, "init/device")).get_weights()
    init[-1] = np.zeros_like(init[-1])
    start = protocol.DeviceState(init, np.full(p.device_slots, -1, np.int64))
    model, table, labels, train_n, steps = [], [], [], [], []
    for uid in top_devices(p, devices):
        x, y = devices.samples(uid, list(range(1, c + 1)), known_by=c, places_only=True)
        if holdout:
            (x, y), (test_x, test_y) = common.split_latest(x, y, p.validation_fraction)
        else:
            test_x, test_y = devices.samples(uid, [c + 1], known_by=c)
        state, fit = protocol.client_update(rt, rt.plain, start, x, y, None, seed, f"control/{uid}")
        keep = common.to_slots(state.slot_places, y)
        (trained_x, trained_slots), _ = common.client_split(p, x[keep >= 0], keep[keep >= 0], seed, f"control/{uid}")
        model.append(protocol.device_predictions(rt.device_model, state, test_x))
        table.append(state.slot_places[Markov(trained_x[:, -1, 0], trained_slots).predict(test_x[:, -1, 0])])
        labels.append(test_y)
        train_n.append(len(trained_slots))
        steps.append(fit["steps_to_best"])
    y = np.concatenate(labels)
    return row(
        "(2) device model vs its Markov",
        devices.inputs,
        seed,
        pooled_accuracy(np.concatenate(model), y),
        pooled_accuracy(np.concatenate(table), y),
        p.control_tolerance,
        devices=len(labels),
        train_samples=int(np.median(train_n)),
        test_samples=len(y),
        steps_to_best=int(np.median(steps)),
    )


def setting_choice(params: CollaParams, devices: Devices, log=print) -> pd.DataFrame:
    """The client update's rate (`rate_grid`, the paper's 0.1 included) and reading of the paper's
    stopping rule (`common.CLIENT_SPLITS` x `CLIENT_MONITORS`), chosen together on held-out training
    data: control (2) with `holdout` (no test period is read), every seed, for each triple. They are
    chosen together because each changes the other's best value (a rate chosen under one stopping
    reading was not the best under another). The rule, fixed before the default run: the triple whose
    model is most accurate on the held-out fifth (mean over seeds); ties go to the earlier in grid
    order (smaller rate, then latest fifth, then loss)."""
    view, rows = dataclasses.replace(devices, inputs=params.inputs), []
    for rate in params.rate_grid:
        for split in common.CLIENT_SPLITS:
            for monitor in common.CLIENT_MONITORS:
                p = dataclasses.replace(params, device_learning_rate=rate, client_split=split, client_monitor=monitor)
                rt = protocol.Runtime(p, view)
                setting = {"rate": rate, "split": split, "monitor": monitor}
                rows += [device_control(p, view, rt, s, holdout=True) | setting for s in params.seed_list]
                mean = np.mean([r["model accuracy"] for r in rows[-len(params.seed_list) :]])
                table = rows[-1]["Markov accuracy"]
                log(
                    f"client setting: rate {rate:g}, {split} fifth, {monitor}: held-out accuracy {mean:.3f} "
                    f"(table {table:.3f})"
                )
    return pd.DataFrame(rows)


SETTING = ["rate", "split", "monitor"]


def chosen_setting(choice: pd.DataFrame) -> tuple[float, str, str]:
    """The rule of `setting_choice`: (rate, split, monitor) with the highest mean held-out accuracy."""
    means = choice.groupby(SETTING, sort=False)["model accuracy"].mean()
    rate, split, monitor = means.index[int(np.argmax(means.to_numpy()))]
    return float(rate), split, monitor


def run_controls(params: CollaParams, devices: Devices, run_ct: dict, log=print) -> pd.DataFrame:
    """Both controls with both inputs: (1) with the run's inputs is the run's own CT model (every
    seed, `run_ct`: seed -> (weights, steps to best)); with the other inputs a CT model trained here
    (first seed: one heavy fit); (2) every seed, both inputs."""
    views = {i: reading(params, devices, i) for i in INPUTS}
    runtimes = {i: protocol.Runtime(*views[i]) for i in INPUTS}
    rows = [ct_control(*views[params.inputs], s, run_ct[s]) for s in params.seed_list]
    rows += [ct_control(*views[i], params.seed_list[0]) for i in INPUTS if i != params.inputs]
    rows += [device_control(*views[i], runtimes[i], s) for s in params.seed_list for i in INPUTS]
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
    mean["rule (fixed before the run)"] = "passes when the model is at most the tolerance below the table"
    columns = ["control", "inputs", "model accuracy", "Markov accuracy", "tolerance", "seeds", "verdict"]
    return mean[[*columns, "rule (fixed before the run)"]]


def held_out_split(params: CollaParams, devices: Devices):
    """Every device's training data of the last cycle (parts 0..cycles, no test period), its latest
    `validation_fraction` held out: (train, held-out), pooled over devices."""
    parts = list(range(params.cycles + 1))
    split = [
        common.split_latest(*devices.samples(u, parts, params.cycles, places_only=True), params.validation_fraction)
        for u in devices.uids
    ]
    return tuple(tuple(np.concatenate([s[k][j] for s in split]) for j in range(2)) for k in range(2))


def input_choice(params: CollaParams, devices: Devices, log=print) -> pd.DataFrame:
    """What every model reads and how the M-RNN is regularized with the paper's inputs, chosen on
    held-out training data only. CT's M-RNN from scratch (seed `params.seed`) trains by CT's
    procedure on every device's parts 0..cycles but its latest fifth, stopping on that fifth: with
    the paper's inputs at every pair of `feature_dropout_grid` x `weight_decay_grid`, and with the
    last place only (unregularized). One row each, with the pooled table's accuracy on the same
    held-out fifth (control (1) on held-out data). The rules are `chosen_regularization` and
    `chosen_inputs`."""
    rows, pairs = [], [(d, w) for d in params.feature_dropout_grid for w in params.weight_decay_grid]
    for inputs, (dropout, decay) in [*((INPUTS[0], pair) for pair in pairs), (INPUTS[1], (0.0, 0.0))]:
        p, view = reading(dataclasses.replace(params, feature_dropout=dropout, weight_decay=decay), devices, inputs)
        (tx, ty), (vx, vy) = held_out_split(p, view)
        model, weights, steps = fit_ct(p, view, (tx, ty), (vx, vy), p.seed, "inputs/ct")
        model.set_weights(weights)
        accuracy = pooled_accuracy(np.argmax(common.logits(model, vx), axis=-1), vy)
        markov = pooled_accuracy(Markov(tx[:, -1, 0], ty).predict(vx[:, -1, 0]), vy)
        rows.append(
            {
                "inputs": inputs,
                "feature_dropout": dropout,
                "weight_decay": decay,
                "held-out accuracy": accuracy,
                "held-out loss": common.mean_cross_entropy(model, vx, vy),
                "Markov held-out accuracy": markov,
                "train_samples": len(ty),
                "held_out_samples": len(vy),
                "steps_to_best": steps,
            }
        )
        log(
            f"inputs {inputs}, feature dropout {dropout:g}, weight decay {decay:g}: held-out accuracy "
            f"{accuracy:.3f} (pooled Markov {markov:.3f}), {steps} steps to best"
        )
    return pd.DataFrame(rows)


def chosen_regularization(choice: pd.DataFrame) -> tuple[float, float]:
    """The rule for the paper's inputs (fixed before the default run): the (feature dropout, weight
    decay) pair with the highest held-out accuracy; ties to the earlier in grid order (less dropout,
    then less decay)."""
    paper = choice[choice.inputs == INPUTS[0]]
    best = paper.iloc[int(np.argmax(paper["held-out accuracy"].to_numpy()))]
    return float(best.feature_dropout), float(best.weight_decay)


def chosen_inputs(choice: pd.DataFrame, tolerance: float) -> str:
    """The rule for the inputs (fixed before the default run): the paper's, at the chosen
    regularization, unless their held-out control fails (CT more than `tolerance` below the pooled
    table on the held-out fifth); then the last place only, the table's own input."""
    dropout, decay = chosen_regularization(choice)
    paper = choice[(choice.inputs == INPUTS[0]) & (choice.feature_dropout == dropout) & (choice.weight_decay == decay)]
    row = paper.iloc[0]
    return (
        INPUTS[0]
        if verdict(row["held-out accuracy"], row["Markov held-out accuracy"], tolerance) == "passes"
        else INPUTS[1]
    )


def data_scale(params: CollaParams, devices: Devices, log=print) -> pd.DataFrame:
    """Control (1) against the amount of pooled training data: for each share of SCALE_FRACTIONS, CT
    from scratch (first seed) on that random share of the last cycle's CT training and validation
    samples, with each inputs, against the pooled table counted on the same share."""
    seed, rows = params.seed_list[0], []
    for inputs in INPUTS:
        p, view = reading(params, devices, inputs)
        (tx, ty), (vx, vy) = protocol.ct_split(p, view, p.cycles, seed)
        test_x, test_y = protocol.last_period(view)
        for share in SCALE_FRACTIONS:
            rng = streams.rng(seed, f"scale/{share}")
            t = rng.permutation(len(ty))[: max(2, int(round(share * len(ty))))]
            v = rng.permutation(len(vy))[: max(1, int(round(share * len(vy))))]
            model, weights, steps = fit_ct(p, view, (tx[t], ty[t]), (vx[v], vy[v]), seed, f"scale/ct/{share}")
            model.set_weights(weights)
            accuracy = pooled_accuracy(np.argmax(common.logits(model, test_x), axis=-1), test_y)
            markov = pooled_accuracy(Markov(tx[t][:, -1, 0], ty[t]).predict(test_x[:, -1, 0]), test_y)
            rows.append(
                {
                    "inputs": inputs,
                    "share of pooled data": share,
                    "train_samples": len(t),
                    "model accuracy": accuracy,
                    "Markov accuracy": markov,
                    "model - Markov": accuracy - markov,
                    "steps_to_best": steps,
                }
            )
            log(f"data scale {share:.2f}, {inputs}: CT {accuracy:.3f} vs Markov {markov:.3f}")
    return pd.DataFrame(rows)
