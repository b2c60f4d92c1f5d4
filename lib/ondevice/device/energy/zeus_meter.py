"""Zeus (`zeus` 0.16, Apache-2.0) as an optional cross-check on real hardware, not the core.

Zeus reads the same RAPL and NVML counters through its own code; running it beside our meters
over the same windows checks ours independently. It is not a dependency of the suite (it pulls
in amdsmi, scikit-learn, pydantic and more): `pip install zeus==0.16.0` to enable it.
"""

from __future__ import annotations

from .base import MEASURED, Meter, MeterUnavailable, Reading


def import_monitor():
    try:
        from zeus.monitor import ZeusMonitor
    except ImportError as exc:
        raise MeterUnavailable("zeus is not installed (optional cross-check: pip install zeus==0.16.0)") from exc
    return ZeusMonitor


class ZeusMeter(Meter):
    name = "zeus"
    label = MEASURED
    description = "Zeus ZeusMonitor (RAPL + NVML), an independent cross-check"
    _window = "ondevice"

    def __init__(self, monitor_class=None, gpu_indices: list[int] | None = None, cpu_indices: list[int] | None = None):
        self._cls, self.gpu_indices, self.cpu_indices = monitor_class, gpu_indices, cpu_indices
        self._monitor = None

    def _make(self):
        cls = self._cls or import_monitor()
        try:
            return cls(gpu_indices=self.gpu_indices, cpu_indices=self.cpu_indices)
        except Exception as exc:  # Zeus raises its own init errors when nothing can be measured
            raise MeterUnavailable(f"Zeus cannot measure here ({type(exc).__name__}: {exc})") from exc

    def status(self) -> tuple[bool, str]:
        try:
            self._make()
        except MeterUnavailable as exc:
            return False, str(exc)
        return True, "ZeusMonitor started"

    def start(self) -> None:
        self._monitor = self._make()
        # TensorFlow runs eagerly between our windows; no framework sync is needed
        self._monitor.begin_window(self._window, sync_execution=False)

    def stop(self) -> Reading:
        m = self._monitor.end_window(self._window, sync_execution=False)
        self._monitor = None
        parts = {f"gpu{i}": float(e) for i, e in (m.gpu_energy or {}).items()}
        parts.update({f"cpu{i}": float(e) for i, e in (m.cpu_energy or {}).items()})
        parts.update({f"dram{i}": float(e) for i, e in (m.dram_energy or {}).items()})
        return Reading(self.name, self.label, sum(parts.values()), float(m.time), 2, parts)

    def abort(self) -> None:
        if self._monitor is not None:
            try:
                self._monitor.end_window(self._window, sync_execution=False, cancel=True)
            finally:
                self._monitor = None
