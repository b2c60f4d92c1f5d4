"""NVIDIA GPU energy from NVML's total-energy counter (`nvmlDeviceGetTotalEnergyConsumption`,
millijoules since the driver loaded; Volta and newer).

The counter updates a few times a second, so windows of a second or more are needed for a
meaningful number; a shorter window is marked in the reading's note. `nvidia-ml-py` (module
`pynvml`) is optional and imported only when the meter is used; tests pass a fake module.
"""

from __future__ import annotations

import time

from .base import MEASURED, Meter, MeterUnavailable, Reading


def import_nvml():
    try:
        import pynvml
    except ImportError as exc:
        raise MeterUnavailable("nvidia-ml-py is not installed (optional: pip install nvidia-ml-py)") from exc
    return pynvml


class NvmlMeter(Meter):
    name = "nvml"
    label = MEASURED
    description = "GPU energy counter (NVML total energy, Volta or newer)"

    def __init__(
        self, indices: tuple[int, ...] | None = None, nvml=None, min_window_s: float = 1.0, clock=time.monotonic
    ):
        self.indices, self._nvml, self.min_window_s, self.clock = indices, nvml, min_window_s, clock
        self._handles: dict[int, object] = {}

    def _lib(self):
        if self._nvml is None:
            self._nvml = import_nvml()
        return self._nvml

    def _open(self) -> dict[int, object]:
        nv = self._lib()
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            raise MeterUnavailable(f"NVML cannot start ({exc}): no NVIDIA driver here") from exc
        try:
            count = nv.nvmlDeviceGetCount()
            indices = self.indices if self.indices is not None else tuple(range(count))
            if not indices:
                raise MeterUnavailable("no NVIDIA GPU")
            handles = {i: nv.nvmlDeviceGetHandleByIndex(i) for i in indices}
            for i, h in handles.items():
                try:
                    nv.nvmlDeviceGetTotalEnergyConsumption(h)
                except nv.NVMLError as exc:
                    raise MeterUnavailable(
                        f"GPU {i} ({_name(nv, h)}) has no total-energy counter ({exc}; needs Volta or newer)"
                    ) from exc
        except BaseException:
            nv.nvmlShutdown()
            raise
        return handles

    def status(self) -> tuple[bool, str]:
        try:
            handles = self._open()
        except MeterUnavailable as exc:
            return False, str(exc)
        nv = self._nvml
        names = ", ".join(f"GPU {i} {_name(nv, h)}" for i, h in handles.items())
        nv.nvmlShutdown()
        return True, names

    def _counters(self) -> dict[int, int]:
        return {i: int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(h)) for i, h in self._handles.items()}

    def start(self) -> None:
        self._handles = self._open()
        self._t0, self._e0 = self.clock(), self._counters()

    def stop(self) -> Reading:
        e1, seconds = self._counters(), self.clock() - self._t0
        self._nvml.nvmlShutdown()
        self._handles = {}
        parts = {f"gpu{i}": (e1[i] - self._e0[i]) / 1000.0 for i in e1}
        note = (
            ""
            if seconds >= self.min_window_s
            else f"window {seconds:.2f} s is shorter than {self.min_window_s} s: the counter may not have updated"
        )
        return Reading(self.name, self.label, sum(parts.values()), seconds, 2, parts, note)

    def abort(self) -> None:
        if self._handles:
            self._handles = {}
            self._nvml.nvmlShutdown()


def _name(nv, handle) -> str:
    try:
        name = nv.nvmlDeviceGetName(handle)
    except Exception:  # a name is only for messages
        return "?"
    return name.decode() if isinstance(name, bytes) else str(name)
