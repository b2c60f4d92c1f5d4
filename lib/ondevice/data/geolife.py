"""GeoLife GPS Trajectories 1.3: real per-device GPS points, the devices of the Colla notebooks.

Two layouts are read: the official release, `Data/<uid>/Trajectory/<yyyymmddhhmmss>.plt` (6
header lines, then `lat,lng,0,altitude,days,date,time` rows in GMT), and the two-user sample as
scikit-mobility publishes it (`lat,lng,datetime,uid`, gzip). A malformed line is an error naming
the file and the line. The license forbids redistribution: nothing read here may be committed;
only aggregate metrics computed from it.

The release is found in the mirror (`ONDEVICE_DATA_MIRROR/geolife/Data`, the 45-user subset), or
in the data cache, where `fetch_release` downloads and extracts the official zip (paper scale).
Each user the manifest declares is verified file by file (`verify_user`).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import shutil
import tempfile
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from . import manifests
from .manifests import DataError

DATASET = "geolife"
PLT_HEADER_LINES = 6
SAMPLE_COLUMNS = ["lat", "lng", "datetime", "uid"]
PLT_COLUMNS = ["lat", "lng", "zero", "altitude", "days", "date", "clock"]
DATETIME_FORMAT = "%Y-%m-%d %H:%M:%S"
EXCEL_EPOCH = np.datetime64("1899-12-30T00:00:00", "s")  # day 0 of the .plt files' field 5


class GeoLifeError(DataError):
    """A GeoLife file is malformed or a user's files do not match the manifest."""


def _bad_line(path: Path, lines: list[str], first_line: int, check) -> None:
    """Raise naming the first line (1-based) of `lines` that `check` rejects."""
    for n, line in enumerate(lines, first_line):
        reason = check(line) if line.strip() else ""
        if reason:
            raise GeoLifeError(f"{path}:{n}: {reason}: {line.strip()[:80]!r}")


def _check_coordinates(lat: str, lng: str) -> str:
    try:
        la, lo = float(lat), float(lng)
    except ValueError:
        return "latitude/longitude are not numbers"
    if not (-90 <= la <= 90 and -180 <= lo <= 180):
        return "latitude/longitude out of range"
    return ""


def _check_plt_row(line: str) -> str:
    fields = line.strip().split(",")
    if len(fields) != 7:
        return f"expected 7 comma-separated fields, got {len(fields)}"
    bad = _check_coordinates(fields[0], fields[1])
    if bad:
        return bad
    try:
        float(fields[4])
    except ValueError:
        return "field 5 (days since 1899-12-30) is not a number"
    return ""


def _sample_frame(path: Path, raw: pd.DataFrame, lines: list[str]) -> pd.DataFrame:
    """lat, lng (float) and time (datetime64[s]) of the sample's rows; a bad row is reported by line."""
    lat = pd.to_numeric(raw.lat, errors="coerce").to_numpy(float)
    lng = pd.to_numeric(raw.lng, errors="coerce").to_numpy(float)
    time = pd.to_datetime(raw.datetime.str.strip(), errors="coerce", format=DATETIME_FORMAT)
    bad = np.isnan(lat) | np.isnan(lng) | pd.isna(time) | (np.abs(lat) > 90) | (np.abs(lng) > 180)
    if bad.any():
        _bad_line(path, lines, 2, _check_sample_row)
        raise GeoLifeError(f"{path}: a row after the header could not be read")
    return pd.DataFrame({"lat": lat, "lng": lng, "time": np.asarray(time, "datetime64[s]")})


def _text(path: Path) -> str:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", errors="replace") as f:
        return f.read()


def _empty() -> pd.DataFrame:
    return pd.DataFrame({"lat": np.zeros(0), "lng": np.zeros(0), "time": np.array([], "datetime64[s]")})


