"""AutLearn A7 (Sec. 2, Fig. 2, and Sec. 5 after Fig. 8): how many minutes a day may a phone train,
and does on-device personalization finish within a day?

AutLearn trains only while a phone is charging with its screen off ("autonomous"); federated
learning also needs Wi-Fi. From device-state traces we count, per device, the minutes per day
of each condition (the paper: medians 120 and 60 minutes over about 1,500 users). Then the
paper's question: with the training time a user's personalization needs on a phone, and these
windows, what share of devices finish within 24 hours?

- Trace: FLASH's `state_traces.json` or FedScale's `client_behave_trace` when a file is given
  (`trace_file`; both are declared in data_manifests/ but not available offline); otherwise, and
  at every scale by default, a synthetic trace in FLASH's format from a documented model
  (`data.device_traces.SyntheticModel`), labelled synthetic wherever it is used.
- Training time per user: DeepType's LSTM at this scale (`deeptype_common`), each test user's
  personal training at batch 16; the host's steady-state step time (or, at smoke scale, counted
  FLOPs at `host_gflops`, which reproduces bit for bit) x steps, for full training and for
  AutLearn's fine-tuning of the last layer. Step time does not depend on the weights, so the
  freshly initialised model is timed and no global model is trained.
- To phones: FLASH's measured per-layer training times of a Redmi Note 8, a Nexus 6 and a Galaxy
  Note 10 (`device.availability.LayerTimes`) give each phone's seconds per full training step at
  our model's sizes (extrapolated in sequence length); the host's fine-tune / full ratio carries
  it to fine-tuning. Every phone time is an extrapolation and labelled so.
- Training spans windows through the trainable TFLite file's `save` / `restore` signatures; the
  notebook checks that training interrupted at window edges gives the weights of uninterrupted
  training.

Stages, one per notebook section: `load_corpus`, `load_trace`, `availability`, `layer_times`,
`host_times`, `phone_times`, `resume_check`, `finish_within_day`, `conclude`; `run` calls them all.
"""

from __future__ import annotations

import hashlib
import json
import math
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ondevice import streams
from ondevice.data import device_traces, manifests
from ondevice.data.device_traces import AUTONOMOUS, CHARGING, FEDERATED, DeviceWindows
from ondevice.device import availability as av
from ondevice.device import tflite
from ondevice.device.energy.workload import step_flops
from ondevice.papers.deeptype import common
from ondevice.papers.deeptype import export as device_export
from ondevice.papers.deeptype.common import Corpus, load_corpus  # noqa: F401  (a stage the notebook calls)
from ondevice.papers.deeptype.techniques.fine_tune import FineTune
from ondevice.report import claims, record
from ondevice.tasks.next_word import NextWordTask
from ondevice.training.trainer import Trainer, seed_everything

NAME = "autlearn_availability"
VARIANTS = {"fine_tune": "AutLearn: only the last layer trains", "full": "every layer trains (DeepType incremental)"}
SYNTHETIC = (
    "a synthetic device-state trace in FLASH's format, generated from a documented model "
    "(ondevice.data.device_traces.SyntheticModel), stands in for the usage traces of about 1,500 "
    "users that AutLearn collected (not public)"
)

PAPER = claims.Paper(
    citation="AutLearn (Journal of Software, in Chinese), Sec. 2 and Fig. 2 (usage traces of about 1,500 users), "
    "and Sec. 5 after Fig. 8",
    numbers=(
        claims.PaperNumber(
            "median minutes per day, autonomous (charging, screen off)",
            120.0,
            "Sec. 2, Fig. 2: about 120 minutes (median over devices)",
        ),
        claims.PaperNumber(
            "median minutes per day, federated (charging, screen off, Wi-Fi)",
            60.0,
            "Sec. 2, Fig. 2: 60 minutes (median over devices)",
        ),
        claims.PaperNumber(
            "share of devices that finish personalization within 24 h (autonomous)",
            0.5,
            "Sec. 5: over half the devices have about 120 trainable minutes a day, enough for several "
            "rounds of transfer learning within a day; no number given, 0.5 is the implied lower bound",
        ),
    ),
    effects=(
        claims.Effect(
            "autonomous learning has more trainable minutes per day than federated learning",
            "median minutes per day, autonomous (charging, screen off)",
            "median minutes per day, federated (charging, screen off, Wi-Fi)",
        ),
    ),
)
CLAIM = PAPER.effects[0].claim
MODEL_FIELDS = {
    f"trace_{k}": k
    for k in (
        "bedtime",
        "wake",
        "night_charge_a",
        "night_charge_b",
        "day_charges",
        "day_charge_hours",
        "awake_sessions_per_hour",
        "session_minutes",
        "night_sessions",
        "home_wifi",
        "work_wifi",
        "models",
        "model_weights",
    )
}


