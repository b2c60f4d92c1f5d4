"""Every energy meter of the suite behind one interface, and which of them can run here.

| meter | label | what it reads |
|---|---|---|
| `rapl` | measured | CPU package + DRAM counters, Linux powercap (`rapl.py`) |
| `nvml` | measured | NVIDIA GPU total-energy counter (`nvml.py`, optional nvidia-ml-py) |
| `zeus` | measured | Zeus's monitor, an independent cross-check (`zeus_meter.py`, optional) |
| `android-battery` | measured | a phone's battery current x voltage over adb (`android.py`) |
| `external-csv` | measured | an external meter's log matched by timestamp (`external.py`) |
| `modelled` | modelled | CPU time x a device power profile (`modelled.py`, `profiles.py`) |

`discover` asks each one whether it can run and why not, for the notebook's backends table;
a measurement loop then uses the available ones together (`base.measuring`).
"""

from __future__ import annotations

from dataclasses import dataclass

from .android import Adb, AndroidBatteryMeter
from .base import MEASURED, MODELLED, Meter, MeterUnavailable, Reading, measuring
from .external import ExternalCsvMeter
from .modelled import GovernorModel, ModelledMeter
from .nvml import NvmlMeter
from .rapl import POWERCAP, RaplMeter
from .zeus_meter import ZeusMeter

__all__ = [
    "MEASURED",
    "MODELLED",
    "Meter",
    "MeterUnavailable",
    "Reading",
    "measuring",
    "GovernorModel",
    "ModelledMeter",
    "MEASURED_METERS",
    "Backend",
    "make",
    "discover",
]

MEASURED_METERS = ("rapl", "nvml", "zeus", "android-battery", "external-csv")


@dataclass
class Backend:
    name: str
    label: str
    description: str
    available: bool
    detail: str
    meter: Meter | None

    def row(self) -> dict:
        return {
            "meter": self.name,
            "label": self.label,
            "what it measures": self.description,
            "available": self.available,
            "detail": self.detail,
        }


def make(
    name: str,
    *,
    rapl_root: str = POWERCAP,
    adb: Adb | None = None,
    external_csv: str = "",
    external_columns: tuple[str, ...] = ("time_s", "power_W"),
    external_time_origin: float = 0.0,
) -> Meter | None:
    """A measured meter by name (None when it needs something not given, e.g. a CSV path)."""
    if name == "rapl":
        return RaplMeter(rapl_root)
    if name == "nvml":
        return NvmlMeter()
    if name == "zeus":
        return ZeusMeter()
    if name == "android-battery":
        return AndroidBatteryMeter(adb or Adb())
    if name == "external-csv":
        return ExternalCsvMeter(external_csv, external_columns, external_time_origin) if external_csv else None
    raise ValueError(f"unknown meter {name!r}; meters: {MEASURED_METERS}")


def discover(names: tuple[str, ...] = MEASURED_METERS, **options) -> list[Backend]:
    """Each named measured meter with whether it can run here and why (or why not)."""
    out = []
    for name in names:
        meter = make(name, **options)
        if meter is None:
            out.append(
                Backend(
                    name,
                    MEASURED,
                    "external power meter log (CSV), matched by timestamp",
                    False,
                    "no log given (parameter external_csv)",
                    None,
                )
            )
            continue
        try:
            ok, detail = meter.status()
        except MeterUnavailable as exc:
            ok, detail = False, str(exc)
        out.append(Backend(name, meter.label, meter.description, ok, detail, meter if ok else None))
    return out
