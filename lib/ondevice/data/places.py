"""From GPS points to Colla's next-place samples (Colla Sec. 2.2 and 4.1), computed per device.

The paper maps Wi-Fi scans to clusters of access points and slices each device's records into
10-minute windows, the window's location being the cluster of its most seen AP. GeoLife has GPS
points instead, so a place is a cell of a fixed grid (`cell_m` metres square, longitude scaled at
`ref_lat`): the grid depends on no data, so every device computes its own places locally and
ids agree across devices, as the paper's AP clusters do. A window's place is the cell holding
most of its points. Cells a device visits in fewer than `min_place_bins` windows are merged into
place 0, "elsewhere"; the place vocabulary is fixed in advance, as the paper's 368 clusters were.

Each observed window is a step with six id features (location, hour, minute, weekday, duration,
gap: 24, 60, 7, 144 and 144 ids). Step j carries its place and how long (in 10-minute units, at
most 143) the device has been there, and the time of the next observation (hour, minute and
weekday of window j+1, and the gap to it): "vary the input time t_{n+1} to predict the value
v_{n+1} at any given time". A sample is `history` consecutive steps and the next window's place.
Samples belong to parts by the day (local time) of that next window: the first `bootstrap_days`
days with data form part 0 (the cloud's initial data), then every `cycle_days` days one part.
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


def device_places(win: pd.DataFrame, rule: PlaceRule) -> np.ndarray:
    """The cells this device visits in at least `min_place_bins` windows (its places)."""
    counts = win.cell.value_counts()
    return np.sort(counts.index[counts >= rule.min_place_bins].to_numpy())


@dataclass
class DeviceSamples:
    """A device's samples: X [n, history, 6] int32 ids, y [n] global place ids, part [n]."""

    uid: str
    X: np.ndarray
    y: np.ndarray
    part: np.ndarray

    def take(self, parts) -> tuple[np.ndarray, np.ndarray]:
        mask = np.isin(self.part, parts)
        return self.X[mask], self.y[mask]

    @property
    def digest_source(self) -> bytes:
        return self.X.tobytes() + self.y.tobytes() + self.part.tobytes()


def build_samples(uid: str, win: pd.DataFrame, vocab: dict[int, int], rule: PlaceRule) -> DeviceSamples | None:
    """Steps and samples of one device; None when it has fewer days with data than the parts need."""
    w = win.window.to_numpy(np.int64)
    place = np.array([vocab.get(int(c), ELSEWHERE) for c in win.cell], np.int32)
    seconds = w * BIN_SECONDS
    stamp = pd.to_datetime(seconds, unit="s")
    day = (seconds // 86400).astype(np.int64)
    days = np.unique(day)
    if len(days) < rule.days_needed:
        return None
    # duration: windows since the first step of the current run of steps at the same place
    run_start = np.zeros(len(w), np.int64)
    for j in range(1, len(w)):
        run_start[j] = run_start[j - 1] if place[j] == place[j - 1] else j
    duration = np.minimum(w - w[run_start], 143)
    steps = np.zeros((len(w), 6), np.int32)
    steps[:, 0] = place
    steps[:, 4] = duration
    # time features of the next observation, on step j
    steps[:-1, 1] = stamp.hour[1:]
    steps[:-1, 2] = stamp.minute[1:]
    steps[:-1, 3] = stamp.dayofweek[1:]
    steps[:-1, 5] = np.minimum(np.diff(w), 143)
    h = rule.history
    targets = np.arange(h, len(w))  # sample i predicts step i from steps i-h..i-1
    X = np.stack([steps[t - h : t] for t in targets]) if len(targets) else np.zeros((0, h, 6), np.int32)
    rank = np.searchsorted(days, day[targets])
    part = np.where(rank < rule.bootstrap_days, 0, 1 + (rank - rule.bootstrap_days) // rule.cycle_days)
    keep = part <= rule.cycles + 1
    return DeviceSamples(uid, X[keep].astype(np.int32), place[targets][keep], part[keep].astype(np.int8))


@dataclass
class PlaceData:
    """Every device's samples over one place vocabulary (global id 0 = elsewhere)."""

    rule: PlaceRule
    devices: dict[str, DeviceSamples]
    vocabulary_size: int
    excluded: list[str]  # devices with too few days with data

    def summary(self) -> pd.DataFrame:
        """Aggregate counts per part (no place, point or coordinate is in it)."""
        rows = []
        for p in range(self.rule.cycles + 2):
            n = [int((d.part == p).sum()) for d in self.devices.values()]
            ys = np.concatenate([d.y[d.part == p] for d in self.devices.values()])
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
    """Windows and places on each device, one shared vocabulary (the union of the devices'
    places, in cell order), then each device's samples."""
    wins = {uid: windows(p, rule) for uid, p in points_by_device.items()}
    cells = np.unique(np.concatenate([device_places(w, rule) for w in wins.values()] + [np.zeros(0, np.int64)]))
    vocab = {int(c): i + 1 for i, c in enumerate(cells)}
    devices, excluded = {}, []
    for uid in sorted(wins):
        s = build_samples(uid, wins[uid], vocab, rule)
        if s is None:
            excluded.append(uid)
        else:
            devices[uid] = s
    return PlaceData(rule, devices, len(vocab) + 1, excluded)