def read_plt(path: Path) -> pd.DataFrame:
    """One trajectory file of the official layout: columns lat, lng, time (GMT).

    The time comes from field 5, days since 1899-12-30 (the User Guide: the same instant as the
    date and time fields), rounded to the second: one float column parses far faster than text.
    """
    path = Path(path)
    with open(path, errors="replace") as f:
        header = [f.readline() for _ in range(PLT_HEADER_LINES)]
    if not header[0].startswith("Geolife trajectory") or not header[-1]:
        raise GeoLifeError(
            f"{path}:1: not a GeoLife .plt file (expected the 6-line header starting 'Geolife trajectory')"
        )
    try:
        raw = pd.read_csv(
            path,
            skiprows=PLT_HEADER_LINES,
            header=None,
            usecols=[0, 1, 4],
            names=PLT_COLUMNS,
            dtype={"lat": float, "lng": float, "days": float},
        )
        ok = not raw.isna().any(axis=None) and raw.lat.abs().le(90).all() and raw.lng.abs().le(180).all()
    except pd.errors.EmptyDataError:
        return _empty()
    except (pd.errors.ParserError, ValueError):
        ok = False
    if not ok:
        _bad_line(path, _text(path).splitlines()[PLT_HEADER_LINES:], PLT_HEADER_LINES + 1, _check_plt_row)
        raise GeoLifeError(f"{path}: rows after the header could not be read")
    seconds = np.round(raw.days.to_numpy() * 86400).astype(np.int64)
    return pd.DataFrame(
        {"lat": raw.lat.to_numpy(), "lng": raw.lng.to_numpy(), "time": EXCEL_EPOCH + seconds.astype("timedelta64[s]")}
    )


def _check_sample_row(line: str) -> str:
    fields = line.strip().split(",")
    if len(fields) != 4:
        return f"expected 4 comma-separated fields (lat,lng,datetime,uid), got {len(fields)}"
    bad = _check_coordinates(fields[0], fields[1])
    if bad:
        return bad
    try:
        pd.to_datetime(fields[2].strip(), format=DATETIME_FORMAT)
    except ValueError:
        return f"datetime does not parse as {DATETIME_FORMAT}"
    return "" if fields[3].strip() else "empty uid"


def read_sample(path: Path) -> dict[str, pd.DataFrame]:
    """The sample layout `lat,lng,datetime,uid` (plain or gzip): points per uid, sorted by time."""
    path = Path(path)
    lines = _text(path).splitlines()
    if not lines or [c.strip() for c in lines[0].split(",")] != SAMPLE_COLUMNS:
        raise GeoLifeError(
            f"{path}:1: expected the header {','.join(SAMPLE_COLUMNS)}, got {lines[0][:80] if lines else ''!r}"
        )
    rows = lines[1:]
    if not any(r.strip() for r in rows):
        return {}
    try:
        raw = pd.read_csv(io.StringIO("\n".join(rows)), header=None, dtype=str, names=SAMPLE_COLUMNS)
        malformed = raw.isna().any(axis=1).any()
    except (pd.errors.ParserError, ValueError):
        malformed = True
    if malformed:
        _bad_line(path, rows, 2, _check_sample_row)
        raise GeoLifeError(f"{path}: rows after the header could not be read")
    frame = _sample_frame(path, raw, rows)
    frame["uid"] = raw.uid.str.strip().to_numpy()
    return {
        u: g.drop(columns="uid").sort_values("time", kind="stable").reset_index(drop=True)
        for u, g in frame.groupby("uid", sort=True)
    }


def user_files(data_dir: Path, uid: str, first: str | None = None, last: str | None = None) -> list[Path]:
    """A user's .plt files in name (= start time) order, optionally only those from first to last."""
    folder = Path(data_dir) / uid / "Trajectory"
    if not folder.is_dir():
        raise GeoLifeError(f"user {uid}: no folder {folder}")
    files = sorted(folder.glob("*.plt"))
    return [f for f in files if (first is None or f.name >= first) and (last is None or f.name <= last)]


def files_digest(uid: str, files: list[Path]) -> str:
    """sha256 of the sorted lines "<sha256>  <uid>/Trajectory/<name>": one user's files at once."""
    lines = "".join(f"{manifests.sha256_of(f)}  {uid}/Trajectory/{f.name}\n" for f in sorted(files))
    return hashlib.sha256(lines.encode()).hexdigest()


