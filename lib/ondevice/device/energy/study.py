"""An energy study: training variants (the first one the baseline) run under CPU governors, each
training window measured by every meter that can run here and modelled with a device power
profile, and normalised to the baseline variant on the default governor (DeepType Fig. 9b,
AutLearn Fig. 9). The paper's training lives in the experiment; everything about meters,
governors, phones and the energy tables lives here.

- measured meters (`meters.py`): RAPL, NVML, Zeus, an external meter's CSV. With writable cpufreq
  the whole training repeats under each governor (set and restored per run); without it the
  governor is whatever the machine has.
- the modelled meter (`modelled.py`): busy time x the power profile. The default (performance-
  oriented) governor runs at `performance_khz`, `powersave` at `powersave_khz`, and time scales
  with the frequency ratio for compute-bound work (`compute_bound`). Busy time is the measured
  steady step time x steps (`modelled_cpu_time="measured"`) or counted FLOPs / (flops_per_cycle x
  frequency) (`"counted"`, which reproduces bit for bit).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ... import streams
from ...params import ParameterError, Params
from ...report import claims
from . import meters, profiles
from .android import Adb, AndroidBatteryMeter, phone_cpufreq, run_job
from .base import MEASURED, MODELLED, measuring
from .external import PowerLog, window_energies
from .governors import DEFAULT_ROOT, CpuFreq, CpuFreqError, Setting
from .modelled import GovernorModel, ModelledMeter
from .rapl import POWERCAP

BASELINE_GOVERNOR = "default"
PRIMARY_ORDER = ("rapl", "zeus", "nvml", "external-csv")  # "auto": the first measured one here, else modelled
KEYS = ["meter", "label", "governor", "variant", "seed"]


@dataclass(frozen=True)
class EnergyParams(Params):
    """The fields of an energy study (an experiment's Params derives from it too)."""

    governors: tuple[str, ...] = ("default", "powersave")  # "default" = the performance-oriented one;
    # also "performance", "lowest", "khz:N" (modelled at speed N)
    device_profile: str = "nexus6"  # power profile of the modelled meter (profiles.DEVICES)
    performance_khz: int = 0  # modelled speed of the default governor; 0 = the profile's top
    powersave_khz: int = 0  # modelled speed of powersave; 0 = the profile's lowest
    compute_bound: float = 1.0  # share of busy time that scales with 1/frequency
    nominal_voltage: float = 0.0  # V; 0 = the device's nominal battery voltage
    busy_cores: float = 1.0  # cores busy while training, in the model
    include_awake: bool = True  # charge the profile's awake current for the job's time
    modelled_cpu_time: str = "measured"  # measured (steady step time x steps) | counted (FLOPs)
    flops_per_cycle: float = 1.0  # counted time: sustained FLOPs per cycle of the modelled CPU
    meters: tuple[str, ...] = meters.MEASURED_METERS  # measured meters to try (unavailable ones are skipped)
    primary_meter: str = "auto"  # the meter behind the headline: auto | modelled | a measured one
    set_governors: bool = True  # with writable cpufreq, train under each governor for real
    cpufreq_root: str = DEFAULT_ROOT
    rapl_root: str = POWERCAP
    external_csv: str = ""  # an external meter's log (e.g. Monsoon CSV), matched by timestamp
    external_columns: tuple[str, ...] = ("time_s", "power_W")  # (time, power) or (time, current, voltage)
    external_time_origin: float = 0.0  # epoch seconds of the log's time zero (0: times are epoch seconds)
    android_serial: str = ""
    android_job: str = ""  # shell command on the phone; {variant} and {governor} filled in

    def check(self) -> None:
        for name in ("flops_per_cycle", "busy_cores"):
            self.require(getattr(self, name) > 0, name, "must be positive")
        self.require(self.nominal_voltage >= 0, "nominal_voltage", "must be >= 0 (0 = the device's)")
        self.require(0 <= self.compute_bound <= 1, "compute_bound", "must be in [0, 1]")
        self.require(self.modelled_cpu_time in ("measured", "counted"), "modelled_cpu_time", "must be measured|counted")
        self.require(BASELINE_GOVERNOR in self.governors, "governors", "must include 'default' (the baseline)")
        self.require(len(set(self.governors)) == len(self.governors), "governors", "must not repeat a governor")
        self.require(set(self.meters) <= set(meters.MEASURED_METERS), "meters", f"must be in {meters.MEASURED_METERS}")
        ok = self.primary_meter in ("auto", "modelled", *self.meters)
        self.require(ok, "primary_meter", "must be auto, modelled or one of `meters`")
        self.require(len(self.external_columns) in (2, 3), "external_columns", "must be (time, power) or (time, I, V)")
        devices = sorted(profiles.DEVICES)
        self.require(self.device_profile in devices, "device_profile", f"must be one of {devices}")
        try:
            for g in self.governors:
                self.governor_model().khz(g)
        except ValueError as exc:
            raise ParameterError(f"parameter 'governors' / '*_khz': {exc}") from exc

    def governor_model(self) -> GovernorModel:
        profile = profiles.device(self.device_profile).profile()
        return GovernorModel(profile, self.performance_khz, self.powersave_khz, 0, self.compute_bound)

    @property
    def voltage(self) -> float:
        return self.nominal_voltage or profiles.device(self.device_profile).nominal_voltage


@dataclass
class Setup:
    """Which meters run, which governor settings are applied for real, and the modelled device."""

    params: EnergyParams
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
        p, g = self.params, self.device.default_governor if governor == BASELINE_GOVERNOR else governor
        return ModelledMeter(self.model, g, p.voltage, p.busy_cores, p.include_awake, self.device.name)

    def busy_source(self) -> str:
        return {"measured": "steady-state step time x steps", "counted": "counted FLOPs"}[self.params.modelled_cpu_time]

    def primary_text(self) -> str:
        modelled = f"modelled: {self.device.name} power profile x {self.busy_source()}"
        return modelled if self.primary == "modelled" else f"measured: {self.primary}"

    def backends_table(self) -> pd.DataFrame:
        detail = f"{self.device.name}, {self.params.voltage:g} V, busy time = {self.busy_source()}"
        description = self.modelled_meter(self.device.default_governor).description
        phone = "phone battery over adb while the exported TFLite job trains"
        rows = [("modelled", MODELLED, description, True, detail)] + [tuple(b.row().values()) for b in self.backends]
        rows.append(("android-battery (phone job)", MEASURED, phone, *self.phone))
        table = pd.DataFrame(rows, columns=["meter", "label", "what it measures", "available", "detail"])
        used = np.where(table.available, "reported beside it", "skipped")
        return table.assign(**{"used for": np.where(table.meter == self.primary, "headline", used)})

    def governors_table(self) -> pd.DataFrame:
        hardware = {g: how for g, _, how in self.passes}
        default = lambda g: self.device.default_governor if g == BASELINE_GOVERNOR else g  # noqa: E731
        why = f"not set ({self.cpufreq_status[1]})"
        rows = [(g, self.model.describe(default(g)), hardware.get(g, why)) for g in self.params.governors]
        return pd.DataFrame(rows, columns=["governor", "modelled as", "on this machine"])

    def cpufreq_table(self) -> pd.DataFrame:
        ok, why = self.cpufreq_status
        rows = self.cpufreq.table() if ok else []
        return pd.DataFrame(rows) if rows else pd.DataFrame([{"policy": "(none)", "status": why}])

    def efficiency_table(self) -> pd.DataFrame:
        table = pd.DataFrame(self.model.profile.efficiency(self.params.voltage))
        roles = {self.model.khz(g): g for g in self.params.governors[::-1]}
        return table.assign(governor=[roles.get(k, "") for k in table.khz], label=MODELLED)

    def passes_run(self, settings: list, log=print):
        """Yields each governor with its setting applied (restored after the pass); appends what was
        set to `settings` (the dict the restore completes). A pass cpufreq refuses is skipped."""
        for governor, setting, how in self.passes:
            found = contextlib.nullcontext({"setting": None, "how": how})
            use = self.cpufreq.use(setting) if setting is not None else found
            try:
                with use as applied:
                    applied.update(governor=governor, how=how)  # the same dict: `restored` is set on the way out
                    settings.append(applied)
                    log(f"governor {governor}: {how}")
                    yield governor
            except CpuFreqError as exc:
                settings.append({"governor": governor, "how": how, "error": str(exc)})
                log(f"governor {governor}: skipped ({exc})")


def setup(params: EnergyParams, log=print) -> Setup:
    """Ask every meter whether it can run here, and cpufreq whether governors can be set."""
    device, adb = profiles.device(params.device_profile), Adb(params.android_serial or None)
    options = dict(external_csv=params.external_csv, external_columns=params.external_columns, adb=adb)
    options.update(rapl_root=params.rapl_root, external_time_origin=params.external_time_origin)
    backends = meters.discover(params.meters, **options)
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
    log(f"meters: modelled ({device.name} power profile){''.join(f', {n}' for n in available)}; headline: {primary}")
    log(f"cpufreq: {status[1]}" + ("" if passes[0][1] is not None else "; governors are modelled only"))
    return result


def _describe(setting: Setting) -> str:
    pinned = {None: "", "min": ", max frequency pinned to the minimum"}
    limits = pinned.get(setting.max_khz, f", max {setting.max_khz} kHz")
    return f"set: {setting.governor or 'governor left as found'}{limits}"


def measure_phone(params: EnergyParams, env: Setup, variants, log=print) -> pd.DataFrame | None:
    """The exported training job of each variant on a phone, under each governor set over adb,
    metered by the battery. Needs `android_job`, a rooted phone and adb; otherwise None."""
    if not env.phone[0]:
        return None
    adb = Adb(params.android_serial or None)
    meter, cpufreq, rows, settings = AndroidBatteryMeter(adb), phone_cpufreq(adb), [], []
    for governor in params.governors:
        setting = cpufreq.setting_for(governor)
        with cpufreq.use(setting) as applied:
            applied["governor"] = governor
            settings.append(applied)
            for variant in variants:
                with measuring([meter]) as readings:
                    run_job(adb, params.android_job.format(variant=variant, governor=setting.governor or governor))
                r = readings[meter.name]
                detail = f"set on the phone: {setting.governor or setting.name}"
                rows.append((meter.name, MEASURED, governor, detail, variant, r.joules, r.seconds, r.samples))
                log(f"phone, {governor}, {variant}: {r.joules:.1f} J over {r.seconds:.1f} s")
    table = pd.DataFrame(rows, columns=KEYS[:3] + ["governor_detail", "variant", "energy_j", "seconds", "samples"])
    base = table[(table.variant == variants[0]) & (table.governor == BASELINE_GOVERNOR)].iloc[0]
    table = table.assign(energy_norm=table.energy_j / base.energy_j, time_norm=table.seconds / base.seconds)
    table.attrs["settings"] = settings  # what was set on the phone, for run.json
    return table


ENERGY_COLUMNS = ["meter", "label", "governor", "governor_detail", "seed", "user", "variant", "energy_j", "seconds"]


def _normalised(table: pd.DataFrame, baseline: str, on: list[str]) -> pd.DataFrame:
    """`table` with energy and time divided by those of the `baseline` variant on the default governor."""
    base = table[(table.variant == baseline) & (table.governor == BASELINE_GOVERNOR)].set_index(on)
    joined = table.join(base[["energy_j", "seconds"]], on=on, rsuffix="_base")
    energy_norm, time_norm = joined.energy_j / joined.energy_j_base, joined.seconds / joined.seconds_base
    return table.assign(energy_norm=energy_norm, time_norm=time_norm)


def energy_table(runs: list[dict], env: Setup, baseline: str) -> pd.DataFrame:
    """One row per (meter, governor, seed, user, variant): joules and seconds, labelled measured or
    modelled, both normalised to the same meter's `baseline` variant on the default governor for
    the same seed and user. The modelled meter models the baseline pass under every governor."""
    p, rows, how = env.params, [], {g: h for g, _, h in env.passes}
    for r in runs:
        key = (r["seed"], r["user"], r["variant"])
        for name, x in r["_readings"].items():
            detail = how.get(r["governor"], "")
            rows.append((name, x.label, r["governor"], detail, *key, x.joules, x.seconds, x.samples, x.note))
        if r["governor"] != BASELINE_GOVERNOR:
            continue
        counted = r["gflops"] * 1e9 / (p.flops_per_cycle * env.model.ref_khz * 1e3)
        busy = r["steady_step_seconds"] * r["steps"] if p.modelled_cpu_time == "measured" else counted
        note = f"{env.device.name} profile x {env.busy_source()}"
        for governor in p.governors:
            x = env.modelled_meter(governor).reading_for(busy)
            rows.append(("modelled", MODELLED, governor, x.note, *key, x.joules, x.seconds, x.samples, note))
    table = pd.DataFrame(rows, columns=ENERGY_COLUMNS + ["samples", "note"])
    return _normalised(table, baseline, ["meter", "seed", "user"])


def per_seed(energy: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """Per meter and seed: medians over users of energy and time, normalised by the medians of the
    baseline variant on the default governor (the bars of Fig. 9b)."""
    medians = energy.groupby(KEYS, as_index=False)[["energy_j", "seconds"]].median()
    return _normalised(medians, baseline, ["meter", "seed"])


def summary_table(energy: pd.DataFrame, baseline: str) -> pd.DataFrame:
    means = dict(energy_norm=("energy_norm", "mean"), time_norm=("time_norm", "mean"))
    means.update(energy_j_median=("energy_j", "mean"), seconds_median=("seconds", "mean"))
    groups = per_seed(energy, baseline).groupby(KEYS[:4], as_index=False, sort=False)
    return groups.agg(seeds=("seed", "nunique"), **means)


def paired(energy: pd.DataFrame, meter: str, governor: str, variant: str, column: str) -> np.ndarray:
    """(seeds, users) array of one meter's values, users in a fixed order."""
    sel = energy[(energy.meter == meter) & (energy.governor == governor) & (energy.variant == variant)]
    return sel.pivot(index="seed", columns="user", values=column).sort_index().sort_index(axis=1).to_numpy(float)


EFFECT_COLUMNS = {"our change": "change", "ci low": "ci_low", "ci high": "ci_high", "users": "users", "seeds": "seeds"}
EFFECT_COLUMNS.update({"users improved": "users_improved", "users worse": "users_worse", "sign test p": "sign_test_p"})
EFFECT_COLUMNS["verdict"] = "verdict"
STATED = "not stated (only on the default governor)"


def direction_claims(energy: pd.DataFrame, params: EnergyParams, full: str, optimised: str, bootstrap: int):
    """The claims that come without a number (Fig. 9b's powersave bars are not given in the text),
    judged like effects (paired bootstrap over users) for every meter that ran under both governors."""
    rows = []
    for meter, sub in energy.groupby("meter"):
        for g in [g for g in params.governors if g != BASELINE_GOVERNOR and g in set(sub.governor)]:
            said = g in ("powersave", "lowest")  # the papers' powersave is the lowest frequency
            less = "less energy (Fig. 9b; AutLearn Fig. 9)" if said else "not in the paper"
            more = "more time (Fig. 9b; AutLearn Fig. 9)" if said else "not in the paper"
            energy_, time_, default = (optimised, "energy_j"), (optimised, "seconds"), BASELINE_GOVERNOR
            unoptimised = (full, "energy_j")
            checks = (
                (f"{g} lowers the energy of optimised training", less, (default, *energy_), (g, *energy_)),
                (f"{g} lowers the energy of un-optimised training", less, (default, *unoptimised), (g, *unoptimised)),
                (f"{g} makes optimised training take longer", more, (g, *time_), (default, *time_)),
                (f"optimisation lowers the energy of training under {g}", STATED, (g, *unoptimised), (g, *energy_)),
            )
            for claim, paper, better, worse in checks:
                rng = streams.rng(params.seed, f"bootstrap/{meter}/{claim}")
                pair = paired(energy, meter, *better), paired(energy, meter, *worse)
                r = claims.paired_effect(*pair, rng, n_boot=bootstrap)
                row = {"effect": claim, "meter": meter, "label": sub.label.iloc[0], "paper": paper}
                rows.append(row | {name: r[key] for name, key in EFFECT_COLUMNS.items()} | {"level": 0.95})
    return pd.DataFrame(rows)


def direction_text(table: pd.DataFrame) -> str:
    """Markdown bullets for the claims without numbers, saying which are modelled."""
    lines = []
    for _, r in table.iterrows():
        how, pct = " (**modelled**, not measured)" if r["label"] == MODELLED else "", claims.percent
        lines.append(
            f"- **{r['effect']}** [{r['meter']}]: {r['verdict']}{how}: {pct(r['our change'])} "
            f"(95% interval {pct(r['ci low'])} to {pct(r['ci high'])}); the paper: {r['paper']}."
        )
    return "\n".join(lines)


def windows_table(runs: list[dict]) -> pd.DataFrame:
    """Start and stop of every training window on this machine's clock (epoch seconds): what an
    external meter's log is matched against, also after the session (external.window_energies)."""
    keys = ("governor", "seed", "user", "variant", "start_time_epoch", "stop_time_epoch")
    return pd.DataFrame([{k: r[k] for k in keys} for r in runs])


def external_windows(params: EnergyParams, runs: list[dict], energy: pd.DataFrame) -> pd.DataFrame | None:
    """An external meter's log that was not read during the run, matched to the windows now."""
    if not params.external_csv or "external-csv" in energy.meter.values:
        return None
    with contextlib.suppress(OSError, ValueError):  # a log not written yet: the windows table has the times
        log = PowerLog.read_csv(params.external_csv, params.external_columns, params.external_time_origin)
        times = {"start_time_epoch": "start_epoch_s", "stop_time_epoch": "stop_epoch_s"}
        return window_energies(log, windows_table(runs).rename(columns=times))
    return None


FAKES = {
    "cpufreq": "governor set/restore on temporary sysfs trees (after an exception, SIGINT and SIGTERM too)",
    "rapl": "temporary powercap trees, counter wrap-around and the poller thread",
    "nvml": "a fake NVML module",
    "zeus": "a fake ZeusMonitor",
    "android-battery": "a fake phone behind the adb runner (battery sampling, governors over adb, the job)",
    "external-csv": "CSV logs written by the tests (Monsoon column names, timestamps)",
}


def hardware_note(result) -> str:
    """Which paths ran on real hardware in this run, and which were only exercised against fakes
    (by tests/test_energy_*.py)."""
    notes, backends = result.notes, result.tables["backends"]
    real, why = notes["measured_on_hardware"], dict(zip(backends.meter, backends.detail))
    why["cpufreq"] = notes["cpufreq"]["status"]
    lines = [f"- **Headline numbers**: {result.tables['effects']['meter'].iloc[0]}."]
    modelled = f"{notes['power_profile']['device']} power profile x {notes['busy_time']}"
    lines.append(
        f"- **Ran on real hardware in this run**: {', '.join(real)}."
        if real
        else "- **Nothing was measured "
        f"on real hardware in this run**: every energy number is modelled ({modelled}), and the governors "
        "are modelled, not set."
    )
    for path, fake in FAKES.items():
        if path not in real:
            reason = why.get(path, why.get(path + " (phone job)", "not requested (parameter meters)"))
            lines.append(f"- `{path}`: not run here ({reason}); tested only against fakes: {fake}.")
    return "\n".join(lines)


def plot_energy(energy: pd.DataFrame, phone: pd.DataFrame | None = None, variants: dict[str, str] | None = None):
    """Fig. 9b: energy and time of each variant under each governor, normalised to the baseline
    variant on the default governor; one row per meter, titled measured or modelled. Bars: the
    normalised medians over users (mean over seeds); dots: single users."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    phones = [phone.assign(seed=0, user="phone job")] if phone is not None else []
    data = pd.concat([energy, *phones], ignore_index=True)
    data["training"] = data.variant.map(variants)
    bars = per_seed(data, next(iter(variants))).groupby(KEYS[:4], as_index=False)[["energy_norm", "time_norm"]].mean()
    bars["training"] = bars.variant.map(variants)
    meter_names, hue = list(dict.fromkeys(data.meter)), list(variants.values())
    fig, axes = plt.subplots(len(meter_names), 2, figsize=(9, 3.4 * len(meter_names) + 0.6), squeeze=False)
    palette = dict(zip(hue, ("#8c8c8c", "#d1495b", "#00798c")))
    for i, meter in enumerate(meter_names):
        first, order = data[data.meter == meter].iloc[0], list(dict.fromkeys(data[data.meter == meter].governor))
        source = f"modelled: {first.note}" if first.label == MODELLED else f"{meter} (measured)"
        for j, (col, what) in enumerate((("energy_norm", "energy"), ("time_norm", "training time"))):
            ax, style = axes[i, j], dict(x="governor", y=col, hue="training", order=order, hue_order=hue)
            sns.barplot(data=bars[bars.meter == meter], ax=ax, legend=(i == 0 and j == 0), palette=palette, **style)
            dots = dict(dodge=True, size=3, alpha=0.6, edgecolor="white", linewidth=0.4, palette=palette)
            sns.stripplot(data=data[data.meter == meter], ax=ax, legend=False, **dots, **style)
            ax.axhline(1, color="0.5", lw=0.8, ls="--")
            ax.set(xlabel="governor", ylabel=f"normalised {what}", title=f"{what}, {source}" if j == 0 else what)
            ax.title.set_fontsize(9)
    if axes[0, 0].get_legend() is not None:
        sns.move_legend(axes[0, 0], "upper left", title="", frameon=False, fontsize=8)
    fig.suptitle("Energy and time of training, normalised to the baseline on the default governor", y=1.0)
    sns.despine(fig)
    fig.tight_layout()
    return fig


def plot_profile(efficiency: pd.DataFrame, device: str):
    """The modelled device's energy per cycle at each speed: why a lower frequency does or does not
    save energy on compute-bound work in the model."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    ax.plot(efficiency.khz / 1000, efficiency.uj_per_mcycle, marker="o", color="#2e4057")
    for row in efficiency[efficiency.governor != ""].itertuples():
        label = dict(xytext=(0, 8), textcoords="offset points", ha="center", fontsize=8, color="#d1495b")
        ax.annotate(row.governor, (row.khz / 1000, row.uj_per_mcycle), **label)
    ax.margins(y=0.15)
    ax.set(xlabel="CPU speed (MHz)", ylabel="energy per 10^6 cycles (uJ)")
    ax.set_title(f"{device} power profile (modelled): energy per cycle at each speed")
    sns.despine(fig)
    fig.tight_layout()
    return fig
