"""An external power meter's log (a Monsoon exported as CSV, a USB power meter, a lab supply)
matched to our training windows by timestamp.

Such meters log on their own clock, often to a file exported after the session. We record each
window's start and stop (epoch seconds) while training; the log is read later and integrated
over each window. Columns are named by the caller: time plus power, or time plus current and
voltage; units come from the column names as meters write them ("Time(ms)", "Main(mA)",
"Main Voltage(V)", "power_mW"), else seconds, watts, amperes and volts. `time_origin` is the
epoch second of the log's time zero (0 when the log already holds epoch seconds);
`offset_s` corrects a known clock difference between the meter and this machine.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from .base import MEASURED, Meter, MeterUnavailable, Reading

_SCALE = {
    "us": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "uw": 1e-6,
    "mw": 1e-3,
    "w": 1.0,
    "ua": 1e-6,
    "ma": 1e-3,
    "a": 1.0,
    "uv": 1e-6,
    "mv": 1e-3,
    "v": 1.0,
}


def unit_scale(column: str, kind: str) -> float:
    """The factor to SI of a column from the unit in its name: (ms), _mA, [uV], ...; 1 when absent."""
    m = re.search(r"[(\[_ ]\s*([uµm]?)(s|W|A|V)\s*[)\]]?\s*$", column)
    if not m or m.group(2).lower() != kind:
        return 1.0
    return _SCALE[(m.group(1).replace("µ", "u") + m.group(2)).lower()]


@dataclass
class PowerLog:
    times_s: np.ndarray  # epoch seconds, increasing
    watts: np.ndarray
    source: str = ""

    @classmethod
    def read_csv(
        cls, path: str | Path, columns: tuple[str, ...], time_origin: float = 0.0, offset_s: float = 0.0
    ) -> "PowerLog":
        """`columns`: (time, power) or (time, current, voltage)."""
        if len(columns) not in (2, 3):
            raise ValueError(f"columns must be (time, power) or (time, current, voltage), got {columns}")
        frame = pd.read_csv(path)
        missing = [c for c in columns if c not in frame.columns]
        if missing:
            raise ValueError(f"{path}: no column(s) {missing}; columns are {list(frame.columns)}")
        t = frame[columns[0]].to_numpy(float) * unit_scale(columns[0], "s") + time_origin + offset_s
        if len(columns) == 2:
            watts = frame[columns[1]].to_numpy(float) * unit_scale(columns[1], "w")
        else:
            amps = frame[columns[1]].to_numpy(float) * unit_scale(columns[1], "a")
            watts = np.abs(amps) * frame[columns[2]].to_numpy(float) * unit_scale(columns[2], "v")
        order = np.argsort(t, kind="stable")
        return cls(t[order], watts[order], str(path))

    def energy_between(self, t0: float, t1: float) -> tuple[float, int]:
        """Joules from t0 to t1 (power interpolated at both ends) and the samples inside."""
        if t0 < self.times_s[0] or t1 > self.times_s[-1]:
            raise ValueError(
                f"window {t0:.3f}-{t1:.3f} is outside the log ({self.times_s[0]:.3f}-{self.times_s[-1]:.3f})"
            )
        inside = (self.times_s > t0) & (self.times_s < t1)
        t = np.concatenate([[t0], self.times_s[inside], [t1]])
        w = np.interp(t, self.times_s, self.watts)
        return float(np.sum(np.diff(t) * (w[1:] + w[:-1]) / 2)), int(inside.sum())


class ExternalCsvMeter(Meter):
    """Windows on this machine's clock, energy from the meter's log read when a window stops."""

    name = "external-csv"
    label = MEASURED
    description = "external power meter log (CSV), matched by timestamp"

    def __init__(
        self,
        path: str | Path,
        columns: tuple[str, ...],
        time_origin: float = 0.0,
        offset_s: float = 0.0,
        clock=time.time,
    ):
        self.path, self.columns, self.time_origin, self.offset_s, self.clock = (
            Path(path),
            columns,
            time_origin,
            offset_s,
            clock,
        )

    def status(self) -> tuple[bool, str]:
        if not self.path.is_file():
            return False, f"{self.path} does not exist"
        try:
            log = self.log()
        except ValueError as exc:
            return False, str(exc)
        return True, f"{self.path.name}: {len(log.times_s)} samples"

    def log(self) -> PowerLog:
        return PowerLog.read_csv(self.path, self.columns, self.time_origin, self.offset_s)

    def start(self) -> None:
        self._t0 = self.clock()

    def stop(self) -> Reading:
        t1 = self.clock()
        try:
            joules, samples = self.log().energy_between(self._t0, t1)
        except (OSError, ValueError) as exc:
            raise MeterUnavailable(f"external log {self.path}: {exc}") from exc
        return Reading(self.name, self.label, joules, t1 - self._t0, samples, {"external": joules})

    def abort(self) -> None:
        pass


def window_energies(log: PowerLog, windows: pd.DataFrame) -> pd.DataFrame:
    """Energy of every recorded window (columns start_epoch_s, stop_epoch_s) from a log read
    after the session; windows outside the log get NaN."""
    rows = []
    for w in windows.itertuples():
        try:
            joules, n = log.energy_between(w.start_epoch_s, w.stop_epoch_s)
        except ValueError:
            joules, n = float("nan"), 0
        rows.append({"energy_j": joules, "samples": n})
    return pd.concat([windows.reset_index(drop=True), pd.DataFrame(rows)], axis=1)
