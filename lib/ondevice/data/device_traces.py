"""Device-usage traces -> per-device availability windows, from two public formats and a generator.

AutLearn (Sec. 2, Fig. 2) counts the minutes per day in which a phone may train: the autonomous
condition is "charging and screen off"; federated learning also needs an unmetered network
(Wi-Fi). Both come out of traces of phone state changes:

- FLASH's `state_traces.json` (`read_flash`): `{uid: {"guid", "model", "messages"}}`, messages
  one "YYYY-mm-dd HH:MM:SS<TAB>state" per line. States: battery_charged_on/off (plugged in or
  not), screen_on/off, screen_lock/unlock, wifi, 2g/3g/4g/5g/unknown (not Wi-Fi), a battery
  percentage "NN%", and phone_on/off, battery_low/okay. Before its first event a device counts
  as not charging, screen on, unlocked, not on Wi-Fi (nothing is assumed available), as FLASH
  does. Lines are taken in time order (a stable sort, should a trace hold one out of order).
- FedScale's `client_behave_trace` (`read_fedscale`), a pickle `{client_id: {"duration",
  "active", "inactive", "finish_time", "model"}}`: FLASH's data reduced to the periods
  [active[i], inactive[i]] (seconds from the trace's start) in which FedScale counts a device
  available, i.e. charging. It has one condition only, `charging`, which bounds both of
  AutLearn's conditions from above; there are no absolute dates, so hours of the day are
  relative to the trace start.
- `synthetic_flash`: a documented generative model of a phone's day that writes FLASH's format,
  for running everything offline. Its output is synthetic and must be labelled so.

Malformed input is a `TraceError` naming the file, the device and the line (or entry).
"""

from __future__ import annotations

import calendar
import json
import pickle
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

AUTONOMOUS, FEDERATED, CHARGING = "autonomous", "federated", "charging"
CONDITIONS = {
    AUTONOMOUS: "charging and screen off (idle)",
    FEDERATED: "charging, screen off (idle) and on Wi-Fi",
    CHARGING: "charging (plugged in)",
}
IDLE_RULES = ("screen_off", "locked")  # the paper: screen off; FLASH's simulator: screen locked
TIME_FORMAT = "%Y-%m-%d %H:%M:%S"
CELLULAR = ("2g", "3g", "4g", "5g", "unknown")
DAY = 86400.0


class TraceError(ValueError):
    """A trace file that cannot be read as its format says."""


@dataclass(frozen=True)
class DeviceWindows:
    """One device's trace span and, per condition, its availability windows: sorted, disjoint
    (start, end) rows in seconds, on the trace's clock (FLASH: seconds since 1970 of the local
    timestamps; FedScale: seconds since the trace start)."""

    device: str
    model: str
    start: float
    end: float
    windows: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def days(self) -> float:
        return (self.end - self.start) / DAY

    def minutes_per_day(self, condition: str) -> float:
        w = self.windows[condition]
        return float((w[:, 1] - w[:, 0]).sum()) / 60.0 / self.days


def _intervals(times: list[float], flags: list[bool], end: float) -> np.ndarray:
    """(start, end) rows of the runs in which `flags` is true; flags[i] holds from times[i] on."""
    rows, opened = [], None
    for t, f in zip(times, flags):
        if f and opened is None:
            opened = t
        elif not f and opened is not None:
            if t > opened:
                rows.append((opened, t))
            opened = None
    if opened is not None and end > opened:
        rows.append((opened, end))
    return np.array(rows, dtype=float).reshape(-1, 2)


_STAMP = re.compile(r"(\d{4}-\d\d-\d\d) (\d\d):(\d\d):(\d\d)")
_DAYS: dict[str, float] = {}


