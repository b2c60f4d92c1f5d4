"""When AutLearn's phones may train (autlearn_availability): a device-state trace (synthetic in
FLASH's format, or FLASH's or FedScale's file), the minutes per day of each condition, when
personalization trained in a device's windows finishes, and the check that training interrupted at
window edges resumes exactly through the trainable TFLite file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import tf_keras as keras

from ondevice import streams
from ondevice.data import device_traces, manifests
from ondevice.data.device_traces import AUTONOMOUS, CHARGING, FEDERATED, DeviceWindows
from ondevice.device import availability as av

SYNTHETIC = (
    "a synthetic device-state trace in FLASH's format, generated from a documented model "
    "(ondevice.data.device_traces.SyntheticModel), stands in for the usage traces of about 1,500 "
    "users that AutLearn collected (not public)"
)


@dataclass
class Trace:
    """The devices of the trace, where it came from, and the data entry run.json records."""

    devices: list[DeviceWindows]
    source: str
    synthetic: bool
    conditions: tuple[str, ...]
    data: dict
    dropped: int

    def table(self) -> pd.DataFrame:
        days = np.array([d.days for d in self.devices])
        models = pd.Series([d.model for d in self.devices]).value_counts()
        row = {"trace": self.source, "synthetic": self.synthetic, "devices": len(self.devices)}
        row |= {
            "left out (shorter than min_trace_hours)": self.dropped,
            "median days per device": float(np.median(days)),
        }
        row |= {
            "conditions": ", ".join(self.conditions),
            "phone models": ", ".join(f"{m} ({n})" for m, n in models.items()),
        }
        return pd.DataFrame([row])


def load_trace(params, log=print) -> Trace:
    """The synthetic trace (generated, written and read back through the FLASH reader, as a real
    trace would be), or the given FLASH / FedScale file; devices shorter than `min_trace_hours`
    are left out."""
    if params.trace_source == "synthetic":
        rng = streams.rng(params.seed, "availability/trace")
        doc = device_traces.synthetic_flash(
            params.trace_devices, params.trace_days, rng, params.trace, params.trace_start
        )
        blob = json.dumps(doc, sort_keys=True).encode()
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "state_traces.json"
            path.write_bytes(blob)
            devices = device_traces.read_flash(path, params.idle_rule)
        file = {"file": "state_traces.json (generated, not saved)", "sha256": hashlib.sha256(blob).hexdigest()}
        data = {"name": "synthetic device-state trace (FLASH format)", "license": "generated here"}
        data |= {"stand_in_for": SYNTHETIC, "artifacts": [file | {"size": len(blob)}]}
        source, synthetic = "synthetic (FLASH format)", True
    else:
        name = {"flash": "flash_traces", "fedscale": "fedscale_traces"}[params.trace_source]
        path = Path(params.trace_file) if params.trace_file else manifests.resolve(name, "trace")
        flash = params.trace_source == "flash"
        devices = device_traces.read_flash(path, params.idle_rule) if flash else device_traces.read_fedscale(path)
        file = {"file": str(path), "sha256": manifests.sha256_of(path), "size": path.stat().st_size}
        data = {"name": name, "license": manifests.load(name).license, "stand_in_for": None, "artifacts": [file]}
        source, synthetic = f"{params.trace_source}: {path.name}", False
    kept = [d for d in devices if d.days * 24 >= params.min_trace_hours]
    if len(kept) < 2:
        raise ValueError(f"only {len(kept)} device(s) of the trace span at least {params.min_trace_hours} h")
    conditions = tuple(c for c in (AUTONOMOUS, FEDERATED, CHARGING) if c in kept[0].windows)
    dropped = len(devices) - len(kept)
    log(f"trace: {source}, {len(kept)} devices kept, {dropped} shorter than {params.min_trace_hours:g} h")
    return Trace(kept, source, synthetic, conditions, data, dropped)


def minutes_per_day(trace: Trace) -> pd.DataFrame:
    """Minutes per day in each condition, one row per device and condition."""
    rows = [
        {"device": d.device, "model": d.model, "days": d.days, "condition": c, "minutes_per_day": d.minutes_per_day(c)}
        for d in trace.devices
        for c in trace.conditions
    ]
    return pd.DataFrame(rows)


HABIT_SECTION = "Why federated learning gets the share of minutes it gets"


def wifi_sweep(params, home_wifi=(0.2, 0.4, 0.6, 0.8, 1.0)) -> pd.DataFrame:
    """The synthetic trace generated again at each share of devices with home Wi-Fi (every other
    habit and the seed unchanged): both conditions' median minutes per day and the claim's change
    (relative change of the medians). Federated learning also needs Wi-Fi, so this habit, an
    assumption of the synthetic model and not fitted to data, sets how far apart the two are.
    Empty for a real trace."""
    if params.trace_source != "synthetic":
        return pd.DataFrame()
    rows = []
    for share in home_wifi:
        habits = dataclasses.replace(params.trace, home_wifi=share)
        minutes = minutes_per_day(load_trace(dataclasses.replace(params, trace=habits), log=lambda *_: None))
        median = minutes.groupby("condition").minutes_per_day.median()
        row = {"home_wifi": share, "used": share == params.trace.home_wifi}
        row |= {f"median minutes, {c}": float(median[c]) for c in (AUTONOMOUS, FEDERATED)}
        rows.append(row | {"change": float(median[AUTONOMOUS] / median[FEDERATED] - 1)})
    return pd.DataFrame(rows)


def wifi_diagnosis(sweep: pd.DataFrame) -> str:
    """The claim's change at each home Wi-Fi share, in one line."""
    at = ", ".join(f"{r.home_wifi:g}: {r.change:+.0%}" for r in sweep.itertuples())
    ours = sweep[sweep.used].home_wifi.iloc[0]
    return (
        f"a habit of the synthetic trace sets it, the share of phones with home Wi-Fi (ours {ours:g}); change at {at}"
    )


