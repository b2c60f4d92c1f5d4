"""GeoLife loaders (both layouts, clear errors, verification, the release download) and the
places/samples built from them."""

import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ondevice.data import geolife, manifests, places
from ondevice.data.geolife import GeoLifeError

MIRROR = Path(__file__).resolve().parents[2] / "shared" / "data"
HEADER = "Geolife trajectory\nWGS 84\nAltitude is in Feet\nReserved 3\n0,2,255,My Track,0,0,2,8421376\n0\n"
needs_mirror = pytest.mark.skipif(not (MIRROR / "geolife" / "Data").is_dir(), reason="no GeoLife mirror")


def plt_row(lat, lng, when: pd.Timestamp) -> str:
    days = (when - pd.Timestamp("1899-12-30")) / pd.Timedelta(days=1)
    return f"{lat},{lng},0,492,{days:.10f},{when:%Y-%m-%d},{when:%H:%M:%S}\n"


def write_user(data_dir: Path, uid: str, rows_by_file: dict[str, list[str]]) -> None:
    folder = data_dir / uid / "Trajectory"
    folder.mkdir(parents=True)
    for name, rows in rows_by_file.items():
        (folder / name).write_text(HEADER + "".join(rows), newline="\r\n")


@needs_mirror
def test_real_plt_file_reads_every_point_with_its_gmt_time():
    path = MIRROR / "geolife" / "Data" / "000" / "Trajectory" / "20081023025304.plt"
    lines = path.read_text().splitlines()
    points = geolife.read_plt(path)
    assert len(points) == len(lines) - 6
    first = lines[6].split(",")
    assert points.lat[0] == float(first[0]) and points.lng[0] == float(first[1])
    assert points.time[0] == pd.Timestamp(f"{first[5]} {first[6]}")  # field 5 and the text fields agree
    last = lines[-1].split(",")
    assert points.time.iloc[-1] == pd.Timestamp(f"{last[5]} {last[6]}")


def test_sample_layout_is_read_per_user_through_the_manifest():
    users = geolife.sample_points()
    assert sorted(users) == ["001", "005"]
    assert sum(map(len, users.values())) == 217_653
    assert all(u.time.is_monotonic_increasing for u in users.values())
    assert users["001"].lat.between(-90, 90).all()


@pytest.mark.parametrize(
    "bad, line, message",
    [
        ("39.9,abc,0,492,39744.12,2008-10-23,02:53:04\n", 8, "not numbers"),
        ("39.9,116.3,0,492\n", 8, "expected 7"),
        ("139.9,116.3,0,492,39744.12,2008-10-23,02:53:04\n", 8, "out of range"),
        ("39.9,116.3,0,492,x,2008-10-23,02:53:04\n", 8, "field 5"),
    ],
)
def test_malformed_plt_lines_name_the_file_and_line(tmp_path, bad, line, message):
    path = tmp_path / "x.plt"
    path.write_text(HEADER + plt_row(39.9, 116.3, pd.Timestamp("2008-10-23 02:53:00")) + bad)
    with pytest.raises(GeoLifeError, match=rf"x\.plt:{line}: .*{message}"):
        geolife.read_plt(path)


def test_a_file_without_the_plt_header_is_refused(tmp_path):
    path = tmp_path / "y.plt"
    path.write_text("lat,lng\n1,2\n")
    with pytest.raises(GeoLifeError, match=r"y\.plt:1: not a GeoLife"):
        geolife.read_plt(path)


@pytest.mark.parametrize(
    "bad, message",
    [
        ("39.9,116.3,2008-10-23 05:53:05\n", "expected 4"),
        ("39.9,116.3,yesterday,001\n", "datetime"),
        ("39.9,116.3,2008-10-23 05:53:05,\n", "empty uid"),
    ],
)
def test_malformed_sample_lines_name_the_file_and_line(tmp_path, bad, message):
    path = tmp_path / "s.txt"
    path.write_text("lat,lng,datetime,uid\n39.9,116.3,2008-10-23 05:53:04,001\n" + bad)
    with pytest.raises(GeoLifeError, match=rf"s\.txt:3: .*{message}"):
        geolife.read_sample(path)


@needs_mirror
def test_mirror_users_verify_and_a_changed_file_is_caught(tmp_path, monkeypatch):
    release = geolife.fetch_release()
    assert len(release.users()) == 45
    check = release.verify_user("000")
    assert check["verified"] and check["files"] == 42
    # a copy of user 000 with one byte changed no longer matches the manifest
    files = release.files("000")
    write_user(tmp_path, "000", {})
    for f in files:
        (tmp_path / "000" / "Trajectory" / f.name).write_bytes(f.read_bytes())
    target = tmp_path / "000" / "Trajectory" / files[0].name
    target.write_bytes(target.read_bytes().replace(b"39.98", b"39.99", 1))
    tampered = geolife.Release(release.manifest, tmp_path, release.declared)
    with pytest.raises(GeoLifeError, match="user 000 .* expected 42 files"):
        tampered.verify_user("000")


