"""Device power profiles in Android's `power_profile.xml` format, and the energy they imply.

The modelled meter charges CPU time the way Android's BatteryStats does: the current a profile
lists for each CPU frequency (mA) times the seconds spent there, times a nominal battery voltage.
Both forms of the file are read:

- before Android 8.1, one cluster: arrays `cpu.speeds` (kHz) and `cpu.active` (mA, additional
  while running at each speed), items `cpu.awake` (awake, a wakelock held, not running) and
  `cpu.idle` (power collapse);
- 8.1 and later, per cluster: `cpu.clusters.cores`, `cpu.core_speeds.clusterN` (kHz),
  `cpu.core_power.clusterN` (mA per running core at each speed), `cpu.cluster_power.clusterN`
  (mA while the cluster runs), plus `cpu.active` (mA while any CPU runs), `cpu.idle` (awake,
  idle) and `cpu.suspend`.

The energy *of a job* is what it adds to a suspended phone: the awake current for the whole
window plus the running current for its CPU time; the suspend floor is not charged.
"""

from __future__ import annotations

import hashlib
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Mapping

PRE_81, POST_81 = "pre-8.1 (cpu.speeds / cpu.active)", "8.1+ (cpu.core_speeds.clusterN / cpu.core_power.clusterN)"


@dataclass(frozen=True)
class Cluster:
    cores: int
    speeds_khz: tuple[int, ...]
    core_ma: tuple[float, ...]  # per running core at each speed
    cluster_ma: float = 0.0  # while the cluster runs (8.1+ form only)

    def index(self, khz: int) -> int:
        if khz not in self.speeds_khz:
            raise ValueError(f"{khz} kHz is not a speed of this cluster; speeds: {list(self.speeds_khz)}")
        return self.speeds_khz.index(khz)


@dataclass(frozen=True)
class PowerProfile:
    """The CPU part of a power profile; currents in mA, speeds in kHz."""

    clusters: tuple[Cluster, ...]
    active_ma: float  # while any CPU runs (8.1+ `cpu.active`; 0 in the old form, where it is per speed)
    awake_ma: float  # awake but not running (old `cpu.awake`, 8.1+ `cpu.idle`)
    suspend_ma: float  # power collapse (old `cpu.idle`, 8.1+ `cpu.suspend`); never charged to a job
    battery_mah: float | None
    form: str
    sha256: str = ""
    path: str = ""

    def speeds(self, cluster: int = 0) -> tuple[int, ...]:
        return self.clusters[cluster].speeds_khz

    def running_ma(self, khz: int, cluster: int = 0, cores: float = 1.0) -> float:
        """Current while `cores` cores of `cluster` run at `khz` (awake current not included)."""
        c = self.clusters[cluster]
        return self.active_ma + c.cluster_ma + cores * c.core_ma[c.index(khz)]

    def charge_mas(
        self, time_in_state: Mapping, wall_s: float | None = None, cores: float = 1.0, include_awake: bool = True
    ) -> float:
        """mA*s of a job: running current x seconds at each state, plus the awake current for the
        wall time (default: the summed state time, i.e. one busy core at a time).

        `time_in_state` maps kHz (cluster 0) or (cluster, kHz) to busy seconds.
        """
        busy, charge = 0.0, 0.0
        for state, seconds in time_in_state.items():
            cluster, khz = state if isinstance(state, tuple) else (0, state)
            if seconds < 0:
                raise ValueError(f"negative time {seconds} s at {state}")
            charge += self.running_ma(int(khz), cluster, cores) * seconds
            busy += seconds
        if include_awake:
            charge += self.awake_ma * (busy if wall_s is None else wall_s)
        return charge

    def energy_j(
        self,
        time_in_state: Mapping,
        voltage: float,
        wall_s: float | None = None,
        cores: float = 1.0,
        include_awake: bool = True,
    ) -> float:
        """Joules: mA*s x V / 1000 (the profile gives currents; `voltage` is the nominal battery voltage)."""
        if voltage <= 0:
            raise ValueError(f"voltage must be positive, got {voltage}")
        return self.charge_mas(time_in_state, wall_s, cores, include_awake) * voltage / 1000.0

    def efficiency(self, voltage: float, cluster: int = 0) -> list[dict]:
        """Per speed: running current and energy per million cycles (nJ/cycle x 1e6), the number
        that decides whether a lower frequency saves energy on compute-bound work."""
        c = self.clusters[cluster]
        return [
            {
                "khz": f,
                "running_ma": self.running_ma(f, cluster),
                "uj_per_mcycle": self.running_ma(f, cluster) * voltage / (f / 1000.0),
            }  # mA*V/MHz = uJ per 1e6 cycles
            for f in c.speeds_khz
        ]