@dataclass(frozen=True)
class Params(common.DeepTypeParams):
    # the trace
    trace_source: str = "synthetic"  # synthetic | flash | fedscale
    trace_file: str = ""  # a FLASH state_traces.json / FedScale client_behave_trace; "" = its manifest
    idle_rule: str = "screen_off"  # the paper's idle: screen off; FLASH's simulator uses "locked"
    min_trace_hours: float = 48.0  # shorter device traces are left out (a day to start in, a day to finish)
    trace_devices: int = 1500  # synthetic: devices (the paper: about 1,500 users)
    trace_days: int = 7  # synthetic: days (FLASH's trace: one week)
    trace_start: str = "2021-03-01"  # synthetic: first day of the trace
    # synthetic: the documented model's habits (device_traces.SyntheticModel; our choices, not fitted to data)
    trace_bedtime: float = 23.5
    trace_wake: float = 7.5
    trace_night_charge_a: float = 2.0
    trace_night_charge_b: float = 2.0
    trace_day_charges: float = 1.0
    trace_day_charge_hours: float = 0.75
    trace_awake_sessions_per_hour: float = 3.0
    trace_session_minutes: float = 4.0
    trace_night_sessions: float = 1.0
    trace_home_wifi: float = 0.8
    trace_work_wifi: float = 0.4
    trace_models: tuple[str, ...] = ("Redmi Note 8", "Nexus 6", "Galaxy Note 10")
    trace_model_weights: tuple[float, ...] = (1.0, 1.0, 1.0)
    # phones (FLASH's measured layer times) and training
    unknown_phone: str = "redmi_note8"  # profile for a trace's phone models that are not profiled
    personal_optimizer: str = "sgd"  # DeepType's personal configuration (SGD; a stateless checkpoint resumes exactly)
    personal_learning_rate: float = 1.0
    personal_epochs: int = 5  # AutLearn: "several rounds" within a day; DeepType Table 1: 5 epochs
    personal_batch_size: int = 16  # AutLearn's LSTM batch on the phones
    epochs_grid: tuple[int, ...] = (1, 5, 10, 20)
    variant: str = "fine_tune"  # the headline's training: fine_tune (AutLearn) | full
    host_time: str = "measured"  # measured (steady-state step time) | counted (FLOPs / host_gflops)
    host_gflops: float = 50.0  # counted: sustained FLOP/s of the host, in 1e9
    timing_steps: int = 30  # timed steps per user and variant after the Trainer's warm-up
    # finishing within a day
    start_hours: tuple[int, ...] = tuple(range(24))  # the model arrives at these hours of the first day
    horizon_hours: float = 24.0
    window_overhead_s: float = 2.0  # restore + save per window (a few MB of weights to flash storage)
    resume_schedule: tuple[int, ...] = (3, 1, 4, 2)  # steps per window in the interrupted-training check
    bootstrap: int = 2000

    PRESETS = common.presets(
        {
            "smoke": dict(
                trace_devices=40,
                trace_days=3,
                host_time="counted",
                timing_steps=5,
                start_hours=(0, 6, 12, 18),
                epochs_grid=(1, 5),
                resume_schedule=(2, 1, 2),
                bootstrap=500,
            ),
            "default": dict(),
            "paper": dict(),
        }
    )

    def check(self) -> None:
        super().check()
        self.require(
            self.trace_source in ("synthetic", "flash", "fedscale"),
            "trace_source",
            "must be synthetic, flash or fedscale",
        )
        self.require(
            self.idle_rule in device_traces.IDLE_RULES, "idle_rule", f"must be one of {device_traces.IDLE_RULES}"
        )
        self.require(self.trace_devices >= 2, "trace_devices", "must be at least 2 (effects are paired over devices)")
        self.require(self.trace_days * 24 >= self.min_trace_hours, "trace_days", "must cover min_trace_hours")
        self.require(self.min_trace_hours >= self.horizon_hours, "min_trace_hours", "must be at least horizon_hours")
        self.require(
            0 <= self.trace_bedtime < 30 and 0 <= self.trace_wake < 24,
            "trace_bedtime",
            "and trace_wake must be hours of the day",
        )
        for name in (
            "trace_night_charge_a",
            "trace_night_charge_b",
            "trace_day_charge_hours",
            "trace_awake_sessions_per_hour",
            "trace_session_minutes",
            "host_gflops",
            "horizon_hours",
            "personal_learning_rate",
        ):
            self.require(getattr(self, name) > 0, name, "must be positive")
        for name in ("trace_day_charges", "trace_night_sessions", "window_overhead_s"):
            self.require(getattr(self, name) >= 0, name, "must be >= 0")
        for name in ("trace_home_wifi", "trace_work_wifi"):
            self.require(0 <= getattr(self, name) <= 1, name, "must be a probability")
        self.require(
            len(self.trace_models) == len(self.trace_model_weights)
            and self.trace_models
            and all(w >= 0 for w in self.trace_model_weights)
            and sum(self.trace_model_weights) > 0,
            "trace_model_weights",
            "must give one non-negative weight per trace model, not all 0",
        )
        self.require(self.unknown_phone in av.PHONES, "unknown_phone", f"must be one of {sorted(av.PHONES)}")
        self.require(self.variant in VARIANTS, "variant", f"must be one of {sorted(VARIANTS)}")
        self.require(self.host_time in ("measured", "counted"), "host_time", "must be 'measured' or 'counted'")
        self.require(self.personal_epochs in self.epochs_grid, "epochs_grid", "must include personal_epochs")
        self.require(all(e >= 1 for e in self.epochs_grid), "epochs_grid", "must hold positive epoch counts")
        self.require(self.timing_steps >= 1, "timing_steps", "must be at least 1")
        self.require(
            self.start_hours and all(0 <= h < 24 for h in self.start_hours), "start_hours", "must hold hours 0-23"
        )
        self.require(
            len(self.resume_schedule) >= 2 and all(s >= 1 for s in self.resume_schedule),
            "resume_schedule",
            "must hold at least two windows of at least one step",
        )
        self.require(self.bootstrap >= 100, "bootstrap", "must be at least 100 resamples")
        self.require(
            self.trace_source == "synthetic" or self.trace_file == "" or Path(self.trace_file).is_file(),
            "trace_file",
            "must be an existing file",
        )

    def synthetic_model(self) -> device_traces.SyntheticModel:
        return device_traces.SyntheticModel(**{k: getattr(self, f) for f, k in MODEL_FIELDS.items()})


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
        return pd.DataFrame(
            [
                {
                    "trace": self.source,
                    "synthetic": self.synthetic,
                    "devices": len(self.devices),
                    "left out (shorter than min_trace_hours)": self.dropped,
                    "median days per device": float(np.median(days)),
                    "conditions": ", ".join(self.conditions),
                    "phone models": ", ".join(f"{m} ({n})" for m, n in models.items()),
                }
            ]
        )