def _parse_time(text: str) -> float:
    """Seconds since 1970 of a local timestamp (taken as UTC: no daylight-saving jumps). Days are
    parsed once each; a trace has millions of lines over a few days."""
    m = _STAMP.fullmatch(text)
    if not m:
        raise ValueError(f"{text!r} is not {TIME_FORMAT}")
    day = _DAYS.get(m[1])
    if day is None:
        day = _DAYS[m[1]] = float(calendar.timegm(datetime.strptime(m[1], "%Y-%m-%d").timetuple()))
    hour, minute, second = int(m[2]), int(m[3]), int(m[4])
    if hour > 23 or minute > 59 or second > 59:
        raise ValueError(f"{text!r} is not a valid time")
    return day + hour * 3600 + minute * 60 + second


def _format_time(seconds: float, days: dict[int, str]) -> str:
    day, rest = divmod(int(seconds), int(DAY))
    if day not in days:
        days[day] = datetime.fromtimestamp(day * DAY, timezone.utc).strftime("%Y-%m-%d")
    return f"{days[day]} {rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"


def flash_device(uid: str, entry, idle: str = "screen_off", where: str = "") -> DeviceWindows:
    """Windows of one device of a FLASH trace; `where` (the file) prefixes every error."""
    if idle not in IDLE_RULES:
        raise ValueError(f"idle rule must be one of {IDLE_RULES}, got {idle!r}")
    at = f"{where}: device {uid}"
    if not isinstance(entry, dict) or not isinstance(entry.get("messages"), str):
        raise TraceError(f"{at}: expected an object with a 'messages' string, got {type(entry).__name__}")
    events = []
    for n, line in enumerate(entry["messages"].split("\n"), 1):
        if not line.strip():
            continue
        parts = line.strip().split("\t")
        if len(parts) != 2:
            raise TraceError(f"{at}: line {n}: expected 'YYYY-mm-dd HH:MM:SS<TAB>state', got {line!r}")
        stamp, state = parts[0].strip(), parts[1].strip().lower()
        try:
            t = _parse_time(stamp)
        except ValueError:
            raise TraceError(f"{at}: line {n}: timestamp {stamp!r} is not {TIME_FORMAT}") from None
        if state.endswith("%"):
            try:
                level = float(state[:-1])
            except ValueError:
                level = -1.0
            if not 0 <= level <= 100:
                raise TraceError(f"{at}: line {n}: battery level {state!r} is not a percentage from 0 to 100")
        elif state not in _EFFECTS:
            raise TraceError(f"{at}: line {n}: unknown state {state!r}; known: {sorted(_EFFECTS)} and 'NN%'")
        events.append((t, state))
    if not events:
        raise TraceError(f"{at}: no events")
    events.sort(key=lambda e: e[0])  # stable: lines with one timestamp keep their order
    status = {"charging": False, "screen_on": True, "locked": False, "wifi": False, "powered": True}
    times, flags = [], {c: [] for c in CONDITIONS}
    for i, (t, state) in enumerate(events):
        status.update(_EFFECTS.get(state, {}))
        if i + 1 < len(events) and events[i + 1][0] == t:
            continue  # one instant: judge the state after all of its lines
        idle_now = status["locked"] if idle == "locked" else not status["screen_on"]
        charging = status["charging"] and status["powered"]
        times.append(t)
        flags[CHARGING].append(charging)
        flags[AUTONOMOUS].append(charging and idle_now)
        flags[FEDERATED].append(charging and idle_now and status["wifi"])
    start, end = events[0][0], events[-1][0]
    return DeviceWindows(
        str(uid), str(entry.get("model", "")), start, end, {c: _intervals(times, f, end) for c, f in flags.items()}
    )


_EFFECTS = {
    "battery_charged_on": {"charging": True},
    "battery_charged_off": {"charging": False},
    "screen_on": {"screen_on": True},
    "screen_off": {"screen_on": False},
    "screen_lock": {"locked": True},
    "screen_unlock": {"locked": False},
    "wifi": {"wifi": True},
    **{c: {"wifi": False} for c in CELLULAR},
    "phone_on": {"powered": True},
    "phone_off": {"powered": False},
    "battery_low": {},
    "battery_okay": {},
}


