"""DeepType D9 / AutLearn A6 (Fig. 9b): energy of on-device training, optimised vs not, under a
performance-oriented CPU governor vs `powersave`, normalised to un-optimised training on the
default governor.

Un-optimised = full incremental training of the personal model; optimised = fine-tune training
(only the softmax layer trains, DeepType Sec. 5), the one of DeepType's four optimisations the
suite has so far (the paper's -90.3% combines all four). A few test users of DeepType's
Shakespeare stand-in personalise each seed's cached global model both ways; every training
window is measured by each meter that can run here, and modelled with a device power profile:

- measured meters (`device/energy/meters.py`): RAPL, NVML, Zeus, an external meter's CSV. With
  writable cpufreq the whole personal training repeats under each governor (set and restored
  per run, recorded in run.json); without it the governor is whatever the machine has.
- the modelled meter (`device/energy/modelled.py`): busy time x the Nexus 6 power profile (the
  phone of both papers). The performance-oriented governor (the Nexus 6's `interactive`) runs
  the job at the top speed (`performance_khz`), `powersave` at the lowest (`powersave_khz`),
  and time scales with the frequency ratio for compute-bound work (`compute_bound`). Busy time
  is the measured steady-state step time x steps (`modelled_cpu_time="measured"`), or FLOPs
  counted from the layer shapes / (flops_per_cycle x frequency) (`"counted"`, which reproduces
  bit for bit; the smoke preset uses it because the suite diffs a smoke run against its re-run).

Stages, one per notebook section: `load_corpus`, `setup`, `train_global`, `personalize`,
`measure_phone`, `export_models`, `conclude`; `run` calls them all.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ondevice import streams
from ondevice.device.energy import meters, profiles
from ondevice.device.energy.android import Adb, AndroidBatteryMeter, phone_cpufreq, run_job
from ondevice.device.energy.base import MEASURED, MODELLED, measuring
from ondevice.device.energy.external import PowerLog, window_energies
from ondevice.device.energy.governors import DEFAULT_ROOT, CpuFreq, CpuFreqError, Setting
from ondevice.device.energy.modelled import GovernorModel, ModelledMeter
from ondevice.device.energy.rapl import POWERCAP
from ondevice.device.energy.workload import step_flops
from ondevice.params import ParameterError
from ondevice.report import claims, record
from ondevice.tasks.next_word import NextWordTask
from ondevice.papers.deeptype.techniques.fine_tune import FineTune
from ondevice.training.trainer import StepTimer, Trainer
from ondevice.papers.deeptype import common
from ondevice.papers.deeptype.common import Corpus, GlobalModels, load_corpus  # noqa: F401  (a stage the notebook calls)

NAME = "energy_governors"
BASELINE_GOVERNOR = "default"
VARIANTS = {"full": "un-optimised (full training)", "fine_tune": "optimised (fine-tune)"}
PRIMARY_ORDER = ("rapl", "zeus", "nvml", "external-csv")  # "auto": the first measured one here, else modelled

PAPER = claims.Paper(
    citation="Xu et al., DeepType, IMWUT 2018, Sec. 6.2.2, Table 2 and Fig. 9b (Nexus 6, Snapdragon Profiler, "
             "100K samples, one epoch); AutLearn (JoS) Fig. 9 makes the same comparison on a Nexus 6",
    numbers=(
        claims.PaperNumber("energy, un-optimised, default governor", 1.0,
                           "Fig. 9b: the normalisation baseline (no optimisation, interactive governor)"),
        claims.PaperNumber("energy, optimised, default governor", 0.097,
                           "Fig. 9b / Sec. 6.2.2: -90.3% with all four optimisations combined (ours: fine-tuning only)"),
        claims.PaperNumber("energy saved by optimisation, default governor", 0.903,
                           "Sec. 6.2.2: 90.3%, all four optimisations combined (ours: fine-tuning only)"),
        claims.PaperNumber("training time, full training", 1.0, "Table 2: 3.79 h, the normalisation baseline"),
        claims.PaperNumber("training time, fine-tune", round(2.17 / 3.79, 4), "Table 2: fine-tune training alone, 2.17 h / 3.79 h"),
        claims.PaperNumber("top-k-eff, full training", 0.616, "Table 2, personal model (baseline)"),
        claims.PaperNumber("top-k-eff, fine-tune", 0.617, "Table 2, fine-tune training"),
    ),
    effects=(
        claims.Effect("optimisation lowers the energy of training (default governor)",
                      "energy, un-optimised, default governor", "energy, optimised, default governor"),
        claims.Effect("fine-tuning shortens training (default governor)", "training time, full training",
                      "training time, fine-tune"),
    ),
)


@dataclass(frozen=True)
class Params(common.DeepTypeParams):
    energy_users: int = 4             # test users personalised (drawn from the split's test users)
    personal_epochs: int = 1
    personal_batch_size: int = 16
    personal_learning_rate: float = 0.0003
    governors: tuple[str, ...] = ("default", "powersave")  # "default" = the performance-oriented one;
                                      # also "performance", "lowest", "khz:N" (modelled at speed N)
    device_profile: str = "nexus6"    # power profile of the modelled meter (profiles.DEVICES)
    performance_khz: int = 0          # modelled speed of the default governor; 0 = the profile's top
    powersave_khz: int = 0            # modelled speed of powersave; 0 = the profile's lowest
    compute_bound: float = 1.0        # share of busy time that scales with 1/frequency
    nominal_voltage: float = 0.0      # V; 0 = the device's nominal battery voltage
    busy_cores: float = 1.0           # cores busy while training, in the model
    include_awake: bool = True        # charge the profile's awake current for the job's time
    modelled_cpu_time: str = "measured"  # measured (steady step time x steps) | counted (FLOPs)
    flops_per_cycle: float = 1.0      # counted time: sustained FLOPs per cycle of the modelled CPU
    meters: tuple[str, ...] = meters.MEASURED_METERS  # measured meters to try (unavailable ones are skipped)
    primary_meter: str = "auto"       # the meter behind the headline: auto | modelled | a measured one
    set_governors: bool = True        # with writable cpufreq, train under each governor for real
    cpufreq_root: str = DEFAULT_ROOT
    rapl_root: str = POWERCAP
    external_csv: str = ""            # an external meter's log (e.g. Monsoon CSV), matched by timestamp
    external_columns: tuple[str, ...] = ("time_s", "power_W")  # (time, power) or (time, current, voltage)
    external_time_origin: float = 0.0  # epoch seconds of the log's time zero (0: times are epoch seconds)
    android_serial: str = ""
    android_job: str = ""             # shell command on the phone; {variant} and {governor} filled in
    export_tflite: bool = True        # trainable TFLite files of both variants (what a phone runs)
    bootstrap: int = 2000

    # smoke: modelled meter only, on counted work, so its outputs reproduce bit for bit
    PRESETS = common.presets({
        "smoke": dict(energy_users=2, seeds=2, meters=(), modelled_cpu_time="counted", export_tflite=False,
                      bootstrap=500),
        "default": dict(seeds=3),
        "paper": dict(energy_users=20, personal_epochs=1, seeds=3),
    })

    def check(self) -> None:
        super().check()
        self.require(2 <= self.energy_users <= self.test_users, "energy_users",
                     "must be between 2 and test_users (effects are paired over users)")
        for name in ("personal_epochs", "personal_batch_size"):
            self.require(getattr(self, name) >= 1, name, "must be at least 1")
        for name in ("personal_learning_rate", "flops_per_cycle", "busy_cores"):
            self.require(getattr(self, name) > 0, name, "must be positive")
        self.require(self.nominal_voltage >= 0, "nominal_voltage", "must be >= 0 (0 = the device's)")
        self.require(0 <= self.compute_bound <= 1, "compute_bound", "must be in [0, 1]")
        self.require(self.bootstrap >= 100, "bootstrap", "must be at least 100 resamples")
        self.require(self.modelled_cpu_time in ("measured", "counted"), "modelled_cpu_time", "must be 'measured' or 'counted'")
        self.require(BASELINE_GOVERNOR in self.governors, "governors", "must include 'default' (the baseline)")
        self.require(len(set(self.governors)) == len(self.governors), "governors", "must not repeat a governor")
        unknown = [m for m in self.meters if m not in meters.MEASURED_METERS]
        self.require(not unknown, "meters", f"must be among {meters.MEASURED_METERS}")
        self.require(self.primary_meter in ("auto", "modelled", *self.meters), "primary_meter",
                     "must be auto, modelled or one of `meters`")
        self.require(len(self.external_columns) in (2, 3), "external_columns", "must be (time, power) or (time, current, voltage)")
        self.require(self.device_profile in profiles.DEVICES, "device_profile", f"must be one of {sorted(profiles.DEVICES)}")
        try:
            model = self.governor_model()
            for g in self.governors:
                model.khz(g)
        except ValueError as exc:
            raise ParameterError(f"parameter 'governors' / '*_khz': {exc}") from exc

    def governor_model(self) -> GovernorModel:
        return GovernorModel(profiles.device(self.device_profile).profile(), self.performance_khz, self.powersave_khz,
                             0, self.compute_bound)

    @property
    def voltage(self) -> float:
        return self.nominal_voltage or profiles.device(self.device_profile).nominal_voltage


@dataclass
class Setup:
    """Which meters run, which governor settings are applied for real, and the modelled device."""

    params: Params
    device: profiles.Device
    model: GovernorModel
    backends: list[meters.Backend]
    cpufreq: CpuFreq
    cpufreq_status: tuple[bool, str]
    passes: list[tuple[str, Setting | None, str]]  # (governor, setting to apply or None, how)
    primary: str
    phone: tuple[bool, str]

    @property
    def measured(self) -> list:
        return [b.meter for b in self.backends if b.available]

    def modelled_meter(self, governor: str) -> ModelledMeter:
        p = self.params
        return ModelledMeter(self.model, governor, p.voltage, p.busy_cores, p.include_awake, self.device.name)

    def busy_source(self) -> str:
        return {"measured": "steady-state step time x steps", "counted": "counted FLOPs"}[self.params.modelled_cpu_time]

    def primary_text(self) -> str:
        if self.primary == "modelled":
            return f"modelled: {self.device.name} power profile x {self.busy_source()}"
        return f"measured: {self.primary}"

    def backends_table(self) -> pd.DataFrame:
        modelled = self.modelled_meter(BASELINE_GOVERNOR)
        rows = [{"meter": "modelled", "label": MODELLED, "what it measures": modelled.description,
                 "available": True, "detail": f"{self.device.name}, {self.params.voltage:g} V, busy time = {self.busy_source()}"}]
        rows += [b.row() for b in self.backends]
        ok, why = self.phone
        rows.append({"meter": "android-battery (phone job)", "label": MEASURED,
                     "what it measures": "phone battery over adb while the exported TFLite job trains",
                     "available": ok, "detail": why})
        table = pd.DataFrame(rows)
        table["used for"] = ["headline" if r["meter"] == self.primary else ("reported beside it" if r["available"] else "skipped")
                             for r in rows]
        return table

    def governors_table(self) -> pd.DataFrame:
        ok, why = self.cpufreq_status
        hardware = {g: how for g, _, how in self.passes}
        return pd.DataFrame([{"governor": g, "modelled as": self.model.describe(self.device.default_governor if g == BASELINE_GOVERNOR else g),
                              "on this machine": hardware.get(g, f"not set ({why})")}
                             for g in self.params.governors])


def setup(params: Params, log=print) -> Setup:
    """Ask every meter whether it can run here, and cpufreq whether governors can be set."""
    device = profiles.device(params.device_profile)
    adb = Adb(params.android_serial or None)
    backends = meters.discover(params.meters, rapl_root=params.rapl_root, adb=adb, external_csv=params.external_csv,
                               external_columns=params.external_columns, external_time_origin=params.external_time_origin)
    backends = [b for b in backends if b.name != "android-battery"]  # a phone measures its own job (measure_phone)
    cpufreq = CpuFreq(params.cpufreq_root)
    status = cpufreq.status()
    if status[0] and params.set_governors:
        ordered = [BASELINE_GOVERNOR] + [g for g in params.governors if g != BASELINE_GOVERNOR]  # baseline first
        passes = [(g, cpufreq.setting_for(g), _describe(cpufreq.setting_for(g))) for g in ordered]
    else:
        current = ", ".join(sorted({p.state.governor for p in cpufreq.policies()})) if status[0] else ""
        why = status[1] if not status[0] else "set_governors = False"
        passes = [(BASELINE_GOVERNOR, None, f"as found{' (' + current + ')' if current else ''}; not set: {why}")]
    available = [b.name for b in backends if b.available]
    primary = params.primary_meter
    if primary == "auto":
        primary = next((m for m in PRIMARY_ORDER if m in available), "modelled")
    elif primary != "modelled" and primary not in available:
        raise ParameterError(f"parameter 'primary_meter' is {primary!r}, which cannot run here")
    phone = (False, "no job given (parameter android_job)")
    if params.android_job and "android-battery" in params.meters:
        phone = AndroidBatteryMeter(adb).status()
    result = Setup(params, device, params.governor_model(), backends, cpufreq, status, passes, primary, phone)
    log(f"meters: modelled ({device.name} power profile)"
        + "".join(f", {b.name}" for b in backends if b.available) + f"; headline from {primary}")
    log(f"cpufreq: {status[1]}" + ("" if passes[0][1] is not None else "; governors are modelled only"))
    return result


def _describe(setting: Setting) -> str:
    limits = "" if setting.max_khz is None else ", max frequency pinned to the minimum" if setting.max_khz == "min" \
        else f", max {setting.max_khz} kHz"
    return f"set: {setting.governor or 'governor left as found'}{limits}"


def train_global(params: Params, corpus: Corpus, log=print) -> GlobalModels:
    """Each seed's global model from the model cache (the DeepType notebooks share them). Its lines
    all start with "[model cache]", as they appear only on a machine whose cache lacks a model."""
    return common.train_global(params, corpus, lambda m: log(m if m.startswith("[model cache]") else f"[model cache] {m}"))


def energy_users(params: Params, corpus: Corpus) -> list[str]:
    """The test users personalised here: a draw from the split's test users (its own stream)."""
    pick = streams.rng(params.seed, "energy/users").choice(len(corpus.split.test), params.energy_users, replace=False)
    return [corpus.split.test[i] for i in sorted(pick)]