def _zip_release(tmp_path: Path, members: dict[str, str]) -> str:
    archive = tmp_path / "release.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for name, text in members.items():
            zf.writestr(name, text)
    return archive.as_uri()


def _manifest_with_url(tmp_path: Path, url: str) -> manifests.Manifest:
    text = (manifests.MANIFEST_DIR / "geolife.yaml").read_text()
    old = next(l for l in text.splitlines() if l.strip().startswith("url: https://download.microsoft.com"))
    path = tmp_path / "geolife.yaml"
    path.write_text(text.replace(old, f"  url: {url}"))
    return manifests.load(path)


def test_paper_scale_downloads_and_extracts_the_official_zip(tmp_path, monkeypatch):
    monkeypatch.delenv("ONDEVICE_DATA_MIRROR", raising=False)
    monkeypatch.setenv("ONDEVICE_DATA_CACHE", str(tmp_path / "cache"))
    row = plt_row(39.9, 116.3, pd.Timestamp("2009-01-01 10:00:00"))
    url = _zip_release(tmp_path, {"Geolife Trajectories 1.3/Data/999/Trajectory/20090101100000.plt": HEADER + row})
    manifest = _manifest_with_url(tmp_path, url)
    with pytest.raises(manifests.DataError, match="paper scale downloads it from"):
        geolife.fetch_release(manifest)
    release = geolife.fetch_release(manifest, download=True)
    assert release.users() == ["999"]
    assert not release.verify_user("999")["verified"]  # not a declared user: read, but unverified
    assert len(release.points("999")) == 1


def test_unsafe_zip_members_are_refused_and_nothing_is_left(tmp_path, monkeypatch):
    monkeypatch.delenv("ONDEVICE_DATA_MIRROR", raising=False)
    monkeypatch.setenv("ONDEVICE_DATA_CACHE", str(tmp_path / "cache"))
    manifest = _manifest_with_url(tmp_path, _zip_release(tmp_path, {"../evil.plt": HEADER}))
    with pytest.raises(manifests.DataError, match="unsafe path"):
        geolife.fetch_release(manifest, download=True)
    assert not (tmp_path / "cache" / "geolife" / "release").exists()
    assert not list((tmp_path / "cache" / "geolife").glob(".release.*"))


# --- places and samples ----------------------------------------------------------------------


def _points(stays: list[tuple[str, float, float, int]]) -> pd.DataFrame:
    """Points every minute: (start GMT, lat, lng, minutes) per stay."""
    rows = []
    for start, lat, lng, minutes in stays:
        for m in range(minutes):
            rows.append((lat, lng, pd.Timestamp(start) + pd.Timedelta(minutes=m)))
    frame = pd.DataFrame(rows, columns=["lat", "lng", "time"])
    frame["time"] = frame.time.to_numpy("datetime64[s]")
    return frame


def test_grid_cells_are_shared_across_devices_and_windows_take_the_modal_cell():
    rule = places.PlaceRule(cell_m=1000)
    a, b = places.grid_cells(np.array([39.9901, 40.5]), np.array([116.3001, 116.0]), rule)
    assert places.grid_cells(np.array([39.9902]), np.array([116.3002]), rule)[0] == a != b
    pts = _points([("2009-01-01 00:00", 39.99, 116.30, 7), ("2009-01-01 00:07", 40.5, 116.0, 3)])
    win = places.windows(pts, rule)
    assert len(win) == 1 and win.cell[0] == a  # 7 of the window's 10 points are in the first cell


def test_samples_carry_the_six_features_and_fall_into_parts_by_day():
    rule = places.PlaceRule(
        cell_m=1000, min_place_bins=1, history=2, bootstrap_days=1, cycle_days=1, cycles=1, utc_offset_hours=8
    )
    # three days (local time = GMT + 8); each day: home 08:00-08:20 local, work 09:00-09:10 local
    stays = []
    for day in ("2009-01-05", "2009-01-06", "2009-01-07"):
        gmt = pd.Timestamp(day) - pd.Timedelta(hours=8)
        stays += [(gmt + pd.Timedelta(hours=8), 39.99, 116.30, 30), (gmt + pd.Timedelta(hours=9), 40.5, 116.0, 10)]
    data = places.build({"a": _points(stays)}, rule)
    assert data.vocabulary_size == 3 and not data.excluded
    d = data.devices["a"]
    home, work = 1 + np.argsort(
        [places.grid_cells([39.99], [116.30], rule)[0], places.grid_cells([40.5], [116.0], rule)[0]]
    )
    # steps per day: home 08:00, 08:10, 08:20 then work 09:00; the first sample predicts 08:20 from 08:00, 08:10
    x, y = d.X[0], d.y[0]
    assert list(x[:, 0]) == [home, home] and y == home
    assert list(x[:, 1]) == [8, 8] and list(x[:, 2]) == [10, 20]  # hour and minute of the next window
    assert list(x[:, 3]) == [0, 0]  # Monday
    assert list(x[:, 4]) == [0, 1] and list(x[:, 5]) == [1, 1]  # duration at home, gap to the next window
    second = d.X[1]  # predicts 09:00 (work): gap of 4 windows
    assert d.y[1] == work and second[-1, 5] == 4 and second[-1, 1] == 9 and second[-1, 2] == 0
    assert set(d.part.tolist()) == {0, 1, 2}
    assert np.all(np.diff(d.part) >= 0)