def flash_devices(doc, idle: str = "screen_off", where: str = "") -> list[DeviceWindows]:
    if not isinstance(doc, dict):
        raise TraceError(
            f"{where}: expected a JSON object {{uid: {{guid, model, messages}}}}, got {type(doc).__name__}"
        )
    return [flash_device(uid, entry, idle, where) for uid, entry in doc.items()]


def read_flash(path: str | Path, idle: str = "screen_off") -> list[DeviceWindows]:
    """Every device of a FLASH `state_traces.json`."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    return flash_devices(doc, idle, str(path))


class _PlainUnpickler(pickle.Unpickler):
    """Builds only dicts, lists, numbers and strings (and numpy scalars): loading a downloaded
    pickle must not run code from it."""

    ALLOWED = {("numpy", "dtype"), ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar")}

    def find_class(self, module, name):
        if (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: a trace holds plain data only")


def fedscale_device(client, entry, where: str = "") -> DeviceWindows:
    at = f"{where}: client {client}"
    keys = ("active", "inactive", "finish_time", "duration", "model")
    if not isinstance(entry, dict) or any(k not in entry for k in keys):
        raise TraceError(
            f"{at}: expected a dict with keys {keys}, got "
            f"{sorted(entry) if isinstance(entry, dict) else type(entry).__name__}"
        )
    active, inactive = entry["active"], entry["inactive"]
    if not isinstance(active, (list, tuple)) or not isinstance(inactive, (list, tuple)) or len(active) != len(inactive):
        raise TraceError(f"{at}: 'active' and 'inactive' must be lists of equal length")
    try:
        period = float(entry["finish_time"])
        rows = np.array([(float(a), float(b)) for a, b in zip(active, inactive)]).reshape(-1, 2)
    except (TypeError, ValueError):
        raise TraceError(f"{at}: 'active', 'inactive' and 'finish_time' must hold numbers") from None
    if not period > 0:
        raise TraceError(f"{at}: finish_time must be positive, got {entry['finish_time']!r}")
    for i, (a, b) in enumerate(rows):
        if not 0 <= a <= b <= period:
            raise TraceError(
                f"{at}: entry {i}: need 0 <= active <= inactive <= finish_time, got {a:g}, {b:g}, {period:g}"
            )
        if i and a < rows[i - 1, 1]:
            raise TraceError(f"{at}: entry {i}: starts at {a:g}, before the previous period ends ({rows[i - 1, 1]:g})")
    return DeviceWindows(str(client), str(entry["model"]), 0.0, period, {CHARGING: rows[rows[:, 1] > rows[:, 0]]})


def read_fedscale(path: str | Path) -> list[DeviceWindows]:
    """Every client of a FedScale `client_behave_trace` pickle."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            doc = _PlainUnpickler(f).load()
    except (pickle.UnpicklingError, EOFError, ValueError, AttributeError, ImportError) as exc:
        raise TraceError(f"{path}: not a FedScale client_behave_trace pickle ({exc})") from None
    if not isinstance(doc, dict):
        raise TraceError(f"{path}: expected a dict {{client_id: {{...}}}}, got {type(doc).__name__}")
    return [fedscale_device(c, e, str(path)) for c, e in doc.items()]


@dataclass(frozen=True)
class SyntheticModel:
    """A phone's day, per device, as a few documented habits (all times in hours, local clock).

    Each device draws its own habits, so devices differ as real users do:
    - overnight charging: each night with probability p ~ Beta(`night_charge_a`, `night_charge_b`)
      (the device's own), plugged in at N(`bedtime`, 1.5) and unplugged at N(`wake`, 1.0);
    - daytime top-ups: Poisson(`day_charges`) sessions per day, each exponential with mean
      `day_charge_hours`, starting uniformly between wake-up and bedtime;
    - screen use: while awake, sessions arrive at `awake_sessions_per_hour` x the device's factor
      ~ Gamma(2, 1/2), each exponential with mean `session_minutes`; at night
      Poisson(`night_sessions`) short checks (mean 3 minutes). The screen locks 5 s after it goes
      off and unlocks as it comes on;
    - network: Wi-Fi at home (evening, night, morning: outside 9-18 h) for the share
      `home_wifi` of devices that have it, else cellular; during work hours (9-18 h) Wi-Fi
      with probability `work_wifi` per day;
    - a battery percentage line at each plug event (a level, not used for availability).
    The phone model is drawn from `models` with `model_weights`.
    """

    bedtime: float = 23.5
    wake: float = 7.5
    night_charge_a: float = 2.0
    night_charge_b: float = 2.0
    day_charges: float = 1.0
    day_charge_hours: float = 0.75
    awake_sessions_per_hour: float = 3.0
    session_minutes: float = 4.0
    night_sessions: float = 1.0
    home_wifi: float = 0.8
    work_wifi: float = 0.4
    models: tuple[str, ...] = ("Redmi Note 8", "Nexus 6", "Galaxy Note 10")
    model_weights: tuple[float, ...] = (1.0, 1.0, 1.0)


