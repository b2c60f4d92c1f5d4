"""Intel/AMD RAPL energy counters through Linux powercap sysfs (`/sys/class/powercap/intel-rapl*`).

Each zone's `energy_uj` counts microjoules and wraps at `max_energy_range_uj`, so a window's
energy is the sum of deltas taken modulo that range. One wrap between two reads is harmless; two
are not, so a poller thread reads every `poll_s` seconds during the window (a package at 200 W
wraps a 262 kJ range in about 22 minutes, some AMD zones in seconds). By default the package
and DRAM zones are summed; `core`, `uncore` and `psys` overlap the package and are left out.
On Linux 5.10 and later `energy_uj` is readable by root only (CVE-2020-8694). The sysfs root is
a parameter, so tests drive the meter with a temporary tree.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .base import MEASURED, MeterUnavailable, Reading, SamplingMeter

POWERCAP = "/sys/class/powercap"


@dataclass(frozen=True)
class Zone:
    name: str  # e.g. package-0, dram
    path: str
    max_range_uj: int

    @property
    def label(self) -> str:  # unique even with several packages: package-0, dram@intel-rapl:0:2
        return self.name if self.name.startswith("package") else f"{self.name}@{Path(self.path).name}"


def find_zones(root: str = POWERCAP, kinds: tuple[str, ...] = ("package", "dram")) -> list[Zone]:
    """RAPL zones under `root` whose name starts with one of `kinds`, each once (the flat
    `intel-rapl:N:M` links and the nested directories are the same zones)."""
    found, seen = [], set()
    base = Path(root)
    candidates = list(base.glob("intel-rapl*")) + list(base.glob("intel-rapl*/intel-rapl*"))
    for d in sorted(candidates):
        real = os.path.realpath(d)
        if real in seen or not (d / "energy_uj").exists() or not (d / "name").exists():
            continue
        seen.add(real)
        name = (d / "name").read_text().strip()
        if any(name.startswith(k) for k in kinds):
            found.append(Zone(name, str(d), int((d / "max_energy_range_uj").read_text().strip())))
    return found


class RaplMeter(SamplingMeter):
    name = "rapl"
    label = MEASURED
    description = "CPU package + DRAM energy counters (Linux powercap RAPL)"

    def __init__(
        self,
        root: str = POWERCAP,
        kinds: tuple[str, ...] = ("package", "dram"),
        poll_s: float | None = 1.0,
        clock=time.monotonic,
    ):
        self.root, self.kinds, self.poll_s, self.clock = root, kinds, poll_s, clock
        self._zones: list[Zone] = []
        super().__init__()

    def status(self) -> tuple[bool, str]:
        if not Path(self.root).is_dir():
            return False, f"{self.root} is absent (no powercap: not Linux, a VM, or RAPL not exposed)"
        zones = find_zones(self.root, self.kinds)
        if not zones:
            return False, f"no RAPL zones named {'/'.join(self.kinds)} under {self.root}"
        try:
            for z in zones:
                self._read(z)
        except PermissionError:
            return False, "RAPL energy_uj is readable by root only (Linux >= 5.10, CVE-2020-8694)"
        return True, "zones " + ", ".join(z.label for z in zones)

    @staticmethod
    def _read(zone: Zone) -> int:
        with open(f"{zone.path}/energy_uj") as f:
            return int(f.read().strip())

    def start(self) -> None:
        ok, why = self.status()
        if not ok:
            raise MeterUnavailable(why)
        self._zones = find_zones(self.root, self.kinds)
        self._last = {z.path: self._read(z) for z in self._zones}
        self._total = {z.path: 0 for z in self._zones}
        self._samples, self._t0 = 1, self.clock()
        self._stop.clear()
        if self.poll_s:
            self._thread = threading.Thread(target=self._poll_loop, name="rapl-poller", daemon=True)
            self._thread.start()

    def poll(self) -> None:
        """Read every zone once and add the delta since the last read, modulo the zone's range."""
        with self._lock:
            for z in self._zones:
                now = self._read(z)
                self._total[z.path] += (now - self._last[z.path]) % z.max_range_uj
                self._last[z.path] = now
            self._samples += 1

    def _poll_loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.poll()

    def stop(self) -> Reading:
        self._end_thread()
        self.poll()
        seconds = self.clock() - self._t0
        parts = {z.label: self._total[z.path] / 1e6 for z in self._zones}
        return Reading(self.name, self.label, sum(parts.values()), seconds, self._samples, parts)

    def abort(self) -> None:
        self._end_thread()
