"""Colla C5 (Sec. 5.4): what a model update costs a device under the three update approaches.

- Same-Whole: every device has the same small model (FC over every place) and trains all of it;
- Same-FC: the same model, only the FC layer trains;
- Customization: the device's FC covers only its places (grows with them) and only it trains.

Uploaded parameters per update and inference FLOPs are counted per device and cycle (the FC's
size follows the device's places); training time is measured: steady-state seconds per step
(median after warm-up) x steps, the three approaches back to back on the same devices, the same
data and the same number of steps, reported as ratios within this run. The device model of
Colla's client update (customised FC, dual distillation with the pulled cloud model inside the
step) is exported as a trainable TFLite file and trained through the interpreter beside TensorFlow.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ondevice import streams
from ondevice.device import parity
from ondevice.models import mrnn
from ondevice.papers.colla import common, fc_share
from ondevice.papers.colla.common import Bootstrapped, CollaParams, Devices, bootstrap, load_devices
from ondevice.papers.colla.report import COST_APPROACHES as APPROACHES
from ondevice.papers.colla.techniques.distillation import CloudTeacher, DistillationHook
from ondevice.params import presets
from ondevice.report import claims, facts, record
from ondevice.report.conclusion import Conclusion
from ondevice.training.fine_tune import FineTune
from ondevice.training.trainer import StepTimer, Trainer

NAME = "colla_cost"

PAPER = facts.paper(NAME)  # Sec. 5.4 and Fig. 11-12 (model 4-16)
# Timing claims judged apart (not bit-reproducible): better = Same-Whole's time, worse = the other's.
PAPER_TIME = facts.paper(NAME, "time")
_TIMING_COLUMNS = {
    "our change": "our change (training time)",
    "ci low": "ci low (training time)",
    "ci high": "ci high (training time)",
    "users improved": "devices faster (training time)",
    "users worse": "devices slower (training time)",
    "sign test p": "sign test p (training time)",
    "verdict": "verdict (training time)",
}


OWN_PRESETS = {
    "smoke": dict(timing_devices=3, timing_epochs=4, warmup_steps=2, tflite_check_steps=3, bootstrap=300),
    "default": dict(timing_devices=8, timing_epochs=6),
    "paper": dict(timing_devices=20, timing_epochs=10),
}


@dataclass(frozen=True)
class Params(CollaParams):
    timing_devices: int = 8  # devices whose cycle-1 update is timed under each approach
    timing_epochs: int = 4  # epochs per timed update (the same steps for every approach)
    warmup_steps: int = 5  # steps excluded from the steady-state step time
    tflite_check_steps: int = 5  # client-update steps run both in TF and through the TFLite interpreter
    bootstrap: int = 2000

    PRESETS = presets(common.SHARED_PRESETS, OWN_PRESETS)

    def check(self) -> None:
        super().check()
        for name in ("timing_devices", "timing_epochs"):
            self.require(getattr(self, name) >= 1, name, "must be at least 1")
        self.require(self.warmup_steps >= 0, "warmup_steps", "must be >= 0")
        self.require(self.tflite_check_steps >= 0, "tflite_check_steps", "must be >= 0 (0 = skip)")
        self.require(self.bootstrap >= 100, "bootstrap", "must be at least 100 resamples")


def places_per_cycle(params: Params, devices: Devices) -> pd.DataFrame:
    """Per device and cycle: the places its customised FC holds after that cycle's data."""
    rows = []
    for uid in devices.uids:
        seen: set[int] = set()
        for cycle in range(1, params.cycles + 1):
            seen |= set(devices.samples(uid, [cycle], known_by=cycle, places_only=True)[1].tolist())
            rows.append({"device": uid, "cycle": cycle, "places_held": min(len(seen), params.device_slots)})
    return pd.DataFrame(rows)


