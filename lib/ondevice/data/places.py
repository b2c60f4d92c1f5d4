"""From GPS points to Colla's next-place samples (Colla Sec. 2.2 and 4.1), computed per device.

The paper maps Wi-Fi scans to clusters of access points and slices each device's records into
10-minute windows, the window's location being the cluster of its most seen AP. GeoLife has GPS
points instead, so a place is a cell of a fixed grid (`cell_m` metres square, longitude scaled at
`ref_lat`): the grid depends on no data, so every device computes its own places locally and
ids agree across devices, as the paper's AP clusters do. A window's place is the cell holding
most of its points.

Two sequences (`PlaceRule.sequence`):
- "visits" (the paper's features read literally): consecutive windows in the same cell are one
  visit; a step is a visit, and a sample predicts the next *distinct* place. Duration is how long
  the visit lasted (last window - first window), Gap the time from its end to the start of the
  next, different, place (Sec. 2.2).
- "bins": a step is a window, a sample predicts the next window's place (often the same place).
  Duration is the windows since the current run of windows in the cell began, Gap the windows to
  the next observation.

Step j carries its place, Duration and Gap (10-minute units, at most 143), and the hour, minute
and weekday of step j+1's start: "vary the input time t_{n+1} to predict the value v_{n+1} at any
given time". A sample is `history` consecutive steps and the next step's place. Samples belong
to parts by the day (local time) of the predicted step: the first `bootstrap_days` days with data
form part 0 (the cloud's initial data), then every `cycle_days` days one part.

No future leaks into the place vocabulary: a cell becomes a place from the first part in which
some device has seen it in `min_place_bins` windows of its own parts up to then, and only parts
0..cycles (never the last test period) count. `DeviceSamples.take(parts, known_by=c)` maps every
place not yet known by part c to 0, "elsewhere": a model trained on parts <= c cannot know it,
and a test label 0 is always a miss.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

BIN_SECONDS = 600
FEATURES = ("location", "hour", "minute", "weekday", "duration", "gap")
TIME_IDS = {"hour": 24, "minute": 60, "weekday": 7, "duration": 144, "gap": 144}
ELSEWHERE = 0
METRES_PER_DEGREE = 111_320.0
SEQUENCES = ("visits", "bins")


@dataclass(frozen=True)
class PlaceRule:
    cell_m: float = 1000.0  # grid cell side in metres
    ref_lat: float = 40.0  # latitude at which longitude degrees are scaled (Beijing)
    utc_offset_hours: int = 8  # GeoLife times are GMT; hours and days are local (Beijing)
    min_place_bins: int = 3  # windows at a cell for it to be one of the device's places
    history: int = 6  # steps in a sample
    bootstrap_days: int = 6  # days with data in part 0 (the cloud's initial data)
    cycle_days: int = 6  # days with data per update cycle
    cycles: int = 3  # update cycles; part cycles+1 is the last test period
    sequence: str = "bins"  # "visits" (next distinct place) or "bins" (next 10-minute window)

    def __post_init__(self):
        if self.sequence not in SEQUENCES:
            raise ValueError(f"sequence must be one of {SEQUENCES}, got {self.sequence!r}")

    @property
    def days_needed(self) -> int:
        return self.bootstrap_days + (self.cycles + 1) * self.cycle_days


def grid_cells(lat: np.ndarray, lng: np.ndarray, rule: PlaceRule) -> np.ndarray:
    """A stable int64 id per grid cell: row and column of the cell packed into one number."""
    row = np.floor(np.asarray(lat) * METRES_PER_DEGREE / rule.cell_m).astype(np.int64)
    col = np.floor(np.asarray(lng) * METRES_PER_DEGREE * np.cos(np.radians(rule.ref_lat)) / rule.cell_m).astype(
        np.int64
    )
    return row * 10_000_000 + col


def windows(points: pd.DataFrame, rule: PlaceRule) -> pd.DataFrame:
    """One row per 10-minute window with points: its index (local time) and its modal cell."""
    local = points.time.to_numpy("datetime64[s]").astype(np.int64) + rule.utc_offset_hours * 3600
    frame = pd.DataFrame({"window": local // BIN_SECONDS, "cell": grid_cells(points.lat, points.lng, rule)})
    counts = frame.groupby(["window", "cell"]).size().reset_index(name="n")
    # the most frequent cell per window; ties go to the smaller cell id (stable)
    counts = counts.sort_values(["window", "n", "cell"], ascending=[True, False, True], kind="stable")
    return counts.drop_duplicates("window").drop(columns="n").reset_index(drop=True)


def window_parts(win: pd.DataFrame, rule: PlaceRule) -> np.ndarray:
    """The part of each window (by its day's rank among the device's days with data)."""
    day = win.window.to_numpy(np.int64) * BIN_SECONDS // 86400
    return part_of(np.searchsorted(np.unique(day), day), rule)


def part_of(rank: np.ndarray, rule: PlaceRule) -> np.ndarray:
    return np.where(rank < rule.bootstrap_days, 0, 1 + (rank - rule.bootstrap_days) // rule.cycle_days)


def known_parts(win: pd.DataFrame, rule: PlaceRule) -> dict[int, int]:
    """Cell -> the first part (0..cycles) by whose end this device has seen it in `min_place_bins`
    windows; cells it reaches only later, or never, are left out."""
    frame = pd.DataFrame({"cell": win.cell.to_numpy(), "part": window_parts(win, rule)})
    frame = frame[frame.part <= rule.cycles]
    counts = frame.groupby(["cell", "part"]).size().groupby(level=0).cumsum().reset_index(name="n")
    reached = counts[counts.n >= rule.min_place_bins].groupby("cell").part.min()
    return {int(c): int(p) for c, p in reached.items()}


@dataclass
class DeviceSamples:
    """A device's samples: X [n, history, 6] int32 ids, y [n] global place ids, part [n]."""

    uid: str
    X: np.ndarray
    y: np.ndarray
    part: np.ndarray
    known_from: np.ndarray | None = None  # per place id, the first part by which it is known

    def take(self, parts, known_by: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The samples of `parts`; with `known_by`, places not yet known by that part are 0."""
        mask = np.isin(self.part, parts)
        X, y = self.X[mask], self.y[mask]
        if known_by is not None and self.known_from is not None:
            unknown = self.known_from > known_by
            X = X.copy()
            X[..., 0] = np.where(unknown[X[..., 0]], ELSEWHERE, X[..., 0])
            y = np.where(unknown[y], ELSEWHERE, y).astype(y.dtype)
        return X, y

    @property
    def digest_source(self) -> bytes:
        known = b"" if self.known_from is None else self.known_from.tobytes()
        return self.X.tobytes() + self.y.tobytes() + self.part.tobytes() + known


def build_samples(uid: str, win: pd.DataFrame, vocab: dict[int, int], rule: PlaceRule) -> DeviceSamples | None:
    """Steps and samples of one device; None when it has fewer days with data than the parts need."""
    w = win.window.to_numpy(np.int64)
    cell = win.cell.to_numpy(np.int64)
    days = np.unique(w * BIN_SECONDS // 86400)
    if len(days) < rule.days_needed:
        return None
    new_run = np.r_[True, cell[1:] != cell[:-1]]  # runs of windows in one cell (raw cells: no vocabulary)
    run_first = w[np.maximum.accumulate(np.where(new_run, np.arange(len(w)), 0))]
    if rule.sequence == "visits":
        run_last = w[np.r_[np.nonzero(new_run)[0][1:] - 1, len(w) - 1]]
        cell, start, end = cell[new_run], run_first[new_run], run_last
        duration = end - start
    else:
        start = end = w
        duration = w - run_first
    place = np.array([vocab.get(int(c), ELSEWHERE) for c in cell], np.int32)
    stamp = pd.to_datetime(start * BIN_SECONDS, unit="s")
    steps = np.zeros((len(place), 6), np.int32)
    steps[:, 0] = place
    steps[:, 4] = np.minimum(duration, 143)
    # time features of the next step's start, on step j
    steps[:-1, 1] = stamp.hour[1:]
    steps[:-1, 2] = stamp.minute[1:]
    steps[:-1, 3] = stamp.dayofweek[1:]
    steps[:-1, 5] = np.minimum(start[1:] - end[:-1], 143)
    h = rule.history
    targets = np.arange(h, len(place))  # sample i predicts step i from steps i-h..i-1
    X = np.stack([steps[t - h : t] for t in targets]) if len(targets) else np.zeros((0, h, 6), np.int32)
    part = part_of(np.searchsorted(days, start[targets] * BIN_SECONDS // 86400), rule)
    keep = part <= rule.cycles + 1
    return DeviceSamples(uid, X[keep].astype(np.int32), place[targets][keep], part[keep].astype(np.int8))


@dataclass
class PlaceData:
    """Every device's samples over one place vocabulary (global id 0 = elsewhere)."""

    rule: PlaceRule
    devices: dict[str, DeviceSamples]
    vocabulary_size: int
    excluded: list[str]  # devices with too few days with data
    known_from: np.ndarray | None = None  # per place id, the first part by which it is known
    days: dict[str, int] | None = None  # days with data of every device read, kept or excluded

    def summary(self) -> pd.DataFrame:
        """Aggregate counts per part (no place, point or coordinate is in it); "share elsewhere" counts
        the labels whose place is not known by the part a model trained before them has seen."""
        rows = []
        for p in range(self.rule.cycles + 2):
            n = [int((d.part == p).sum()) for d in self.devices.values()]
            ys = np.concatenate([d.take([p], known_by=max(p - 1, 0))[1] for d in self.devices.values()])
            rows.append(
                {
                    "part": "bootstrap (cloud)" if p == 0 else f"cycle {p}",
                    "devices": len(n),
                    "samples": int(sum(n)),
                    "samples per device, median": float(np.median(n)),
                    "share elsewhere": float(np.mean(ys == ELSEWHERE)) if len(ys) else float("nan"),
                }
            )
        return pd.DataFrame(rows)


def build(points_by_device: dict[str, pd.DataFrame], rule: PlaceRule) -> PlaceData:
    """Windows on each device, one shared vocabulary (the cells some device made a place in its
    parts 0..cycles, in cell order) with the part from which each place is known, then each
    device's samples."""
    wins = {uid: windows(p, rule) for uid, p in points_by_device.items()}
    first: dict[int, int] = {}
    for win in wins.values():
        for c, p in known_parts(win, rule).items():
            first[c] = min(p, first.get(c, p))
    cells = sorted(first)
    vocab = {c: i + 1 for i, c in enumerate(cells)}
    known_from = np.array([0] + [first[c] for c in cells], np.int64)
    devices, excluded = {}, []
    for uid in sorted(wins):
        s = build_samples(uid, wins[uid], vocab, rule)
        if s is None:
            excluded.append(uid)
        else:
            s.known_from = known_from
            devices[uid] = s
    days = {uid: len(np.unique(w.window.to_numpy(np.int64) * BIN_SECONDS // 86400)) for uid, w in wins.items()}
    return PlaceData(rule, devices, len(vocab) + 1, excluded, known_from, days)