def _counted_flops(model, variables, task, train, params: Params, seed: int, user: str, classes: int) -> tuple[int, float]:
    """Tokens and FLOPs of the steps the trainer runs: the same batches, from the same stream."""
    rng = streams.rng(seed, f"personal/{user}")
    tokens, flops = 0, 0.0
    for _ in range(params.personal_epochs):
        for x, _ in task.batches(train, params.personal_batch_size, rng):
            tokens += int(x.size)
            flops += step_flops(model, variables, int(x.size), classes)
    return tokens, flops


def personalize(params: Params, corpus: Corpus, models: GlobalModels, env: Setup, log=print) -> tuple[list[dict], list[dict]]:
    """Every seed, user and variant: train the personal model inside one window of every measured
    meter; with governor control, all of it once per governor. Returns the runs and what was set."""
    task = NextWordTask(params.k)
    trainers = {"full": Trainer(models.model, task, params.personal_learning_rate, params.optimizer),
                "fine_tune": Trainer(models.model, task, params.personal_learning_rate, params.optimizer, hooks=[FineTune()])}
    users = energy_users(params, corpus)
    data = {u: corpus.personal(u, params.personal_train_fraction) for u in users}
    runs, settings = [], []
    for governor, setting, how in env.passes:
        context = env.cpufreq.use(setting) if setting is not None else contextlib.nullcontext({"setting": None, "how": how})
        try:
            with context as applied:
                applied.update(governor=governor, how=how)  # the same dict: `restored` is set on the way out
                settings.append(applied)
                log(f"governor {governor}: {how}")
                for seed in params.seed_list:
                    _warm_up(trainers, models.weights[seed], task, data[users[0]][0], params, seed)
                    for n, user in enumerate(users, 1):
                        rows = _personalize_user(params, task, trainers, models, env, data[user], seed, user,
                                                 governor, evaluate=governor == BASELINE_GOVERNOR)
                        runs += rows
                        log(f"seed {seed} user {n}/{len(users)} {user}: " + ", ".join(
                            f"{r['variant']} {r['steps']} steps ({r['train_seconds']:.1f}s)" for r in rows))
        except CpuFreqError as exc:
            settings.append({"governor": governor, "how": how, "error": str(exc)})
            log(f"governor {governor}: skipped ({exc})")
    return runs, settings