def _events(model: SyntheticModel, days: int, rng: np.random.Generator) -> list[tuple[float, str]]:
    """(seconds from the first midnight, state) for one device over `days` days."""
    ev: list[tuple[float, str]] = []
    p_night = rng.beta(model.night_charge_a, model.night_charge_b)
    screen_factor = rng.gamma(2.0, 0.5)
    has_wifi = rng.random() < model.home_wifi
    h = 3600.0
    for d in range(days):
        base = d * DAY
        wake = base + rng.normal(model.wake, 1.0) * h
        bed = base + rng.normal(model.bedtime, 1.5) * h
        # network: home Wi-Fi outside work hours, work Wi-Fi some days
        ev.append((base, "wifi" if has_wifi else "4g"))
        work_wifi = rng.random() < model.work_wifi
        ev.append((base + 9 * h, "wifi" if work_wifi else "4g"))
        ev.append((base + 18 * h, "wifi" if has_wifi else "4g"))
        charges = []
        if rng.random() < p_night:
            charges.append((bed, base + DAY + rng.normal(model.wake, 1.0) * h))
        for _ in range(rng.poisson(model.day_charges)):
            s = rng.uniform(wake, max(wake, bed))
            charges.append((s, s + rng.exponential(model.day_charge_hours) * h))
        for s, e in charges:
            level = int(rng.integers(5, 80))
            ev += [
                (s, "battery_charged_on"),
                (s, f"{level}%"),
                (e, "battery_charged_off"),
                (e, f"{min(100, level + 40)}%"),
            ]
        sessions, t = [], wake
        while True:  # the next session starts a gap after the last one ended
            t += rng.exponential(1.0 / (model.awake_sessions_per_hour * screen_factor)) * h
            if t >= bed:
                break
            sessions.append((t, rng.exponential(model.session_minutes) * 60.0))
            t += sessions[-1][1]
        for _ in range(rng.poisson(model.night_sessions)):
            sessions.append((rng.uniform(bed, base + DAY + model.wake * h), rng.exponential(3.0) * 60.0))
        for s, length in sessions:
            ev += [
                (s, "screen_on"),
                (s + 1.0, "screen_unlock"),
                (s + 1.0 + length, "screen_off"),
                (s + 6.0 + length, "screen_lock"),
            ]
    return sorted((max(t, 0.0), s) for t, s in ev)


def synthetic_flash(
    devices: int,
    days: int,
    rng: np.random.Generator,
    model: SyntheticModel = SyntheticModel(),
    start: str = "2021-03-01",
) -> dict:
    """A synthetic trace in FLASH's `state_traces.json` format (a dict ready for json.dump)."""
    origin = _parse_time(f"{start} 00:00:00")
    weights = np.asarray(model.model_weights, float)
    doc, day_names = {}, {}
    for i in range(devices):
        phone = model.models[int(rng.choice(len(model.models), p=weights / weights.sum()))]
        lines = [f"{_format_time(origin + round(t), day_names)}\t{s}" for t, s in _events(model, days, rng)]
        doc[str(i)] = {"guid": f"synthetic-{i:05d}", "model": phone, "messages": "\n".join(lines) + "\n"}
    return doc