def load_trace(params: Params, log=print) -> Trace:
    """The synthetic trace (generated, written and read back through the FLASH reader), or the
    given FLASH / FedScale file."""
    if params.trace_source == "synthetic":
        doc = device_traces.synthetic_flash(
            params.trace_devices,
            params.trace_days,
            streams.rng(params.seed, "availability/trace"),
            params.synthetic_model(),
            params.trace_start,
        )
        blob = json.dumps(doc, sort_keys=True).encode()
        with tempfile.TemporaryDirectory() as tmp:  # through the file reader, as a real trace would be
            path = Path(tmp) / "state_traces.json"
            path.write_bytes(blob)
            devices = device_traces.read_flash(path, params.idle_rule)
        data = {
            "name": "synthetic device-state trace (FLASH format)",
            "license": "generated here",
            "stand_in_for": SYNTHETIC,
            "artifacts": [
                {
                    "file": "state_traces.json (generated, not saved)",
                    "sha256": hashlib.sha256(blob).hexdigest(),
                    "size": len(blob),
                }
            ],
        }
        source, synthetic = "synthetic (FLASH format)", True
    else:
        name = {"flash": "flash_traces", "fedscale": "fedscale_traces"}[params.trace_source]
        path = Path(params.trace_file) if params.trace_file else manifests.resolve(name, "trace")
        devices = (
            device_traces.read_flash(path, params.idle_rule)
            if params.trace_source == "flash"
            else device_traces.read_fedscale(path)
        )
        data = {
            "name": name,
            "license": manifests.load(name).license,
            "stand_in_for": None,
            "artifacts": [{"file": str(path), "sha256": manifests.sha256_of(path), "size": path.stat().st_size}],
        }
        source, synthetic = f"{params.trace_source}: {path.name}", False
    kept = [d for d in devices if d.days * 24 >= params.min_trace_hours]
    if len(kept) < 2:
        raise ValueError(f"only {len(kept)} device(s) of the trace span at least {params.min_trace_hours} h")
    conditions = tuple(c for c in (AUTONOMOUS, FEDERATED, CHARGING) if c in kept[0].windows)
    log(
        f"trace: {source}, {len(kept)} devices kept, {len(devices) - len(kept)} shorter than "
        f"{params.min_trace_hours:g} h"
    )
    return Trace(kept, source, synthetic, conditions, data, len(devices) - len(kept))