def _warm_up(trainers, weights, task, train, params: Params, seed: int, steps: int = 3) -> None:
    """Trace each trainer's step before any window opens, so no window pays for compilation; the
    reset before each user undoes these steps."""
    batches = list(task.batches(train, params.personal_batch_size, streams.rng(seed, "energy/warm-up")))[:steps]
    for trainer in trainers.values():
        trainer.reset(weights)
        for x, y in batches:
            trainer.step(x, y)


def _personalize_user(params, task, trainers, models, env: Setup, data, seed, user, governor, evaluate) -> list[dict]:
    train, test = data
    weights = models.weights[seed]
    before = None
    if evaluate:
        models.model.set_weights(weights)
        before = task.evaluate(models.model, test)["top_k_eff"]
    rows = []
    for variant, trainer in trainers.items():
        trainer.reset(weights)
        trainer.timer = StepTimer(trainer.timer.warmup)
        rng = streams.rng(seed, f"personal/{user}")
        start_epoch, start = time.time(), time.perf_counter()
        with measuring(env.measured) as readings:
            history = trainer.fit(train, params.personal_epochs, params.personal_batch_size, rng)
        seconds, stop_epoch = time.perf_counter() - start, time.time()
        steps = sum(h["steps"] for h in history)
        steady = trainer.timer.steady()
        if not np.isfinite(steady):  # fewer steps than the warm-up: all of them
            steady = float(np.mean(trainer.timer.durations))
        tokens, flops = _counted_flops(models.model, trainer.variables, task, train, params, seed, user,
                                       models.model.output_shape[-1])
        row = {"governor": governor, "seed": seed, "user": user, "variant": variant, "steps": steps, "tokens": tokens,
               "gflops": flops / 1e9, "trained_parameters": int(sum(v.shape.num_elements() for v in trainer.variables)),
               "steady_step_seconds": steady, "train_seconds": seconds,
               "start_time_epoch": start_epoch, "stop_time_epoch": stop_epoch, "_readings": readings}
        if evaluate:
            row.update(top_k_eff_global=before, top_k_eff_personalized=task.evaluate(trainer.model, test)["top_k_eff"])
        rows.append(row)
    return rows


