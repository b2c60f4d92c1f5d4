"""CPU frequency governors through cpufreq sysfs: what a machine offers, a governor or frequency
limits for one run, and every policy's previous settings put back afterwards.

DeepType (Fig. 9b) and AutLearn (Fig. 9) compare the energy of training under a performance-
oriented governor (Android's default `interactive`; on Linux `schedutil` or `performance`) with
`powersave` (the lowest frequency). `CpuFreq.use(setting)` applies a `Setting` to every policy
and restores each policy's governor and min/max frequency on the way out, also after an
exception, Ctrl-C (SIGINT) or SIGTERM/SIGHUP (the runner stops a notebook's kernel with SIGTERM).
Before it writes anything it saves the previous settings to a recovery file, so a process
killed outright (SIGKILL) can be undone later: `python -m ondevice.device.energy --restore`.

The files live under `root` (default `/sys/devices/system/cpu`): `cpufreq/policy*` on current
kernels, `cpu*/cpufreq` on old ones (the Nexus 6's 3.10). All access goes through a small file
interface, so the same code drives a temporary tree in tests and a phone over adb (`android.py`).
Where sysfs is absent or not writable, `status()` says so and the caller falls back to the
modelled meter. With intel_pstate or amd-pstate in active mode `powersave` is a dynamic policy,
not the lowest frequency; `Setting.parse("lowest")` pins max = min frequency instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import tempfile
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator, Protocol

DEFAULT_ROOT = "/sys/devices/system/cpu"
# What the paper calls the default governor, by platform: the first one a machine offers is used.
PERFORMANCE_GOVERNORS = ("interactive", "schedutil", "performance", "ondemand")
# drivers whose own "powersave" is a dynamic policy rather than the lowest frequency
ACTIVE_PSTATE = ("intel_pstate", "amd-pstate", "amd-pstate-epp")


class Files(Protocol):
    """The few file operations cpufreq control needs (local sysfs, or a phone over adb)."""

    def read(self, path: str) -> str: ...
    def write(self, path: str, value: str) -> None: ...
    def glob(self, root: str, pattern: str) -> list[str]: ...
    def writable(self, path: str) -> bool: ...


class LocalFiles:
    def read(self, path: str) -> str:
        return Path(path).read_text().strip()

    def write(self, path: str, value: str) -> None:
        with open(path, "w") as f:  # sysfs takes one write; no temporary file and rename
            f.write(value)

    def glob(self, root: str, pattern: str) -> list[str]:
        return sorted(str(p) for p in Path(root).glob(pattern))

    def writable(self, path: str) -> bool:
        return os.access(path, os.W_OK)


@dataclass(frozen=True)
class PolicyState:
    governor: str
    min_khz: int
    max_khz: int


@dataclass(frozen=True)
class Policy:
    name: str
    path: str
    cpus: tuple[int, ...]
    driver: str
    governors: tuple[str, ...]
    frequencies_khz: tuple[int, ...]  # scaling_available_frequencies; empty for pstate drivers
    cpuinfo_min_khz: int
    cpuinfo_max_khz: int
    state: PolicyState


@dataclass(frozen=True)
class Setting:
    """What to set on every policy for a run: a governor, min/max limits (kHz, or "min"/"max"
    for the hardware limits), or both. `parse` reads "powersave", "schedutil", "lowest"
    (max = min frequency), "highest" or "khz:883200" (min = max = that frequency)."""

    governor: str | None = None
    min_khz: int | str | None = None
    max_khz: int | str | None = None
    name: str = ""

    @classmethod
    def parse(cls, spec: str) -> "Setting":
        if spec == "lowest":
            return cls(None, "min", "min", spec)
        if spec == "highest":
            return cls(None, "max", "max", spec)
        if spec.startswith("khz:"):
            khz = int(spec[4:])
            return cls(None, khz, khz, spec)
        return cls(spec, None, None, spec)

    def resolve(self, policy: Policy) -> PolicyState:
        """The state this setting gives a policy (unset fields keep the policy's own)."""

        def khz(v, current):
            return (
                current
                if v is None
                else policy.cpuinfo_min_khz
                if v == "min"
                else policy.cpuinfo_max_khz
                if v == "max"
                else int(v)
            )

        state = PolicyState(
            self.governor or policy.state.governor,
            khz(self.min_khz, policy.state.min_khz),
            khz(self.max_khz, policy.state.max_khz),
        )
        if state.min_khz > state.max_khz:
            state = (
                PolicyState(state.governor, state.min_khz, state.min_khz)
                if self.max_khz is None
                else PolicyState(state.governor, state.max_khz, state.max_khz)
            )
        return state


class CpuFreqError(RuntimeError):
    pass


class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived while a setting was applied; raised so restoring runs."""


def _default_recovery_file() -> Path:
    return Path(tempfile.gettempdir()) / f"ondevice-cpufreq-restore-{os.getuid()}.json"


class CpuFreq:
    """cpufreq policies under `root`, read and set through `files`."""

    def __init__(
        self,
        root: str = DEFAULT_ROOT,
        files: Files | None = None,
        recovery_file: Path | None | bool = True,
        where: str = "this machine",
    ):
        self.root, self.files, self.where = root.rstrip("/"), files or LocalFiles(), where
        self.recovery_file = _default_recovery_file() if recovery_file is True else (recovery_file or None)

    # reading
    def _paths(self) -> list[str]:
        paths = self.files.glob(f"{self.root}/cpufreq", "policy*")
        if not paths:  # old kernels: one cpufreq directory per online CPU
            paths = self.files.glob(self.root, "cpu[0-9]*/cpufreq")
        return paths

    def _read(self, path: str, name: str, default: str = "") -> str:
        try:
            return self.files.read(f"{path}/{name}")
        except (OSError, CpuFreqError):
            return default

    def policies(self) -> list[Policy]:
        out = []
        for path in self._paths():
            cpus = self._read(path, "affected_cpus") or self._read(path, "related_cpus")
            last = path.rsplit("/", 1)[-1]
            name = last if last.startswith("policy") else path.split("/")[-2]  # policyN or cpuN
            state = PolicyState(
                self._read(path, "scaling_governor"),
                int(self._read(path, "scaling_min_freq", "0")),
                int(self._read(path, "scaling_max_freq", "0")),
            )
            out.append(
                Policy(
                    name,
                    path,
                    tuple(int(c) for c in cpus.split()),
                    self._read(path, "scaling_driver"),
                    tuple(self._read(path, "scaling_available_governors").split()),
                    tuple(sorted(int(f) for f in self._read(path, "scaling_available_frequencies").split())),
                    int(self._read(path, "cpuinfo_min_freq", "0")),
                    int(self._read(path, "cpuinfo_max_freq", "0")),
                    state,
                )
            )
        return out

    def status(self) -> tuple[bool, str]:
        """(usable, why): usable means policies exist and their settings can be written."""
        try:
            policies = self.policies()
        except OSError as exc:
            return False, f"cpufreq sysfs on {self.where} cannot be read ({exc})"
        if not policies:
            return False, (
                f"no cpufreq policies on {self.where} ({self.root}/cpufreq/policy* absent: a VM or "
                "container without frequency scaling)"
            )
        locked = [p.name for p in policies if not self.files.writable(f"{p.path}/scaling_governor")]
        if locked:
            return (
                False,
                f"cpufreq on {self.where} is read-only for this user (policies {', '.join(locked)}; needs root)",
            )
        return True, f"{len(policies)} policies on {self.where}, writable"

    def table(self) -> list[dict]:
        """One row per policy: CPUs, driver, governors, frequencies and the current settings."""
        return [
            {
                "policy": p.name,
                "cpus": " ".join(map(str, p.cpus)),
                "driver": p.driver,
                "governors": " ".join(p.governors),
                "frequencies_khz": " ".join(map(str, p.frequencies_khz)) or f"{p.cpuinfo_min_khz}-{p.cpuinfo_max_khz}",
                **asdict(p.state),
            }
            for p in self.policies()
        ]

    def performance_governor(self, preferred: tuple[str, ...] = PERFORMANCE_GOVERNORS) -> str | None:
        """The first of `preferred` that every policy offers (the paper's "default governor")."""
        policies = self.policies()
        for g in preferred:
            if policies and all(g in p.governors for p in policies):
                return g
        return None

    def setting_for(self, name: str) -> Setting:
        """The setting the papers mean by a governor name: "default" is the performance-oriented
        governor this machine offers; "powersave" is the lowest frequency, which the generic
        governor gives but intel_pstate's and amd-pstate's active-mode "powersave" (a dynamic
        policy) does not, so there max is pinned to the minimum as well."""
        if name == "default":
            return Setting(self.performance_governor(), name=name)
        if name == "powersave" and any(p.driver in ACTIVE_PSTATE for p in self.policies()):
            return Setting("powersave", None, "min", name)
        return Setting.parse(name)

    # writing
    def _write_state(self, policy: Policy, state: PolicyState) -> None:
        if state.governor and policy.governors and state.governor not in policy.governors:
            raise CpuFreqError(f"{policy.name} offers governors {list(policy.governors)}, not {state.governor!r}")
        if state.governor:
            self.files.write(f"{policy.path}/scaling_governor", state.governor)
        current_max = int(self._read(policy.path, "scaling_max_freq", str(state.max_khz)))
        # min never above max at any moment: raise max first when the new min exceeds the current max
        order = (("scaling_max_freq", state.max_khz), ("scaling_min_freq", state.min_khz))
        if state.min_khz <= current_max:
            order = order[::-1]
        for name, khz in order:
            if khz:
                self.files.write(f"{policy.path}/{name}", str(khz))

    def apply(self, setting: Setting, policies: list[Policy] | None = None) -> dict[str, PolicyState]:
        """Write `setting` to every policy; returns the state asked of each."""
        asked = {}
        for policy in policies if policies is not None else self.policies():
            asked[policy.name] = setting.resolve(policy)
            self._write_state(policy, asked[policy.name])
        return asked

    def restore(self, states: dict[str, PolicyState]) -> None:
        """Put back every policy's saved state; tries them all and reports every failure at the end."""
        errors = []
        by_name = {p.name: p for p in self.policies()}
        for name, state in states.items():
            try:
                if name not in by_name:
                    raise CpuFreqError("policy has gone (CPU offline?)")
                self._write_state(by_name[name], state)
            except (OSError, CpuFreqError) as exc:
                errors.append(f"{name}: {exc}")
        if errors:
            raise CpuFreqError("could not restore cpufreq settings: " + "; ".join(errors))

    def _save_recovery(self, states: dict[str, PolicyState]) -> None:
        if self.recovery_file:
            doc = {
                "root": self.root,
                "where": self.where,
                "pid": os.getpid(),
                "states": {n: asdict(s) for n, s in states.items()},
            }
            self.recovery_file.write_text(json.dumps(doc, indent=1))

    def recover(self) -> dict[str, PolicyState] | None:
        """Restore the settings a killed run left in the recovery file (None when there is none)."""
        if not self.recovery_file or not self.recovery_file.is_file():
            return None
        doc = json.loads(self.recovery_file.read_text())
        states = {n: PolicyState(**s) for n, s in doc["states"].items()}
        self.restore(states)
        self.recovery_file.unlink()
        return states

    @contextlib.contextmanager
    def use(self, setting: Setting) -> Iterator[dict]:
        """Apply `setting` for the block, then restore every policy, whatever ends the block.

        Yields a record for run.json: the setting, each policy's state before and as set, and
        (after the block) whether restoring succeeded.
        """
        policies = self.policies()
        if not policies:
            raise CpuFreqError(self.status()[1])
        before = {p.name: p.state for p in policies}
        record = {
            "setting": setting.name or setting.governor,
            "where": self.where,
            "before": {n: asdict(s) for n, s in before.items()},
            "set": {},
            "restored": False,
        }
        self._save_recovery(before)
        with _raise_on_termination():
            try:
                record["set"] = {n: asdict(s) for n, s in self.apply(setting, policies).items()}
                yield record
            finally:
                self.restore(before)
                record["restored"] = True
                if self.recovery_file and self.recovery_file.is_file():
                    self.recovery_file.unlink()


@contextlib.contextmanager
def _raise_on_termination():
    """While the block runs, a SIGTERM, SIGHUP or SIGINT that would kill the process outright
    (SIG_DFL) raises `Interrupted` instead, so `finally` restores. Only the main thread can set
    handlers; elsewhere the block runs with the handlers it has."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Interrupted(signal.Signals(signum).name)

    old = {}
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        # only where the signal would kill the process outright: a handler someone installed
        # (Python's SIGINT one raises KeyboardInterrupt already) and SIG_IGN (nohup) are kept
        if signal.getsignal(sig) == signal.SIG_DFL:
            old[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)