def availability(trace: Trace) -> pd.DataFrame:
    """Minutes per day in each condition, one row per device and condition."""
    return pd.DataFrame(
        [
            {
                "device": d.device,
                "model": d.model,
                "days": d.days,
                "condition": c,
                "minutes_per_day": d.minutes_per_day(c),
            }
            for d in trace.devices
            for c in trace.conditions
        ]
    )


def availability_summary(minutes: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for c, g in minutes.groupby("condition", sort=False):
        m = g.minutes_per_day
        rows.append(
            {
                "condition": c,
                "what": device_traces.CONDITIONS[c],
                "devices": len(m),
                "median minutes per day": float(m.median()),
                "10th percentile": float(m.quantile(0.1)),
                "90th percentile": float(m.quantile(0.9)),
                "share with at least 120 min": float((m >= 120).mean()),
                "share with at least 60 min": float((m >= 60).mean()),
            }
        )
    return pd.DataFrame(rows)


def layer_times(params: Params) -> tuple[dict[str, av.LayerTimes], pd.DataFrame]:
    """Each phone's fitted per-layer training time, and the fits' quality."""
    fits = av.load_layer_times()
    return fits, pd.DataFrame([f for t in fits.values() for f in t.fit])


def _user_batches(params: Params, corpus: Corpus, user: str) -> list:
    train, _ = corpus.personal(user, params.personal_train_fraction)
    task = NextWordTask(params.k)
    return list(task.batches(train, params.personal_batch_size, streams.rng(params.seed, f"personal/{user}")))


def host_times(params: Params, corpus: Corpus, log=print) -> pd.DataFrame:
    """Per test user and variant: steps per epoch, mean padded length, and the host's seconds per
    step: the steady-state median of `timing_steps` steps after warm-up, both variants stepping in
    turn so that load from other processes hits them alike (measured), or the FLOPs of the user's
    batches at `host_gflops` (counted). Seconds per epoch = step x steps."""
    seed_everything(params.seed)
    model = common.build_model(params, corpus, params.seed)
    task = NextWordTask(params.k)
    start = model.get_weights()
    trainers = {
        "full": Trainer(model, task, params.personal_learning_rate, params.personal_optimizer),
        "fine_tune": Trainer(model, task, params.personal_learning_rate, params.personal_optimizer, hooks=[FineTune()]),
    }
    rows = []
    for user in corpus.split.test:
        batches = _user_batches(params, corpus, user)
        lengths = [x.shape[1] for x, _ in batches]
        steps = {}
        if params.host_time == "measured":
            for trainer in trainers.values():
                trainer.reset(start)
                trainer.timer.durations.clear()
            for n in range(trainers["full"].timer.warmup + params.timing_steps):
                x, y = batches[n % len(batches)]
                for trainer in trainers.values():
                    trainer.step(x, y)
            steps = {v: t.timer.steady() for v, t in trainers.items()}
        else:
            for v, t in trainers.items():
                flops = [step_flops(model, t.variables, int(x.size), model.output_shape[-1]) for x, _ in batches]
                steps[v] = float(np.mean(flops)) / (params.host_gflops * 1e9)
        for variant, step in steps.items():
            rows.append(
                {
                    "user": user,
                    "variant": variant,
                    "samples": int(sum(len(x) for x, _ in batches)),
                    "steps_per_epoch": len(batches),
                    "mean_padded_length": float(np.mean(lengths)),
                    "host_step_seconds": step,
                    "host_seconds_per_epoch": step * len(batches),
                    "host_time": params.host_time,
                }
            )
        log(f"timed {user}: {len(batches)} steps per epoch")
    return pd.DataFrame(rows)


def fine_tune_time_ratio(host: pd.DataFrame) -> float:
    """Fine-tune / full step time: the median over users (a property of the model, not of the user;
    the median keeps a step slowed by another process from moving it)."""
    wide = host.pivot(index="user", columns="variant", values="host_step_seconds")
    return float((wide.fine_tune / wide.full).median())


def phone_times(
    params: Params, corpus: Corpus, host: pd.DataFrame, fits: dict[str, av.LayerTimes]
) -> tuple[pd.DataFrame, dict]:
    """Per user, phone and variant: seconds per epoch on the phone, extrapolated. Full training:
    the phone's device profile (FLASH's layer times at our sizes, at the users' mean length),
    scaled to the user's steps and mean length by `device.export.extrapolate_seconds`;
    fine-tuning: that x the host's fine-tune / full step-time ratio (`fine_tune_time_ratio`)."""
    config = common.model_config(params, corpus)
    mean_length = float(host.mean_padded_length.mean())
    profiles = {p: av.device_profile(t, config, params.personal_batch_size, mean_length) for p, t in fits.items()}
    ratio = {"full": 1.0, "fine_tune": fine_tune_time_ratio(host)}
    rows = []
    for r in host[host.variant == "full"].itertuples():
        for phone, profile in profiles.items():
            e = device_export.extrapolate_seconds(profile, r.steps_per_epoch, r.mean_padded_length)
            for variant in VARIANTS:
                rows.append(
                    {
                        "user": r.user,
                        "phone": phone,
                        "variant": variant,
                        "steps_per_epoch": r.steps_per_epoch,
                        "phone_step_seconds": e["step_seconds"] * ratio[variant],
                        "phone_minutes_per_epoch": e["seconds"] * ratio[variant] / 60,
                        "host_minutes_per_epoch": float(
                            host[(host.user == r.user) & (host.variant == variant)].host_seconds_per_epoch.iloc[0]
                        )
                        / 60,
                        "outside_measured_grid": ", ".join(
                            fits[phone].outside_grid(config, params.personal_batch_size, r.mean_padded_length)
                        )
                        or "-",
                        "label": e["label"],
                    }
                )
    return pd.DataFrame(rows), profiles


def resume_check(params: Params, corpus: Corpus, log=print) -> pd.DataFrame:
    """Train the first test user's first batches through the trainable TFLite file of the headline
    variant, once without interruption and once interrupted at the window edges of
    `resume_schedule` (a fresh interpreter per window, `restore` then `save`); compare weights."""
    seed_everything(params.seed)
    model = common.build_model(params, corpus, params.seed)
    task = NextWordTask(params.k)
    hooks = [FineTune()] if params.variant == "fine_tune" else []
    flatbuffer = tflite.convert(
        tflite.TrainableModel(model, task, params.personal_learning_rate, params.personal_optimizer, hooks)
    )
    batches = _user_batches(params, corpus, corpus.split.test[0])
    n = sum(params.resume_schedule)
    if len(batches) < n:
        raise ValueError(f"the first test user has {len(batches)} batches, fewer than resume_schedule's {n} steps")
    batches = batches[:n]
    start = model.get_weights()
    with tempfile.TemporaryDirectory() as tmp:
        whole = av.train_across_windows(flatbuffer, task, batches, [n], Path(tmp) / "whole.ckpt")
        parts = av.train_across_windows(
            flatbuffer, task, batches, list(params.resume_schedule), Path(tmp) / "parts.ckpt"
        )
        a, b = (
            av.checkpoint_weights(Path(tmp) / "whole.ckpt", model),
            av.checkpoint_weights(Path(tmp) / "parts.ckpt", model),
        )
    diff = max(float(np.abs(x - y).max()) for x, y in zip(a, b))
    moved = max(float(np.abs(x - s).max()) for x, s in zip(a, start))
    table = pd.DataFrame(
        [
            {
                "check": f"weights: interrupted ({'+'.join(map(str, params.resume_schedule))} steps) vs uninterrupted "
                f"({n} steps), max |difference|",
                "value": diff,
                "scale (max |weight change| in training)": moved,
            },
            {
                "check": "losses of the same steps, max |difference|",
                "value": float(np.max(np.abs(np.array(whole) - np.array(parts)))),
                "scale (max |weight change| in training)": float("nan"),
            },
        ]
    )
    table["passed"] = table.value <= 1e-6
    log(f"interrupted vs uninterrupted training: max weight difference {diff:.1e} ({params.personal_optimizer})")
    return table


def _assign(params: Params, trace: Trace, users: list[str]) -> pd.DataFrame:
    """Each device's phone profile (from its model) and its user (a draw from the test users)."""
    pick = streams.rng(params.seed, "availability/users").integers(0, len(users), len(trace.devices))
    return pd.DataFrame(
        [
            {
                "device": d.device,
                "model": d.model,
                "phone": av.phone_of(d.model, params.unknown_phone),
                "user": users[i],
            }
            for d, i in zip(trace.devices, pick)
        ]
    )


def finish_within_day(params: Params, trace: Trace, phones: pd.DataFrame) -> pd.DataFrame:
    """Per device, condition, variant and epochs: the share of start hours (the model arrives at
    each of `start_hours` on the device's first day) from which personalization finishes within
    `horizon_hours`, and the median hours to finish (inf: not within the trace)."""
    assigned = _assign(params, trace, sorted(phones.user.unique()))
    need = phones.set_index(["user", "phone", "variant"])
    rows = []
    for d, a in zip(trace.devices, assigned.itertuples()):
        midnight = math.floor(d.start / device_traces.DAY) * device_traces.DAY
        starts = np.maximum(d.start, midnight + 3600.0 * np.array(params.start_hours))
        for condition in trace.conditions:
            for variant in VARIANTS:
                r = need.loc[(a.user, a.phone, variant)]
                for epochs in params.epochs_grid:
                    if variant != params.variant and epochs != params.personal_epochs:
                        continue
                    hours = (
                        av.finish_seconds(
                            d.windows[condition],
                            starts,
                            r.phone_minutes_per_epoch * 60 * epochs,
                            r.phone_step_seconds,
                            params.window_overhead_s,
                        )
                        / 3600
                    )
                    rows.append(
                        {
                            "device": d.device,
                            "phone": a.phone,
                            "user": a.user,
                            "condition": condition,
                            "variant": variant,
                            "epochs": epochs,
                            "training_minutes_needed": r.phone_minutes_per_epoch * epochs,
                            "share_within_horizon": float(np.mean(hours <= params.horizon_hours)),
                            "median_hours_to_finish": float(np.median(hours)),
                        }
                    )
    return pd.DataFrame(rows)


def finish_summary(params: Params, finish: pd.DataFrame) -> pd.DataFrame:
    """Share of devices (x start hours) finishing within the horizon, per condition, variant and epochs."""
    rows = []
    for (c, v, e), g in finish.groupby(["condition", "variant", "epochs"], sort=False):
        rows.append(
            {
                "condition": c,
                "variant": v,
                "epochs": e,
                "devices": len(g),
                "median training minutes needed (phone, extrapolated)": float(g.training_minutes_needed.median()),
                f"share finishing within {params.horizon_hours:g} h": float(g.share_within_horizon.mean()),
                "devices finishing from every start hour": float((g.share_within_horizon == 1).mean()),
            }
        )
    return pd.DataFrame(rows)


def _median(minutes: pd.DataFrame, condition: str) -> float:
    return float(minutes[minutes.condition == condition].minutes_per_day.median())


def conclude(
    params: Params,
    corpus: Corpus,
    trace: Trace,
    minutes: pd.DataFrame,
    fit: pd.DataFrame,
    host: pd.DataFrame,
    phones: pd.DataFrame,
    profiles: dict,
    resume: pd.DataFrame,
    finish: pd.DataFrame,
    wall_time_s: float,
) -> record.Result:
    head = finish[(finish.variant == params.variant) & (finish.epochs == params.personal_epochs)]
    within = {c: float(g.share_within_horizon.mean()) for c, g in head.groupby("condition")}
    auto = AUTONOMOUS if AUTONOMOUS in trace.conditions else CHARGING  # FedScale: charging bounds both
    fed = FEDERATED if FEDERATED in trace.conditions else CHARGING
    ours = {
        PAPER.numbers[0].quantity: _median(minutes, auto),
        PAPER.numbers[1].quantity: _median(minutes, fed),
        PAPER.numbers[2].quantity: within[auto],
    }
    wide = minutes.pivot(index="device", columns="condition", values="minutes_per_day")
    effects = claims.effects_table(
        PAPER,
        {CLAIM: (wide[auto].to_numpy(), wide[fed].to_numpy())},
        streams.rng(params.seed, "bootstrap"),
        n_boot=params.bootstrap,
    )
    n = len(trace.devices)
    headline = {
        "median minutes per day, autonomous": claims.headline([ours[PAPER.numbers[0].quantity]], 1.0),
        "median minutes per day, federated": claims.headline([ours[PAPER.numbers[1].quantity]], 1.0),
        f"share finishing within {params.horizon_hours:g} h, autonomous, {params.variant}, "
        f"{params.personal_epochs} epochs": claims.headline([within[auto]], max(0.02, 1 / n)),
        "interrupted vs uninterrupted training, max |weight difference|": claims.headline(
            [float(resume.value.iloc[0])], 1e-6
        ),
    }
    stand_in = "; ".join(s for s in (trace.data["stand_in_for"], corpus.manifest.stand_in_for) if s)
    tables = {
        "trace": trace.table(),
        "minutes_per_day": minutes,
        "availability": availability_summary(minutes),
        "layer_time_fit": fit,
        "host_times": host,
        "phone_times": phones,
        "resume_check": resume,
        "finish_per_device": finish,
        "finish_within_day": finish_summary(params, finish),
        "headline": claims.headline_table(headline),
        "paper_vs_ours": claims.paper_vs_ours(PAPER, ours),
        "effects": effects,
    }
    return record.Result(
        experiment=NAME,
        params=params.to_dict(),
        tables=tables,
        headline=headline,
        artifacts={
            "split.json": corpus.split.to_dict(),
            **{f"device_profile_{p}.json": prof for p, prof in profiles.items()},
        },
        data=[trace.data, corpus.manifest.summary(), manifests.load(av.MANIFEST).summary()],
        stand_in_data=stand_in,
        wall_time_s=wall_time_s,
        notes={
            "trace": trace.source,
            "synthetic_trace": trace.synthetic,
            "conditions": list(trace.conditions),
            "host_time": params.host_time,
            "fine_tune_time_ratio": fine_tune_time_ratio(host),
            "test_users": list(corpus.split.test),
            "phone_times": "extrapolated from FLASH's per-layer DL4J training times",
            "split_digest": corpus.split.digest,
        },
    )


def run(params: Params, speeches=None, log=print) -> record.Result:
    begin = time.perf_counter()
    corpus = load_corpus(params, speeches, log)
    trace = load_trace(params, log)
    minutes = availability(trace)
    fits, fit = layer_times(params)
    host = host_times(params, corpus, log)
    phones, profiles = phone_times(params, corpus, host, fits)
    resume = resume_check(params, corpus, log)
    finish = finish_within_day(params, trace, phones)
    return conclude(
        params, corpus, trace, minutes, fit, host, phones, profiles, resume, finish, time.perf_counter() - begin
    )


def plot_availability(minutes: pd.DataFrame, synthetic: bool):
    """Fig. 2: CDF over devices of minutes per day in each condition, with the paper's medians."""
    import matplotlib.pyplot as plt

    colours = {AUTONOMOUS: "#00798c", FEDERATED: "#d1495b", CHARGING: "#8c8c8c"}
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for c, g in minutes.groupby("condition", sort=False):
        x = np.sort(g.minutes_per_day.to_numpy())
        ax.step(
            x,
            np.arange(1, len(x) + 1) / len(x),
            where="post",
            color=colours[c],
            ls="--" if c == CHARGING else "-",
            label=f"{c} (ours)",
        )
    for value, c in ((120, AUTONOMOUS), (60, FEDERATED)):
        ax.axvline(value, color=colours[c], ls=":", lw=1.2, label=f"paper's median, {c}")
    ax.set(
        xlabel="minutes per day in the condition",
        ylabel="share of devices (CDF)",
        title="Trainable minutes per day" + (" (synthetic trace)" if synthetic else ""),
    )
    ax.legend(frameon=False, fontsize=8)
    fig.tight_layout()
    return fig


def plot_finish(finish: pd.DataFrame, params: Params):
    """Left: CDF over devices of the median hours to finish; right: share finishing within the
    horizon vs epochs. Phone times are extrapolations."""
    import matplotlib.pyplot as plt

    colours = {AUTONOMOUS: "#00798c", FEDERATED: "#d1495b", CHARGING: "#8c8c8c"}
    styles = {AUTONOMOUS: "-", FEDERATED: "-", CHARGING: "--"}
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    head = finish[(finish.variant == params.variant) & (finish.epochs == params.personal_epochs)]
    for c, g in head.groupby("condition", sort=False):
        hours = g.median_hours_to_finish.to_numpy()
        x = np.sort(hours[np.isfinite(hours)])  # the rest never finish within the trace: the CDF stays below 1
        left.step(x, np.arange(1, len(x) + 1) / len(hours), where="post", color=colours[c], ls=styles[c], label=c)
    left.axvline(params.horizon_hours, color="k", ls=":", lw=1)
    left.set(
        xlim=(0, None),
        ylim=(0, 1.02),
        xlabel="hours from the model's arrival to a personalised model\n(median over start hours)",
        ylabel="share of devices (CDF)",
        title=f"{params.variant}, {params.personal_epochs} epochs (phone time extrapolated)",
    )
    left.legend(frameon=False, fontsize=8)
    grid = (
        finish[finish.variant == params.variant]
        .groupby(["condition", "epochs"], sort=False)
        .share_within_horizon.mean()
    )
    for c in head.condition.unique():
        s = grid.loc[c]
        right.plot(s.index, s.values, marker="o", color=colours[c], ls=styles[c], label=c)
    right.set(
        xlabel="personal epochs",
        ylabel=f"share finishing within {params.horizon_hours:g} h",
        ylim=(0, 1.02),
        title="Finishing within a day vs training length",
    )
    right.legend(frameon=False, fontsize=8)
    fig.tight_layout()
    return fig