def measure_phone(params: Params, env: Setup, log=print) -> pd.DataFrame | None:
    """The exported training job on a phone, under each governor set over adb, metered by the
    battery. Needs `android_job`, a rooted phone and adb; otherwise None (the backends table says why)."""
    if not env.phone[0]:
        return None
    adb = Adb(params.android_serial or None)
    meter, cpufreq = AndroidBatteryMeter(adb), phone_cpufreq(adb)
    rows, settings = [], []
    for governor in params.governors:
        setting = cpufreq.setting_for(governor)
        with cpufreq.use(setting) as applied:
            applied["governor"] = governor
            settings.append(applied)
            for variant in VARIANTS:
                command = params.android_job.format(variant=variant, governor=setting.governor or governor)
                with measuring([meter]) as readings:
                    run_job(adb, command)
                r = readings[meter.name]
                rows.append({"meter": meter.name, "label": MEASURED, "governor": governor,
                             "governor_detail": f"set on the phone: {setting.governor or setting.name}", "variant": variant,
                             "energy_j": r.joules, "seconds": r.seconds, "samples": r.samples})
                log(f"phone, {governor}, {variant}: {r.joules:.1f} J over {r.seconds:.1f} s")
    table = pd.DataFrame(rows)
    base = table[(table.variant == "full") & (table.governor == BASELINE_GOVERNOR)].iloc[0]
    table = table.assign(energy_norm=table.energy_j / base.energy_j, time_norm=table.seconds / base.seconds)
    table.attrs["settings"] = settings  # what was set on the phone, for run.json
    return table


