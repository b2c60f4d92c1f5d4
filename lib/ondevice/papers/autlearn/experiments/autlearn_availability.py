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
- Training time per user: DeepType's LSTM at this scale (`tasks.typing_protocol`), each test user's
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

The trace and its windows are in `traces`, the host and phone times in `costs`. Stages, one per
notebook section: `per_user_text.load_corpus`, `traces.load_trace`, `traces.minutes_per_day`,
`layer_times`, `costs.host_times`, `costs.phone_times`, `resume_check`, `traces.finish_within_day`,
`conclude`; `run` calls them all.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from ondevice import streams
from ondevice.data import device_traces, manifests
from ondevice.data.device_traces import AUTONOMOUS, CHARGING, FEDERATED
from ondevice.data.per_user_text import Corpus, load_corpus
from ondevice.device import availability as av
from ondevice.device import tflite
from ondevice.papers.autlearn import costs, traces
from ondevice.papers.autlearn.costs import fine_tune_time_ratio, host_times, phone_times
from ondevice.papers.autlearn.report import (
    availability_summary,
    finish_summary,
)
from ondevice.papers.autlearn.traces import finish_within_day, load_trace, minutes_per_day, wifi_sweep
from ondevice.report import claims, facts, record
from ondevice.report.conclusion import Conclusion
from ondevice.tasks import typing_protocol
from ondevice.tasks.next_word import NextWordTask
from ondevice.training.fine_tune import FineTune
from ondevice.training.step import Step
from ondevice.training.trainer import seed_everything

NAME = "autlearn_availability"
VARIANTS = {"fine_tune": "AutLearn: only the last layer trains", "full": "every layer trains (DeepType incremental)"}
PAPER = facts.paper(NAME)
CLAIM = PAPER.effects[0].claim


@dataclass(frozen=True)
class Params(typing_protocol.DeepTypeParams):
    # the trace
    trace_source: str = "synthetic"  # synthetic | flash | fedscale
    trace_file: str = ""  # a FLASH state_traces.json / FedScale client_behave_trace; "" = its manifest
    idle_rule: str = "screen_off"  # the paper's idle: screen off; FLASH's simulator uses "locked"
    min_trace_hours: float = 48.0  # shorter device traces are left out (a day to start in, a day to finish)
    trace_devices: int = 1500  # synthetic: devices (the paper: about 1,500 users)
    trace_days: int = 7  # synthetic: days (FLASH's trace: one week)
    trace_start: str = "2021-03-01"  # synthetic: first day of the trace
    # synthetic: the documented model's habits (our choices, not fitted to data)
    trace: device_traces.SyntheticModel = device_traces.SyntheticModel()
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

    PRESETS = typing_protocol.presets(
        {
            "smoke": dict(trace_devices=40, trace_days=3, host_time="counted", timing_steps=5, bootstrap=500)
            | dict(start_hours=(0, 6, 12, 18), epochs_grid=(1, 5), resume_schedule=(2, 1, 2)),
            "default": dict(),
            "paper": dict(),
        }
    )

    def check(self) -> None:
        super().check()
        sources, rules, phones = ("synthetic", "flash", "fedscale"), device_traces.IDLE_RULES, sorted(av.PHONES)
        self.require(self.trace_source in sources, "trace_source", "must be synthetic, flash or fedscale")
        self.require(self.idle_rule in rules, "idle_rule", f"must be one of {rules}")
        self.require(self.trace_devices >= 2, "trace_devices", "must be at least 2 (effects are paired over devices)")
        self.require(self.trace_days * 24 >= self.min_trace_hours, "trace_days", "must cover min_trace_hours")
        self.require(self.min_trace_hours >= self.horizon_hours, "min_trace_hours", "must be at least horizon_hours")
        trace = self.trace
        hours = 0 <= trace.bedtime < 30 and 0 <= trace.wake < 24
        self.require(hours, "trace.bedtime", "and trace.wake must be hours of the day")
        habits = "night_charge_a night_charge_b day_charge_hours awake_sessions_per_hour session_minutes".split()
        for name in [f"trace.{h}" for h in habits] + ["host_gflops", "horizon_hours", "personal_learning_rate"]:
            self.require(self.value(name) > 0, name, "must be positive")
        for name in ("trace.day_charges", "trace.night_sessions", "window_overhead_s"):
            self.require(self.value(name) >= 0, name, "must be >= 0")
        for name in ("trace.home_wifi", "trace.work_wifi"):
            self.require(0 <= self.value(name) <= 1, name, "must be a probability")
        weights = trace.model_weights
        ok = len(trace.models) == len(weights) > 0 and min(weights) >= 0 and sum(weights) > 0
        self.require(ok, "trace.model_weights", "must give one non-negative weight per trace model, not all 0")
        self.require(self.unknown_phone in phones, "unknown_phone", f"must be one of {phones}")
        self.require(self.variant in VARIANTS, "variant", f"must be one of {sorted(VARIANTS)}")
        self.require(self.host_time in ("measured", "counted"), "host_time", "must be 'measured' or 'counted'")
        self.require(self.personal_epochs in self.epochs_grid, "epochs_grid", "must include personal_epochs")
        self.require(all(e >= 1 for e in self.epochs_grid), "epochs_grid", "must hold positive epoch counts")
        self.require(self.timing_steps >= 1, "timing_steps", "must be at least 1")
        ok = bool(self.start_hours) and all(0 <= h < 24 for h in self.start_hours)
        self.require(ok, "start_hours", "must hold hours 0-23")
        ok = len(self.resume_schedule) >= 2 and min(self.resume_schedule) >= 1
        self.require(ok, "resume_schedule", "must hold at least two windows of at least one step")
        self.require(self.bootstrap >= 100, "bootstrap", "must be at least 100 resamples")
        ok = self.trace_source == "synthetic" or self.trace_file == "" or Path(self.trace_file).is_file()
        self.require(ok, "trace_file", "must be an existing file")