def finish_within_day(params, trace: Trace, phone_times: pd.DataFrame) -> pd.DataFrame:
    """Per device, condition, variant and epochs: the share of start hours (the model arrives at
    each of `start_hours` on the device's first day) from which personalization, trained in the
    device's windows of the condition, finishes within `horizon_hours`, and the median hours to
    finish (inf: not within the trace). Each device trains the phone times of its phone and of a
    user drawn for it; variants other than `params.variant` only at `personal_epochs`."""
    users = sorted(phone_times.user.unique())
    pick = streams.rng(params.seed, "availability/users").integers(0, len(users), len(trace.devices))
    need = phone_times.set_index(["user", "phone", "variant"])
    rows = []
    for d, i in zip(trace.devices, pick):
        phone, user = av.phone_of(d.model, params.unknown_phone), users[i]
        midnight = math.floor(d.start / device_traces.DAY) * device_traces.DAY
        starts = np.maximum(d.start, midnight + 3600.0 * np.array(params.start_hours))
        for condition in trace.conditions:
            for variant in phone_times.variant.unique():
                r = need.loc[(user, phone, variant)]
                for epochs in params.epochs_grid:
                    if variant != params.variant and epochs != params.personal_epochs:
                        continue
                    work = r.phone_minutes_per_epoch * 60 * epochs
                    windows = d.windows[condition]
                    seconds = av.finish_seconds(windows, starts, work, r.phone_step_seconds, params.window_overhead_s)
                    hours = seconds / 3600
                    row = dict(device=d.device, phone=phone, user=user, condition=condition, variant=variant)
                    row |= dict(epochs=epochs, training_minutes_needed=r.phone_minutes_per_epoch * epochs)
                    row |= dict(share_within_horizon=float(np.mean(hours <= params.horizon_hours)))
                    rows.append(row | dict(median_hours_to_finish=float(np.median(hours))))
    return pd.DataFrame(rows)


def resume_table(flatbuffer: bytes, task, model: keras.Model, batches: list, schedule, optimizer: str, log=print):
    """Train `batches` through the trainable TFLite file once without interruption and once
    interrupted at the window edges of `schedule` (a fresh interpreter per window, `restore` then
    `save`), both from `model`'s weights; the largest weight and loss differences, beside the
    largest weight change in training for scale."""
    n, start = sum(schedule), model.get_weights()
    with tempfile.TemporaryDirectory() as tmp:
        whole = av.train_across_windows(flatbuffer, task, batches, [n], Path(tmp) / "whole.ckpt")
        parts = av.train_across_windows(flatbuffer, task, batches, list(schedule), Path(tmp) / "parts.ckpt")
        a, b = (av.checkpoint_weights(Path(tmp) / f"{name}.ckpt", model) for name in ("whole", "parts"))
    diff = max(float(np.abs(x - y).max()) for x, y in zip(a, b))
    moved = max(float(np.abs(x - s).max()) for x, s in zip(a, start))
    scale = "scale (max |weight change| in training)"
    weights = (
        f"weights: interrupted ({'+'.join(map(str, schedule))} steps) vs uninterrupted ({n} steps), max |difference|"
    )
    losses = float(np.max(np.abs(np.array(whole) - np.array(parts))))
    rows = [{"check": weights, "value": diff, scale: moved}]
    rows.append({"check": "losses of the same steps, max |difference|", "value": losses, scale: float("nan")})
    table = pd.DataFrame(rows)
    table["passed"] = table.value <= 1e-6
    log(f"interrupted vs uninterrupted training: max weight difference {diff:.1e} ({optimizer})")
    return table