def export_models(params: Params, models: GlobalModels) -> dict[str, bytes]:
    """Trainable TFLite files of both variants from the first seed's global model: what a phone
    harness pushes and runs as the training job."""
    if not params.export_tflite:
        return {}
    from ondevice.device import tflite

    task, out = NextWordTask(params.k), {}
    for variant, hooks in (("full", []), ("fine_tune", [FineTune()])):
        models.model.set_weights(models.weights[params.seed])
        out[f"deeptype_{variant}_trainable.tflite"] = tflite.convert(
            tflite.TrainableModel(models.model, task, params.personal_learning_rate, params.optimizer, hooks))
    return out


# ---- tables -------------------------------------------------------------------------------

def runs_table(runs: list[dict]) -> pd.DataFrame:
    return pd.DataFrame([{k: v for k, v in r.items() if not k.startswith("_")} for r in runs])


def energy_table(runs: list[dict], env: Setup) -> pd.DataFrame:
    """One row per (meter, governor, seed, user, variant): joules and seconds, each labelled
    measured or modelled, and both normalised to the same meter's un-optimised run on the
    default governor for the same seed and user."""
    p, rows = env.params, []
    for r in runs:
        key = {k: r[k] for k in ("seed", "user", "variant")}
        for name, reading in r["_readings"].items():
            rows.append({"meter": name, "label": reading.label, "governor": r["governor"],
                         "governor_detail": dict((g, how) for g, _, how in env.passes).get(r["governor"], ""), **key,
                         "energy_j": reading.joules, "seconds": reading.seconds, "samples": reading.samples,
                         "note": reading.note})
        if r["governor"] != BASELINE_GOVERNOR:
            continue  # the modelled meter models the baseline pass under every governor
        for governor in p.governors:
            meter = env.modelled_meter(env.device.default_governor if governor == BASELINE_GOVERNOR else governor)
            if p.modelled_cpu_time == "measured":
                busy = r["steady_step_seconds"] * r["steps"]
            else:
                busy = r["gflops"] * 1e9 / (p.flops_per_cycle * env.model.ref_khz * 1e3)
            reading = meter.reading_for(busy)
            rows.append({"meter": "modelled", "label": MODELLED, "governor": governor, "governor_detail": reading.note,
                         **key, "energy_j": reading.joules, "seconds": reading.seconds, "samples": reading.samples,
                         "note": f"{env.device.name} profile x {env.busy_source()}"})
    table = pd.DataFrame(rows)
    base = table[(table.variant == "full") & (table.governor == BASELINE_GOVERNOR)]
    base = base.set_index(["meter", "seed", "user"])[["energy_j", "seconds"]]
    joined = table.join(base, on=["meter", "seed", "user"], rsuffix="_base")
    table["energy_norm"] = joined.energy_j / joined.energy_j_base
    table["time_norm"] = joined.seconds / joined.seconds_base
    return table


def _per_seed(energy: pd.DataFrame) -> pd.DataFrame:
    """Per meter and seed: median over users of energy and time, normalised by the medians of the
    un-optimised runs on the default governor (the bars of Fig. 9b)."""
    med = energy.groupby(["meter", "label", "governor", "variant", "seed"], as_index=False)[["energy_j", "seconds"]].median()
    base = med[(med.variant == "full") & (med.governor == BASELINE_GOVERNOR)].set_index(["meter", "seed"])
    joined = med.join(base[["energy_j", "seconds"]], on=["meter", "seed"], rsuffix="_base")
    return med.assign(energy_norm=joined.energy_j / joined.energy_j_base, time_norm=joined.seconds / joined.seconds_base)


def summary_table(energy: pd.DataFrame) -> pd.DataFrame:
    per_seed = _per_seed(energy)
    out = per_seed.groupby(["meter", "label", "governor", "variant"], as_index=False, sort=False).agg(
        seeds=("seed", "nunique"), energy_norm=("energy_norm", "mean"), time_norm=("time_norm", "mean"),
        energy_j_median=("energy_j", "mean"), seconds_median=("seconds", "mean"))
    return out


def accuracy_table(runs: list[dict]) -> pd.DataFrame:
    rows = [r for r in runs if "top_k_eff_personalized" in r]
    table = pd.DataFrame([{"seed": r["seed"], "user": r["user"], "variant": r["variant"],
                           "top_k_eff_global": r["top_k_eff_global"], "top_k_eff": r["top_k_eff_personalized"]} for r in rows])
    wide = table.pivot_table(index=["seed", "user", "top_k_eff_global"], columns="variant", values="top_k_eff").reset_index()
    return wide.rename(columns={"full": "top_k_eff_full", "fine_tune": "top_k_eff_fine_tune"})[
        ["seed", "user", "top_k_eff_global", "top_k_eff_full", "top_k_eff_fine_tune"]]