def layer_times(params: Params):
    """Each phone's fitted per-layer training time (FLASH's measurements), and the fits' quality."""
    return costs.layer_times()


def resume_check(params: Params, corpus: Corpus, log=print):
    """Train the first test user's first batches through the trainable TFLite file of the headline
    variant, once without interruption and once interrupted at the window edges of
    `resume_schedule` (`traces.resume_table`); the weights must agree."""
    seed_everything(params.seed)
    model, task = typing_protocol.build_model(params, corpus, params.seed), NextWordTask(params.k)
    hooks = [FineTune()] if params.variant == "fine_tune" else []
    module = Step(model, task, params.personal_learning_rate, params.personal_optimizer, hooks)
    flatbuffer = tflite.convert(module)
    batches, n = costs.personal_batches(params, corpus, corpus.split.test[0]), sum(params.resume_schedule)
    if len(batches) < n:
        raise ValueError(f"the first test user has {len(batches)} batches, fewer than resume_schedule's {n} steps")
    schedule, optimizer = params.resume_schedule, params.personal_optimizer
    return traces.resume_table(flatbuffer, task, model, batches[:n], schedule, optimizer, log)


def conclude(
    params, corpus, trace, minutes, sweep, fit, host, phones, profiles, resume, finish, wall_time_s
) -> record.Result:
    """Tables, the paper's medians and share beside ours, and the paired verdict on the minutes."""
    head = finish[(finish.variant == params.variant) & (finish.epochs == params.personal_epochs)]
    within = {c: float(g.share_within_horizon.mean()) for c, g in head.groupby("condition")}
    auto = AUTONOMOUS if AUTONOMOUS in trace.conditions else CHARGING  # FedScale: charging bounds both
    fed = FEDERATED if FEDERATED in trace.conditions else CHARGING
    median = lambda condition: float(minutes[minutes.condition == condition].minutes_per_day.median())
    c = Conclusion(NAME, params, PAPER)
    wide = minutes.pivot(index="device", columns="condition", values="minutes_per_day")
    pairs = {CLAIM: (wide[auto].to_numpy(), wide[fed].to_numpy())}
    habit = claims.Diagnosis(traces.wifi_diagnosis(sweep), traces.HABIT_SECTION, claims.Kind.DATA)  # the trace's
    c.effects(
        pairs,
        streams.rng(params.seed, "bootstrap"),
        n_boot=params.bootstrap,
        diagnoses={CLAIM: habit} if len(sweep) else {},
    )
    share = f"share finishing within {params.horizon_hours:g} h, autonomous, {params.variant}, "
    share += f"{params.personal_epochs} epochs"
    minutes_a_day = {
        "median minutes per day, autonomous": [median(auto)],
        "median minutes per day, federated": [median(fed)],
    }
    c.headlines(minutes_a_day, dict.fromkeys(minutes_a_day, 1.0))
    c.headlines({share: [within[auto]]}, {share: max(0.02, 1 / len(trace.devices))})
    resumed = "interrupted vs uninterrupted training, max |weight difference|"
    c.headlines({resumed: [float(resume.value.iloc[0])]}, {resumed: 1e-6})
    c.paper_vs_ours(dict(zip((n.quantity for n in PAPER.numbers), (median(auto), median(fed), within[auto]))))
    stand_in = "; ".join(s for s in (trace.data["stand_in_for"], corpus.manifest.stand_in_for) if s)
    tables = dict(trace=trace.table(), minutes_per_day=minutes, availability=availability_summary(minutes))
    tables |= {"wifi_sweep": sweep} if len(sweep) else {}
    tables |= dict(layer_time_fit=fit, host_times=host, phone_times=phones, resume_check=resume)
    tables |= dict(finish_per_device=finish, finish_within_day=finish_summary(params, finish))
    artifacts = {"split.json": corpus.split.to_dict(), **{f"device_profile_{p}.json": d for p, d in profiles.items()}}
    data = [trace.data, corpus.manifest.summary(), manifests.load(av.MANIFEST).summary()]
    flash = "extrapolated from FLASH's per-layer DL4J training times"
    notes = dict(trace=trace.source, synthetic_trace=trace.synthetic, conditions=list(trace.conditions))
    notes |= dict(host_time=params.host_time, fine_tune_time_ratio=fine_tune_time_ratio(host))
    notes |= dict(test_users=list(corpus.split.test), phone_times=flash, split_digest=corpus.split.digest)
    return c.result(tables, data, stand_in, wall_time_s, artifacts=artifacts, **notes)


def run(params: Params, speeches=None, log=print) -> record.Result:
    """All stages in order, as the notebook runs them."""
    begin = time.perf_counter()
    corpus = load_corpus(params, speeches, log)
    trace = load_trace(params, log)
    minutes, sweep = minutes_per_day(trace), wifi_sweep(params)
    fits, fit = layer_times(params)
    host = host_times(params, corpus, log)
    phones, profiles = phone_times(params, corpus, host, fits)
    resume = resume_check(params, corpus, log)
    finish = finish_within_day(params, trace, phones)
    tables = (minutes, sweep, fit, host, phones, profiles, resume, finish)
    return conclude(params, corpus, trace, *tables, time.perf_counter() - begin)
