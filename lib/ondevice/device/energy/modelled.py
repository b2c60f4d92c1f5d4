"""Modelled energy: CPU time in each frequency state x a device power profile (`profiles.py`).

Without a phone, RAPL or writable cpufreq, energy can only be modelled, and every number says
so (label `modelled`). The model, and its choices (each a parameter):

- A governor decides where compute-bound work runs. A performance-oriented governor (Android's
  default `interactive`, Linux `schedutil`/`performance`) is modelled at one speed, the
  profile's top one unless `performance_khz` says otherwise; under sustained training
  `interactive` ramps to the top within tens of milliseconds. `powersave` runs at the lowest
  speed (`powersave_khz`). `khz:N` pins speed N.
- Busy time given at `reference_khz` (default: the performance speed) scales with the frequency
  ratio for the compute-bound share of the work (`compute_bound`, default 1: all of it):
  t(f) = t_ref x (c x f_ref / f + 1 - c).
- Joules = nominal voltage x (running current at f x busy seconds x busy cores, plus the awake
  current for the whole time), as BatteryStats charges CPU time (profiles.PowerProfile).

On this machine there is no cpufreq, so the time at another frequency is not measured but
scaled, and the energy is the profile's, not a measurement of anything.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from .base import MODELLED, Meter, Reading
from .profiles import PowerProfile

PERFORMANCE_NAMES = ("default", "interactive", "schedutil", "performance", "ondemand")


@dataclass(frozen=True)
class GovernorModel:
    """Where a governor keeps the CPU for compute-bound work, on the profile's speeds."""

    profile: PowerProfile
    performance_khz: int = 0  # 0: the top speed
    powersave_khz: int = 0  # 0: the lowest speed
    reference_khz: int = 0  # the speed the given busy time was taken at; 0: performance speed
    compute_bound: float = 1.0
    cluster: int = 0

    def __post_init__(self):
        speeds = self.profile.speeds(self.cluster)
        for name in ("performance_khz", "powersave_khz", "reference_khz"):
            v = getattr(self, name)
            if v and v not in speeds:
                raise ValueError(f"{name}={v} is not a speed of the profile: {list(speeds)}")
        if not 0 <= self.compute_bound <= 1:
            raise ValueError(f"compute_bound must be in [0, 1], got {self.compute_bound}")

    def khz(self, governor: str) -> int:
        speeds = self.profile.speeds(self.cluster)
        if governor in PERFORMANCE_NAMES:
            return self.performance_khz or speeds[-1]
        if governor in ("powersave", "lowest"):
            return self.powersave_khz or speeds[0]
        if governor == "highest":
            return speeds[-1]
        if governor.startswith("khz:") and int(governor[4:]) in speeds:
            return int(governor[4:])
        raise ValueError(
            f"no model for governor {governor!r}: use one of {PERFORMANCE_NAMES}, powersave, "
            f"lowest, highest or khz:N with N among {list(speeds)}"
        )

    @property
    def ref_khz(self) -> int:
        return self.reference_khz or self.khz("default")

    def seconds(self, governor: str, busy_s: float) -> float:
        c = self.compute_bound
        return busy_s * (c * self.ref_khz / self.khz(governor) + 1 - c)

    def time_in_state(self, governor: str, busy_s: float) -> dict[tuple[int, int], float]:
        return {(self.cluster, self.khz(governor)): self.seconds(governor, busy_s)}

    def describe(self, governor: str) -> str:
        return f"{governor} modelled at {self.khz(governor) / 1000:g} MHz"


class ModelledMeter(Meter):
    """A modelled 'meter': `reading_for(busy_s)` models given busy time; start/stop model this
    process's CPU time over the window (average parallelism = CPU seconds / wall seconds)."""

    name = "modelled"
    label = MODELLED

    def __init__(
        self,
        model: GovernorModel,
        governor: str = "default",
        voltage: float = 3.8,
        cores: float = 1.0,
        include_awake: bool = True,
        device: str = "",
        cpu_clock=time.process_time,
        clock=time.perf_counter,
    ):
        self.model, self.governor, self.voltage, self.cores = model, governor, voltage, cores
        self.include_awake, self.device = include_awake, device
        self.cpu_clock, self.clock = cpu_clock, clock
        self.description = f"CPU time x {device or 'device'} power profile ({model.profile.form})"
        model.khz(governor)  # an unknown governor fails here, not after a long window

    def status(self) -> tuple[bool, str]:
        return True, f"{self.device or 'profile'} {self.model.describe(self.governor)}, {self.voltage:g} V nominal"

    def reading_for(self, busy_s: float, cores: float | None = None) -> Reading:
        """Energy of `busy_s` seconds of work at the reference speed, run under this governor."""
        cores = self.cores if cores is None else cores
        states = self.model.time_in_state(self.governor, busy_s)
        seconds = sum(states.values())
        profile = self.model.profile
        running = profile.energy_j(states, self.voltage, cores=cores, include_awake=False)
        awake = profile.awake_ma * seconds * self.voltage / 1000.0 if self.include_awake else 0.0
        return Reading(
            self.name,
            self.label,
            running + awake,
            seconds,
            1,
            {"cpu running": running, "cpu awake": awake},
            self.model.describe(self.governor),
        )

    def start(self) -> None:
        self._c0, self._w0 = self.cpu_clock(), self.clock()

    def stop(self) -> Reading:
        cpu, wall = self.cpu_clock() - self._c0, self.clock() - self._w0
        return self.reading_for(wall, cores=cpu / wall if wall > 0 else 1.0)

    def abort(self) -> None:
        pass
