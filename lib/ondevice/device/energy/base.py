"""One interface for every energy meter: `start()`, then `stop()` -> a `Reading` with joules,
seconds, samples and a label, `measured` (a hardware counter or sensor) or `modelled` (CPU time
times a device power profile). Tables and figures carry the label, so a modelled number is
never mistaken for a measured one."""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from typing import Iterator

MEASURED, MODELLED = "measured", "modelled"


class MeterUnavailable(RuntimeError):
    """The meter cannot run here; the message says why (shown in the notebook's backends table)."""


@dataclass(frozen=True)
class Reading:
    meter: str
    label: str  # MEASURED or MODELLED
    joules: float
    seconds: float  # the window's length (modelled meters: the device's time)
    samples: int  # counter reads or sensor samples behind the number
    parts: dict[str, float] = field(default_factory=dict)  # joules per zone, GPU or component
    note: str = ""

    @property
    def watts(self) -> float:
        return self.joules / self.seconds if self.seconds > 0 else float("nan")


class Meter:
    """Subclasses set `name` and `label` and implement `status`, `start` and `stop`."""

    name = "meter"
    label = MEASURED
    description = ""

    def status(self) -> tuple[bool, str]:
        """(available, why or what): whether this meter can run here, in words."""
        return True, ""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> Reading:
        raise NotImplementedError

    def abort(self) -> None:
        """Stop without a reading (threads ended, devices released); safe to call twice."""
        with contextlib.suppress(Exception):
            self.stop()


@contextlib.contextmanager
def measuring(meters: list[Meter]) -> Iterator[dict[str, Reading]]:
    """Run the block inside one window of every meter; the dict fills with their readings when
    the block ends. On an exception every started meter is aborted (no poller thread left)."""
    readings: dict[str, Reading] = {}
    started: list[Meter] = []
    try:
        for m in meters:
            m.start()
            started.append(m)
        yield readings
    except BaseException:
        for m in reversed(started):
            m.abort()
        raise
    for m in reversed(started):
        readings[m.name] = m.stop()


class SamplingMeter(Meter):
    """A meter whose readings come from a background thread that samples until the window ends
    (RAPL's counter wrap-around poller, the phone's battery sampler): one place ends that thread."""

    def __init__(self):
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()

    def _end_thread(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