@dataclass(frozen=True)
class Release:
    """Where the release's `Data/` folder is and what the manifest declares about its users."""

    manifest: manifests.Manifest
    data_dir: Path
    declared: dict  # uid -> {first, last, files, bytes, sha256}

    def users(self) -> list[str]:
        return sorted(p.name for p in self.data_dir.iterdir() if (p / "Trajectory").is_dir())

    def files(self, uid: str) -> list[Path]:
        """The user's declared file range when declared (so the full release reads the same
        files as the subset), else all of the user's files."""
        d = self.declared.get(uid)
        return user_files(self.data_dir, uid, d["first"], d["last"]) if d else user_files(self.data_dir, uid)

    def verify_user(self, uid: str) -> dict:
        """The user's files checked against the manifest: {uid, files, bytes, sha256, verified}."""
        files = self.files(uid)
        if not files:
            raise GeoLifeError(f"user {uid}: no .plt files under {self.data_dir / uid / 'Trajectory'}")
        digest = files_digest(uid, files)
        d = self.declared.get(uid)
        if d and (len(files) != d["files"] or digest != d["sha256"]):
            raise GeoLifeError(
                f"{self.manifest.path.name}: user {uid} under {self.data_dir} has {len(files)} files "
                f"with digest {digest}, expected {d['files']} files with {d['sha256']}"
            )
        return {
            "uid": uid,
            "files": len(files),
            "bytes": sum(f.stat().st_size for f in files),
            "sha256": digest,
            "verified": bool(d),
        }

    def points(self, uid: str) -> pd.DataFrame:
        """All points of one user (lat, lng, time in GMT), sorted by time."""
        frames = [read_plt(f) for f in self.files(uid)]
        return pd.concat(frames, ignore_index=True).sort_values("time", kind="stable").reset_index(drop=True)


def _release_block(manifest: manifests.Manifest) -> dict:
    import yaml

    raw = yaml.safe_load(manifest.path.read_text())
    block = raw.get("release")
    if not isinstance(block, dict) or not {"url", "data_dir", "mirror", "users"} <= set(block):
        raise DataError(f"malformed manifest {manifest.path}: 'release' needs url, data_dir, mirror and users")
    return block


def fetch_release(manifest: manifests.Manifest | None = None, download: bool = False) -> Release:
    """The release's Data folder: the mirror's copy, else the cache's extraction of the official
    zip, else (with `download`) the zip fetched from Microsoft and extracted safely into the cache."""
    manifest = manifest or manifests.load(DATASET)
    block = _release_block(manifest)
    mirror = manifests.mirror_dir()
    if mirror is not None and (mirror / block["mirror"]).is_dir():
        return Release(manifest, mirror / block["mirror"], block["users"])
    root = manifests.cache_dir() / manifest.name / "release"
    if not (root / ".complete").is_file():
        if not download:
            raise DataError(
                f"{manifest.path.name}: the GeoLife release is neither in the mirror "
                f"({mirror / block['mirror'] if mirror else 'ONDEVICE_DATA_MIRROR unset'}) nor in the cache "
                f"({root}); the paper scale downloads it from {block['url']}"
            )
        _download_zip(block["url"], root)
    return Release(manifest, root / block["data_dir"], block["users"])


def _download_zip(url: str, root: Path) -> None:
    """Download and extract into root, refusing absolute or `..` member paths; nothing
    half-extracted is left behind."""
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root.parent, prefix=".release."))
    try:
        archive = tmp / "release.zip"
        with urllib.request.urlopen(url, timeout=120) as response, open(archive, "wb") as out:
            shutil.copyfileobj(response, out)
        with zipfile.ZipFile(archive) as zf:
            for name in zf.namelist():
                if name.startswith("/") or ".." in Path(name).parts:
                    raise DataError(f"unsafe path {name!r} in the GeoLife archive from {url}")
            zf.extractall(tmp / "tree")
        (tmp / "tree" / ".complete").write_text(url)
        if root.exists():
            shutil.rmtree(root)
        os.replace(tmp / "tree", root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def sample_points(manifest: manifests.Manifest | None = None) -> dict[str, pd.DataFrame]:
    """The two-user sample (users 001 and 005), fetched and verified through the manifest."""
    return read_sample(manifests.resolve(manifest or DATASET, "sample"))