def counted_costs(params: Params, devices: Devices) -> pd.DataFrame:
    """Per device and cycle (Fig. 11b, c): parameters uploaded after an update and FLOPs of one
    prediction, per approach. Same-* upload all parameters or the FC over every place; a
    customised device uploads its FC rows only."""
    same = params.device_config(devices.places, customised=False)
    whole, fc = mrnn.parameter_count(same)["total"], mrnn.parameter_count(same)["fc"]
    rows = []
    for r in places_per_cycle(params, devices).itertuples():
        rows.append(
            {
                "device": r.device,
                "cycle": r.cycle,
                "places_held": r.places_held,
                "upload Same-Whole": whole,
                "upload Same-FC": fc,
                "upload Customization": mrnn.parameter_count(same, r.places_held)["fc"],
                "flops Same": mrnn.inference_flops(same),
                "flops Customization": mrnn.inference_flops(same, r.places_held),
            }
        )
    return pd.DataFrame(rows)


def _timed_update(trainer: Trainer, weights, data, params: Params, rng) -> tuple[int, float]:
    trainer.reset(weights)
    trainer.timer = StepTimer(params.warmup_steps)
    history = trainer.fit(data, params.timing_epochs, params.batch_size, rng)
    return sum(h["steps"] for h in history), trainer.timer.steady()


def training_times(params: Params, devices: Devices, boot: Bootstrapped, log=print) -> pd.DataFrame:
    """Each timed device's cycle-1 update from the first pull under the three approaches, back
    to back: steps, steady seconds per step and their product (local fine-tuning on hard labels,
    the same batches for every approach)."""
    p, seed = params, params.seed
    pull = boot.pull[seed].weights
    same_model = mrnn.build(p.device_config(devices.places, customised=False), 0)
    custom_model = mrnn.build(p.device_config(devices.places), 0)
    trainers = {
        "Same-Whole": Trainer(same_model, common.location_task(p, devices.places), p.device_learning_rate),
        "Same-FC": Trainer(
            same_model, common.location_task(p, devices.places), p.device_learning_rate, hooks=[FineTune("fc")]
        ),
        "Customization": Trainer(
            custom_model, common.location_task(p, p.device_slots), p.device_learning_rate, hooks=[FineTune("fc")]
        ),
    }
    template = custom_model.get_weights()
    rows = []
    for uid in devices.uids[: p.timing_devices]:
        x, y = devices.samples(uid, [1], known_by=1, places_only=True)
        custom, slots = common.grow(
            common.customise(pull, template), np.full(p.device_slots, -1), y, (pull[-2], pull[-1])
        )
        data = {
            "Same-Whole": (pull, (x, y)),
            "Same-FC": (pull, (x, y)),
            "Customization": (custom, (x, common.to_slots(slots, y))),
        }
        for approach in APPROACHES:
            weights, d = data[approach]
            steps, step_s = _timed_update(trainers[approach], weights, d, p, streams.rng(seed, f"timing/{uid}"))
            rows.append(
                {
                    "device": uid,
                    "approach": approach,
                    "samples": len(x),
                    "steps": steps,
                    "steady_step_seconds": step_s,
                    "train_time_seconds": step_s * steps,
                }
            )
        log(f"timed device {uid}: " + ", ".join(f"{r['approach']} ({r['train_time_seconds']:.1f}s)" for r in rows[-3:]))
    return pd.DataFrame(rows)


def on_device(params: Params, devices: Devices, boot: Bootstrapped, log=print):
    """Colla's client update exported as a trainable TFLite file (customised FC, dual distillation
    with the pulled cloud model inside the step) and trained through the interpreter beside
    TensorFlow, on the first device's first batches of cycle 1."""
    if not params.tflite_check_steps:
        return None, None
    p, seed = params, params.seed
    pull = boot.pull[seed].weights
    model = mrnn.build(p.device_config(devices.places), 0)
    x, y = devices.samples(devices.uids[0], [1], known_by=1, places_only=True)
    weights, slots = common.grow(
        common.customise(pull, model.get_weights()), np.full(p.device_slots, -1), y, (pull[-2], pull[-1])
    )
    model.set_weights(weights)
    teacher = CloudTeacher(mrnn.build(p.cloud_config(devices.places), 0), p.device_slots)
    teacher.assign(boot.cloud[seed].weights, slots)
    task = common.location_task(p, p.device_slots)
    batches = list(task.batches((x, common.to_slots(slots, y)), p.batch_size, streams.rng(seed, "diagnostics/tflite")))
    return parity.parity_table(
        model,
        task,
        p.device_learning_rate,
        batches[: p.tflite_check_steps],
        hooks=[DistillationHook(teacher, p.lam)],
        log=log,
        label="Colla's client update",
    )