def _paired(energy: pd.DataFrame, meter: str, governor: str, variant: str, column: str) -> np.ndarray:
    """(seeds, users) array of one meter's values, users in a fixed order."""
    sel = energy[(energy.meter == meter) & (energy.governor == governor) & (energy.variant == variant)]
    return sel.pivot(index="seed", columns="user", values=column).sort_index().sort_index(axis=1).to_numpy(float)


def direction_claims(energy: pd.DataFrame, params: Params) -> pd.DataFrame:
    """The paper's claims that come without a number (Fig. 9b's powersave bars are not given in
    the text), judged like the effects: paired bootstrap over users, for every meter that ran
    under both governors."""
    rows = []
    for meter in sorted(energy.meter.unique()):
        sub = energy[energy.meter == meter]
        label = sub.label.iloc[0]
        for g in params.governors:
            if g == BASELINE_GOVERNOR or g not in set(sub.governor):
                continue
            said = g in ("powersave", "lowest")  # the papers' powersave is the lowest frequency
            less, more = ("less energy (Fig. 9b; AutLearn Fig. 9)", "more time (Fig. 9b; AutLearn Fig. 9)") if said \
                else ("not in the paper", "not in the paper")
            checks = (
                (f"{g} lowers the energy of optimised training", less, ("default", "fine_tune", "energy_j"), (g, "fine_tune", "energy_j")),
                (f"{g} lowers the energy of un-optimised training", less, ("default", "full", "energy_j"), (g, "full", "energy_j")),
                (f"{g} makes optimised training take longer", more, (g, "fine_tune", "seconds"), ("default", "fine_tune", "seconds")),
                (f"optimisation lowers the energy of training under {g}", "not stated (only on the default governor)",
                 (g, "full", "energy_j"), (g, "fine_tune", "energy_j")),
            )
            for claim, paper, better, worse in checks:
                r = claims.paired_effect(_paired(energy, meter, *better), _paired(energy, meter, *worse),
                                         streams.rng(params.seed, f"bootstrap/{meter}/{claim}"), n_boot=params.bootstrap)
                rows.append({"effect": claim, "meter": meter, "label": label, "paper": paper, "our change": r["change"],
                             "ci low": r["ci_low"], "ci high": r["ci_high"], "users": r["users"], "seeds": r["seeds"],
                             "users improved": r["users_improved"], "users worse": r["users_worse"],
                             "sign test p": r["sign_test_p"], "verdict": r["verdict"], "level": 0.95})
    return pd.DataFrame(rows)


def direction_text(table: pd.DataFrame) -> str:
    """Markdown bullets for the claims without numbers, saying which are modelled."""
    lines = []
    for _, r in table.iterrows():
        how = " (**modelled**, not measured)" if r["label"] == MODELLED else ""
        lines.append(f"- **{r['effect']}** [{r['meter']}]: {r['verdict']}{how}: {claims.percent(r['our change'])} "
                     f"(95% interval {claims.percent(r['ci low'])} to {claims.percent(r['ci high'])}); the paper: {r['paper']}.")
    return "\n".join(lines)


