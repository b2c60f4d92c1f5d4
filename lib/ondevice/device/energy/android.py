"""An Android phone over adb: battery power sampled from sysfs, CPU governors set as root, and
the exported TFLite training job run on the phone.

- Power: `current_now` (uA) x `voltage_now` (uV) from `/sys/class/power_supply/battery/`,
  polled over `adb shell` every `interval_s` and integrated over the window (trapezoid). The
  battery sees the whole phone, screen and radios included, and USB charging hides the drain:
  connect adb over Wi-Fi (`adb tcpip`) and unplug, keep the screen off, and subtract an idle
  window. Vendors differ in the sign of `current_now`; its magnitude is used.
- Governors: the same `CpuFreq` code as on Linux, reading and writing sysfs through `adb shell`
  (writes through `su -c`, so the phone must be rooted). Old kernels (the Nexus 6's 3.10) have
  per-CPU `cpuN/cpufreq` directories, and `mpdecision` may hot-plug cores or override limits;
  `hold_services` stops such services for the run and starts them again afterwards.
- The job: a shell command (run over adb) or any callable; the on-device runner that executes
  the exported TFLite `train` signature is another module's business.

Every adb call goes through `runner(argv) -> stdout`, so tests drive all of it with a fake phone.
"""

from __future__ import annotations

import contextlib
import shlex
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

from .base import MEASURED, MeterUnavailable, Reading, SamplingMeter
from .governors import DEFAULT_ROOT, CpuFreq

BATTERY = "/sys/class/power_supply/battery"
_FAILURES = ("No such file", "Permission denied", "Invalid argument", "not found", "Read-only file system")


class AdbError(RuntimeError):
    pass


def subprocess_runner(argv: list[str], timeout: float = 120.0) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise AdbError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


class Adb:
    """`adb [-s serial] shell ...` through an injectable runner."""

    def __init__(self, serial: str | None = None, runner: Callable[[list[str]], str] | None = None, adb: str = "adb"):
        self.serial, self.adb = serial, adb
        self.runner = runner or subprocess_runner
        self._fake = runner is not None

    def _argv(self, *args: str) -> list[str]:
        return [self.adb, *(["-s", self.serial] if self.serial else []), *args]

    def shell(self, command: str) -> str:
        return self.runner(self._argv("shell", command))

    def devices(self) -> list[str]:
        out = self.runner([self.adb, "devices"])
        return [line.split()[0] for line in out.splitlines()[1:] if line.strip().endswith("device")]

    def status(self) -> tuple[bool, str]:
        if not self._fake and shutil.which(self.adb) is None:
            return False, "adb is not installed (no phone can be reached)"
        try:
            devices = self.devices()
        except (AdbError, OSError, subprocess.TimeoutExpired) as exc:
            return False, f"adb devices failed: {exc}"
        if not devices:
            return False, "no phone attached (adb devices lists none)"
        if self.serial and self.serial not in devices:
            return False, f"phone {self.serial} not attached (attached: {', '.join(devices)})"
        if not self.serial and len(devices) > 1:
            return False, f"several phones attached ({', '.join(devices)}): choose one by serial"
        return True, f"phone {self.serial or devices[0]}"

    def is_root(self) -> bool:
        with contextlib.suppress(AdbError):
            return "uid=0" in self.shell("su -c id")
        return False


class AdbFiles:
    """The `governors.Files` interface over adb; writes run as root through `su -c`."""

    def __init__(self, adb: Adb):
        self.adb = adb

    def read(self, path: str) -> str:
        out = self.adb.shell(f"cat {shlex.quote(path)}").strip()
        if any(f in out for f in _FAILURES):
            raise OSError(f"{path}: {out}")
        return out

    def write(self, path: str, value: str) -> None:
        inner = f"echo {shlex.quote(value)} > {shlex.quote(path)}"
        out = self.adb.shell(f"su -c {shlex.quote(inner)}").strip()
        if any(f in out for f in _FAILURES):
            raise OSError(f"writing {value!r} to {path}: {out}")

    def glob(self, root: str, pattern: str) -> list[str]:
        out = self.adb.shell(f"ls -d {shlex.quote(root)}/{pattern} 2>/dev/null")
        return sorted(line.strip() for line in out.splitlines() if line.strip().startswith("/"))

    def writable(self, path: str) -> bool:
        return self.adb.is_root()