def _per_device(costs: pd.DataFrame, column: str) -> np.ndarray:
    return costs[costs.cycle == costs.cycle.max()].sort_values("device")[column].to_numpy(float)[None, :]


def conclude(
    params: Params,
    devices: Devices,
    boot: Bootstrapped,
    costs: pd.DataFrame,
    times: pd.DataFrame,
    on_device_table,
    flatbuffer,
    wall_time_s: float,
) -> record.Result:
    last = costs[costs.cycle == costs.cycle.max()]
    flops_ratio = last["flops Customization"] / last["flops Same"]
    c = Conclusion(NAME, params, PAPER)
    uploads = ("Same-Whole", "Same-FC", "Customization")
    c.headlines({f"parameters uploaded per update, {a}": [last[f"upload {a}"].median()] for a in uploads})
    c.headlines(
        {
            "inference FLOPs, Same (relative)": [1.0],
            "inference FLOPs, Customization (relative to Same)": [flops_ratio.median()],
        }
    )
    pairs = {
        "Same-FC uploads fewer parameters than Same-Whole": ("upload Same-Whole", "upload Same-FC"),
        "Customization needs fewer inference FLOPs than Same": ("flops Same", "flops Customization"),
    }
    measured = {claim: (_per_device(costs, b), _per_device(costs, w)) for claim, (b, w) in pairs.items()}
    share = fc_share.curve(params, devices.places, costs)
    rng, notes = streams.rng(params.seed, "bootstrap"), {PAPER.effects[1].claim: fc_share.diagnosis(share)}
    c.effects(measured, rng, n_boot=params.bootstrap, diagnoses=notes)
    c.paper_vs_ours()
    wide = times.pivot(index="device", columns="approach", values="train_time_seconds")
    timed = {f"{a} trains faster than Same-Whole": a for a in ("Customization", "Same-FC")}
    per_approach = {
        claim: (wide["Same-Whole"].to_numpy()[None], wide[a].to_numpy()[None]) for claim, a in timed.items()
    }
    timing_effects = claims.effects_table(
        PAPER_TIME, per_approach, streams.rng(params.seed, "bootstrap/time"), n_boot=params.bootstrap
    ).rename(columns=_TIMING_COLUMNS)
    ratios = {a: float(np.median(wide[a] / wide["Same-Whole"])) for a in APPROACHES}
    time_table = pd.DataFrame(
        [
            {
                "approach": a,
                "median train time seconds": float(wide[a].median()),
                "time ratio to Same-Whole": ratios[a],
                "paper time ratio to Same-Whole": {"Same-Whole": 1.0, "Same-FC": None, "Customization": 0.1}[a],
            }
            for a in APPROACHES
        ]
    )
    tables = {
        "data": devices.table(),
        "costs": costs,
        "fc_share": share,
        "training_time": times,
        "time_ratios": time_table,
        "timing_effects": timing_effects,
        "bootstrap_training": boot.history(),
        "model_cache": boot.cache(),
    }
    if on_device_table is not None:
        tables["on_device"] = on_device_table
    return c.result(
        tables,
        [devices.summary()],
        None,
        wall_time_s,
        models={"colla_client_update_trainable.tflite": flatbuffer} if flatbuffer else {},
        devices=len(devices.uids),
        places=devices.places,
        timed_devices=int(times.device.nunique()),
        **{"time_ratio_to_same_whole (volatile)": ratios},
        tflite_max_output_difference=float(on_device_table.max_output_difference_after.iloc[0])
        if on_device_table is not None
        else None,
    )


def run(params: Params, log=print) -> record.Result:
    start = time.perf_counter()
    devices = load_devices(params, log)
    boot = bootstrap(params, devices, log)
    costs = counted_costs(params, devices)
    times = training_times(params, devices, boot, log)
    table, flatbuffer = on_device(params, devices, boot, log)
    return conclude(params, devices, boot, costs, times, table, flatbuffer, time.perf_counter() - start)