def conclude(params: Params, corpus: Corpus, models: GlobalModels, env: Setup, runs: list[dict], settings: list[dict],
             phone: pd.DataFrame | None, flatbuffers: dict[str, bytes], wall_time_s: float) -> record.Result:
    """Tables (energy by meter, labelled), headline numbers of the primary meter over seeds, the
    paper's numbers beside ours, the effects and the direction-only claims."""
    energy = energy_table(runs, env)
    external = None
    if params.external_csv and "external-csv" not in energy.meter.values:
        with contextlib.suppress(OSError, ValueError):  # a log not written yet: the windows table has the times
            log = PowerLog.read_csv(params.external_csv, params.external_columns, params.external_time_origin)
            external = window_energies(log, windows_table(runs).rename(
                columns={"start_time_epoch": "start_epoch_s", "stop_time_epoch": "stop_epoch_s"}))
    per_seed = _per_seed(energy)
    accuracy = accuracy_table(runs)
    primary = per_seed[per_seed.meter == env.primary]

    def series(governor, variant, column):
        sel = primary[(primary.governor == governor) & (primary.variant == variant)].sort_values("seed")
        return sel[column].tolist()

    per_seed_values = {
        "energy saved by optimisation, default governor": [1 - v for v in series("default", "fine_tune", "energy_norm")],
        "energy, optimised, default governor": series("default", "fine_tune", "energy_norm"),
        "training time, fine-tune": series("default", "fine_tune", "time_norm"),
    }
    for g in params.governors:
        if g != BASELINE_GOVERNOR and g in set(primary.governor):
            for variant, name in (("full", "un-optimised"), ("fine_tune", "optimised")):
                per_seed_values[f"energy, {name}, {g}"] = series(g, variant, "energy_norm")
            per_seed_values[f"training time, optimised, {g}"] = series(g, "fine_tune", "time_norm")
    acc = accuracy.groupby("seed")[["top_k_eff_global", "top_k_eff_full", "top_k_eff_fine_tune"]].median()
    per_seed_values.update({"top-k-eff, global model": acc.top_k_eff_global.tolist(),
                            "top-k-eff, full training": acc.top_k_eff_full.tolist(),
                            "top-k-eff, fine-tune": acc.top_k_eff_fine_tune.tolist()})
    headline = {q: claims.headline(v) for q, v in per_seed_values.items()}
    ours = {q: h["value"] for q, h in headline.items()}
    ours.update({"energy, un-optimised, default governor": 1.0, "training time, full training": 1.0})
    numbers = claims.paper_vs_ours(PAPER, ours)
    label = MODELLED if env.primary == "modelled" else MEASURED
    numbers["ours from"] = ["TensorFlow on this machine" if q.startswith("top-k-eff") else env.primary_text()
                            for q in numbers.quantity]
    measured = {
        PAPER.effects[0].claim: (_paired(energy, env.primary, "default", "full", "energy_j"),
                                 _paired(energy, env.primary, "default", "fine_tune", "energy_j")),
        PAPER.effects[1].claim: (_paired(energy, env.primary, "default", "full", "seconds"),
                                 _paired(energy, env.primary, "default", "fine_tune", "seconds")),
    }
    effects = claims.effects_table(PAPER, measured, streams.rng(params.seed, "bootstrap"), n_boot=params.bootstrap)
    effects.insert(1, "meter", env.primary_text())
    tables = {
        "backends": env.backends_table(), "governors": env.governors_table(), "cpufreq": cpufreq_table(env),
        "profile_efficiency": efficiency_table(env), "runs": runs_table(runs).drop(columns=["start_time_epoch", "stop_time_epoch"]),
        "windows": windows_table(runs), "energy": energy, "summary": summary_table(energy), "accuracy": accuracy,
        "headline": claims.headline_table(headline), "paper_vs_ours": numbers, "effects": effects,
        "direction_claims": direction_claims(energy, params),
    }
    if phone is not None:
        tables["phone"] = phone
    if external is not None:
        tables["external_windows"] = external
    measured_paths = sorted({b.name for b in env.backends if b.available} | ({"cpufreq"} if len(env.passes) > 1 else set())
                            | ({"android-battery"} if phone is not None else set()))
    profile = env.model.profile
    return record.Result(
        experiment=NAME, params=params.to_dict(), tables=tables, headline=headline, models=flatbuffers,
        artifacts={"split.json": corpus.split.to_dict()},
        data=[corpus.manifest.summary()], stand_in_data=corpus.manifest.stand_in_for, wall_time_s=wall_time_s,
        notes={"primary_meter": env.primary, "primary_label": label, "measured_on_hardware": measured_paths,
               "modelled_only": not measured_paths, "busy_time": env.busy_source(),
               "cpufreq": {"usable": env.cpufreq_status[0], "status": env.cpufreq_status[1], "settings": settings},
               "phone_cpufreq": phone.attrs.get("settings") if phone is not None else None,
               "power_profile": {"device": env.device.name, "file": profile.path, "sha256": profile.sha256,
                                 "form": profile.form, "source": env.device.source, "voltage": params.voltage},
               "energy_users": energy_users(params, corpus), "seeds": params.seed_list,
               "global_models_from_cache": models.from_cache, "split_digest": corpus.split.digest},
    )


FAKES = {
    "cpufreq": "governor set/restore on temporary sysfs trees (after an exception, SIGINT and SIGTERM too)",
    "rapl": "temporary powercap trees, counter wrap-around and the poller thread",
    "nvml": "a fake NVML module",
    "zeus": "a fake ZeusMonitor",
    "android-battery": "a fake phone behind the adb runner (battery sampling, governors over adb, the job)",
    "external-csv": "CSV logs written by the tests (Monsoon column names, timestamps)",
}


def hardware_note(result: record.Result) -> str:
    """The closing note: which paths ran on real hardware in this run, and which were only
    exercised against fakes (by tests/test_energy_*.py)."""
    notes, backends = result.notes, result.tables["backends"]
    real = notes["measured_on_hardware"]
    why = dict(zip(backends.meter, backends.detail))
    why["cpufreq"] = notes["cpufreq"]["status"]
    lines = [f"- **Headline numbers**: {result.tables['effects']['meter'].iloc[0]}."]
    if real:
        lines.append(f"- **Ran on real hardware in this run**: {', '.join(real)}.")
    else:
        lines.append("- **Nothing was measured on real hardware in this run**: every energy number is modelled "
                     f"({notes['power_profile']['device']} power profile x {notes['busy_time']}), and the "
                     "governors are modelled, not set.")
    for path, fake in FAKES.items():
        if path not in real:
            lines.append(f"- `{path}`: not run here ({why.get(path, why.get(path + ' (phone job)', 'not requested (parameter meters)'))}); "
                         f"tested only against fakes: {fake}.")
    return "\n".join(lines)