def test_devices_with_too_few_days_are_excluded():
    rule = places.PlaceRule(min_place_bins=1, history=1, bootstrap_days=2, cycle_days=2, cycles=1)
    data = places.build(
        {
            "short": _points([("2009-01-01 00:00", 39.99, 116.3, 30)]),
            "long": _points([(f"2009-01-{d:02d} 00:00", 39.99, 116.3, 30) for d in range(1, 8)]),
        },
        rule,
    )
    assert data.excluded == ["short"] and list(data.devices) == ["long"]


def _three_days(rule: places.PlaceRule) -> places.PlaceData:
    """Each day: home 08:00-08:20 local (three windows), then work 09:00 (one window)."""
    stays = []
    for day in ("2009-01-05", "2009-01-06", "2009-01-07"):
        gmt = pd.Timestamp(day) - pd.Timedelta(hours=8)
        stays += [(gmt + pd.Timedelta(hours=8), 39.99, 116.30, 30), (gmt + pd.Timedelta(hours=9), 40.5, 116.0, 10)]
    return places.build({"a": _points(stays)}, rule)


def test_visits_collapse_windows_and_carry_duration_and_gap_between_different_places():
    rule = places.PlaceRule(min_place_bins=1, history=2, bootstrap_days=1, cycle_days=1, cycles=1, sequence="visits")
    d = _three_days(rule).devices["a"]
    home, work = d.X[0, 0, 0], d.X[0, 1, 0]
    assert home != work
    # visits: home, work, home, work, home, work; the first sample predicts day 2's home from day 1's visits
    assert len(d.y) == 4 and list(d.y) == [home, work, home, work]
    x = d.X[0]
    assert list(x[:, 4]) == [2, 0]  # home lasted 08:00-08:20 (2 windows), work one window
    assert x[0, 5] == 4 and x[0, 1] == 9 and x[0, 2] == 0  # gap home -> work 08:20 -> 09:00; work starts 09:00
    assert x[1, 5] == 138 and x[1, 1] == 8 and x[1, 3] == 1  # work -> next home: 23 h = 138 windows, Tuesday 08:00
    assert np.all(d.y != d.X[:, -1, 0])  # the next place always differs from the current one


def test_the_vocabulary_holds_only_places_known_by_then():
    rule = places.PlaceRule(min_place_bins=2, history=1, bootstrap_days=1, cycle_days=1, cycles=1)
    # day 1 (part 0): home x3; day 2 (part 1): home x3, work x1; day 3 (part 2, the last test): work x1, gym x3
    stays = []
    for day, visits in (
        ("2009-01-05", [(39.99, 116.30, 30)]),
        ("2009-01-06", [(39.99, 116.30, 30), (40.5, 116.0, 10)]),
        ("2009-01-07", [(40.5, 116.0, 10), (41.0, 117.0, 30)]),
    ):
        start = pd.Timestamp(day)
        for k, (lat, lng, minutes) in enumerate(visits):
            stays.append((start + pd.Timedelta(hours=2 * k), lat, lng, minutes))
    data = places.build({"a": _points(stays)}, rule)
    # home is a place from part 0; work has one window before the last test (not a place); gym only in the test
    assert data.vocabulary_size == 2 and list(data.known_from) == [0, 0]
    d = data.devices["a"]
    _, y_test = d.take([2], known_by=1)
    assert set(y_test.tolist()) == {places.ELSEWHERE}  # work and gym: unknown, a miss whatever is predicted


def test_a_place_known_later_is_elsewhere_before():
    samples = places.DeviceSamples(
        "a",
        np.array([[[1, 0, 0, 0, 0, 0]], [[2, 0, 0, 0, 0, 0]]], np.int32),
        np.array([2, 1], np.int32),
        np.array([1, 2], np.int8),
        known_from=np.array([0, 0, 2]),
    )
    x, y = samples.take([1, 2], known_by=1)
    assert x[:, 0, 0].tolist() == [1, places.ELSEWHERE] and y.tolist() == [places.ELSEWHERE, 1]
    x, y = samples.take([1, 2], known_by=2)
    assert x[:, 0, 0].tolist() == [1, 2] and y.tolist() == [2, 1]