def _parse_values(root: ET.Element) -> dict[str, float | list[float]]:
    values: dict[str, float | list[float]] = {}
    for el in root:
        name = el.get("name")
        if not name:
            continue
        if el.tag == "item":
            values[name] = float((el.text or "0").strip())
        elif el.tag == "array":
            values[name] = [float((v.text or "").strip()) for v in el.findall("value")]
    return values


def _scalar(values: dict, name: str, default: float = 0.0) -> float:
    v = values.get(name, default)
    if isinstance(v, list):  # some profiles write a one-element array
        if len(v) != 1:
            raise ValueError(f"{name} must be one value, got {v}")
        return v[0]
    return float(v)


def parse(text: str, path: str = "") -> PowerProfile:
    """A PowerProfile from the text of a power_profile.xml file, in either form."""
    values = _parse_values(ET.fromstring(text))
    digest = hashlib.sha256(text.encode()).hexdigest()
    battery = values.get("battery.capacity")
    battery = _scalar(values, "battery.capacity") if battery is not None else None
    if "cpu.clusters.cores" in values or "cpu.core_speeds.cluster0" in values:
        cores = values.get("cpu.clusters.cores", [1.0])
        cores = cores if isinstance(cores, list) else [cores]
        clusters = []
        for i, n in enumerate(cores):
            speeds, power = values.get(f"cpu.core_speeds.cluster{i}"), values.get(f"cpu.core_power.cluster{i}")
            if not isinstance(speeds, list) or not isinstance(power, list):
                raise ValueError(
                    f"cluster {i}: cpu.core_speeds.cluster{i} and cpu.core_power.cluster{i} must be arrays"
                )
            clusters.append(
                _cluster(int(n), speeds, power, _scalar(values, f"cpu.cluster_power.cluster{i}"), f"cluster{i}")
            )
        return PowerProfile(
            tuple(clusters),
            _scalar(values, "cpu.active"),
            _scalar(values, "cpu.idle"),
            _scalar(values, "cpu.suspend"),
            battery,
            POST_81,
            digest,
            path,
        )
    speeds, active = values.get("cpu.speeds"), values.get("cpu.active")
    if not isinstance(speeds, list) or not isinstance(active, list):
        raise ValueError(
            "not a CPU power profile: need cpu.speeds and cpu.active arrays "
            "(pre-8.1) or cpu.core_speeds.clusterN / cpu.core_power.clusterN (8.1+)"
        )
    return PowerProfile(
        (_cluster(1, speeds, active, 0.0, "cpu"),),
        0.0,
        _scalar(values, "cpu.awake"),
        _scalar(values, "cpu.idle"),
        battery,
        PRE_81,
        digest,
        path,
    )


def _cluster(cores: int, speeds: list[float], power: list[float], cluster_ma: float, what: str) -> Cluster:
    if len(speeds) != len(power) or not speeds:
        raise ValueError(f"{what}: {len(speeds)} speeds but {len(power)} power values")
    if any(b <= a for a, b in zip(speeds, speeds[1:])):
        raise ValueError(f"{what}: speeds must increase, got {speeds}")
    return Cluster(cores, tuple(int(s) for s in speeds), tuple(power), cluster_ma)


def load(path: str | Path) -> PowerProfile:
    path = Path(path)
    return parse(path.read_text(), str(path))


@dataclass(frozen=True)
class Device:
    """A phone whose profile ships with the suite, and what the profile file does not say."""

    name: str
    profile_file: str
    default_governor: str
    nominal_voltage: float  # V, the battery's nominal voltage (the profile gives mA only)
    source: str

    def profile(self) -> PowerProfile:
        ref = resources.files(__package__).joinpath("profiles", self.profile_file)
        return parse(ref.read_text(), f"ondevice/device/energy/profiles/{self.profile_file}")


DEVICES = {
    "nexus6": Device(
        "Nexus 6",
        "nexus6_power_profile.xml",
        "interactive",
        3.8,
        "AOSP device/moto/shamu overlay power_profile.xml (final AOSP version, 2016-04-29); "
        "3.8 V nominal battery voltage (3220 mAh Li-ion)",
    ),
}


def device(name: str) -> Device:
    if name not in DEVICES:
        raise ValueError(f"unknown device profile {name!r}; shipped: {sorted(DEVICES)}")
    return DEVICES[name]