def cpufreq_table(env: Setup) -> pd.DataFrame:
    ok, why = env.cpufreq_status
    rows = env.cpufreq.table() if ok else []
    return pd.DataFrame(rows) if rows else pd.DataFrame([{"policy": "(none)", "status": why}])


def efficiency_table(env: Setup) -> pd.DataFrame:
    table = pd.DataFrame(env.model.profile.efficiency(env.params.voltage))
    roles = {env.model.khz(g): g for g in env.params.governors[::-1]}
    table["governor"] = [roles.get(k, "") for k in table.khz]
    table["label"] = MODELLED
    return table


def windows_table(runs: list[dict]) -> pd.DataFrame:
    """Start and stop of every training window on this machine's clock (epoch seconds): what an
    external meter's log is matched against, also after the session (external.window_energies)."""
    return pd.DataFrame([{k: r[k] for k in ("governor", "seed", "user", "variant", "start_time_epoch", "stop_time_epoch")}
                         for r in runs])


def run(params: Params, speeches=None, log=print) -> record.Result:
    """All stages in order, as the notebook runs them."""
    start = time.perf_counter()
    corpus = load_corpus(params, speeches, log)
    env = setup(params, log)
    models = train_global(params, corpus, log)
    runs, settings = personalize(params, corpus, models, env, log)
    phone = measure_phone(params, env, log)
    flatbuffers = export_models(params, models)
    return conclude(params, corpus, models, env, runs, settings, phone, flatbuffers, time.perf_counter() - start)


# ---- figures ------------------------------------------------------------------------------

def plot_energy(energy: pd.DataFrame, phone: pd.DataFrame | None = None):
    """Fig. 9b: energy and time of both variants under each governor, normalised to un-optimised
    training on the default governor; one column per meter, titled measured or modelled. Bars:
    the normalised medians over users (mean over seeds); dots: single users."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    frames = [energy]
    if phone is not None:
        frames.append(phone.assign(seed=0, user="phone job"))
    data = pd.concat(frames, ignore_index=True)
    data["training"] = data.variant.map(VARIANTS)
    bars = _per_seed(data).groupby(["meter", "label", "governor", "variant"], as_index=False)[["energy_norm", "time_norm"]].mean()
    bars["training"] = bars.variant.map(VARIANTS)
    meters_ = list(dict.fromkeys(data.meter))
    fig, axes = plt.subplots(len(meters_), 2, figsize=(9, 3.4 * len(meters_) + 0.6), squeeze=False)
    palette = {VARIANTS["full"]: "#8c8c8c", VARIANTS["fine_tune"]: "#d1495b"}
    for i, meter in enumerate(meters_):
        first = data[data.meter == meter].iloc[0]
        source = f"modelled: {first.note}" if first.label == MODELLED else f"{meter} (measured)"
        order = list(dict.fromkeys(data[data.meter == meter].governor))
        for j, (col, what) in enumerate((("energy_norm", "energy"), ("time_norm", "training time"))):
            ax = axes[i, j]
            sns.barplot(data=bars[bars.meter == meter], x="governor", y=col, hue="training", order=order,
                        hue_order=list(VARIANTS.values()), palette=palette, ax=ax, legend=(i == 0 and j == 0))
            sns.stripplot(data=data[data.meter == meter], x="governor", y=col, hue="training", order=order,
                          hue_order=list(VARIANTS.values()), dodge=True, palette=palette, size=3, alpha=0.6,
                          edgecolor="white", linewidth=0.4, ax=ax, legend=False)
            ax.axhline(1, color="0.5", lw=0.8, ls="--")
            ax.set(xlabel="governor", ylabel=f"normalised {what}", title=f"{what}, {source}" if j == 0 else what)
            ax.title.set_fontsize(9)
    if axes[0, 0].get_legend() is not None:
        sns.move_legend(axes[0, 0], "upper left", title="", frameon=False, fontsize=8)
    fig.suptitle("Energy and time of personal training, normalised to un-optimised on the default governor", y=1.0)
    sns.despine(fig)
    fig.tight_layout()
    return fig


def plot_profile(efficiency: pd.DataFrame, device: str):
    """The modelled device's running current and energy per cycle at each speed: why a lower
    frequency does or does not save energy on compute-bound work in the model."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    mhz = efficiency.khz / 1000
    ax.plot(mhz, efficiency.uj_per_mcycle, marker="o", color="#2e4057")
    for row in efficiency[efficiency.governor != ""].itertuples():
        ax.annotate(row.governor, (row.khz / 1000, row.uj_per_mcycle), xytext=(0, 8), textcoords="offset points",
                    ha="center", fontsize=8, color="#d1495b")
    ax.margins(y=0.15)
    ax.set(xlabel="CPU speed (MHz)", ylabel="energy per 10^6 cycles (uJ)",
           title=f"{device} power profile (modelled): energy per cycle at each speed")
    sns.despine(fig)
    fig.tight_layout()
    return fig