def phone_cpufreq(adb: Adb, recovery_dir: Path | None = None) -> CpuFreq:
    """cpufreq control of the phone; the recovery file (on the host) is named by the serial."""
    name = f"ondevice-cpufreq-restore-{adb.serial or 'phone'}.json"
    return CpuFreq(
        DEFAULT_ROOT,
        AdbFiles(adb),
        (recovery_dir / name) if recovery_dir else False,
        where=f"phone {adb.serial or ''}".strip(),
    )


@contextlib.contextmanager
def services_held(adb: Adb, services: tuple[str, ...]) -> Iterator[None]:
    """Stop Android services (e.g. mpdecision, thermal-engine) for the block, start them after."""
    stopped = []
    try:
        for s in services:
            adb.shell(f"su -c {shlex.quote('stop ' + s)}")
            stopped.append(s)
        yield
    finally:
        for s in reversed(stopped):
            with contextlib.suppress(AdbError):
                adb.shell(f"su -c {shlex.quote('start ' + s)}")


def run_job(adb: Adb, job: str | Callable[[], object]) -> object:
    """Run the on-device training job: a shell command over adb, or a callable."""
    return job() if callable(job) else adb.shell(job)


class AndroidBatteryMeter(SamplingMeter):
    name = "android-battery"
    label = MEASURED
    description = "phone battery current x voltage sampled over adb (whole device)"

    def __init__(self, adb: Adb, interval_s: float | None = 0.5, path: str = BATTERY, clock=time.monotonic):
        self.adb, self.interval_s, self.path, self.clock = adb, interval_s, path.rstrip("/"), clock
        super().__init__()
        self._samples: list[tuple[float, float]] = []

    def status(self) -> tuple[bool, str]:
        ok, why = self.adb.status()
        if not ok:
            return False, why
        try:
            watts = self._watts()
        except (AdbError, OSError, ValueError) as exc:
            return False, f"cannot read {self.path}/current_now and voltage_now: {exc}"
        return True, f"{why}: battery reads {watts:.2f} W now"

    def _watts(self) -> float:
        out = self.adb.shell(f"cat {self.path}/current_now {self.path}/voltage_now").split()
        if len(out) != 2:
            raise ValueError(f"expected current_now and voltage_now, got {out!r}")
        micro_amps, micro_volts = (int(v) for v in out)
        return abs(micro_amps) * micro_volts * 1e-12

    def sample(self) -> None:
        watts = self._watts()
        with self._lock:
            self._samples.append((self.clock(), watts))

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            with contextlib.suppress(AdbError, OSError, ValueError):  # one lost sample is not fatal
                self.sample()

    def start(self) -> None:
        self._samples = []
        self._stop.clear()
        try:
            self.sample()
        except (AdbError, OSError, ValueError) as exc:
            raise MeterUnavailable(f"cannot read the battery: {exc}") from exc
        if self.interval_s:
            self._thread = threading.Thread(target=self._loop, name="battery-sampler", daemon=True)
            self._thread.start()

    def stop(self) -> Reading:
        self._end_thread()
        self.sample()
        s = sorted(self._samples)
        joules = sum((t1 - t0) * (w0 + w1) / 2 for (t0, w0), (t1, w1) in zip(s, s[1:]))
        return Reading(
            self.name,
            self.label,
            joules,
            s[-1][0] - s[0][0],
            len(s),
            {"battery": joules},
            "whole phone (screen, radios and idle power included)",
        )

    def abort(self) -> None:
        self._end_thread()
