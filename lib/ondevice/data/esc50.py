"""ESC-50 (Piczak 2015) in its official layout, and its classes mapped to AudioSet's (MoIL Table 5.1).

Layout: `meta/esc50.csv` (filename, fold, target, category, ...) and `audio/<filename>.wav`
(5 s, 44.1 kHz, 16-bit mono), resampled here to YAMNet's 16 kHz. Where it comes from:
- a directory given explicitly (`root`, e.g. the official archive unpacked: all 2,000 clips);
- otherwise `data_manifests/esc50.yaml`: the metadata fetched and verified like any artifact, the
  audio read from the data mirror (`ONDEVICE_DATA_MIRROR`) and verified file by file against the
  manifest's digest of the declared subset.

`esc50_audioset_map.csv` (beside this file) maps each ESC-50 class to AudioSet display names,
reviewed by hand against `yamnet_class_map.csv`: the class itself where AudioSet has it, its
sound where that is how AudioSet names it (dog -> Bark), and its parents in the ontology (Animal,
Vehicle, Liquid) that are among YAMNet's 521 outputs.
"""

from __future__ import annotations

import csv
import hashlib
import wave
from dataclasses import dataclass, field
from math import gcd
from pathlib import Path

import numpy as np
import pandas as pd

from . import manifests

MAPPING = Path(__file__).with_name("esc50_audioset_map.csv")
SAMPLE_RATE = 16000
META_COLUMNS = ("filename", "fold", "target", "category")
LAYOUT = "<root>/meta/esc50.csv and <root>/audio/<filename>.wav (the official ESC-50 archive, unpacked)"


class Esc50Error(manifests.DataError):
    """ESC-50 is missing, incomplete or malformed; the message names the file."""


@dataclass
class Clips:
    """Clips with their metadata rows; `waveform(i)` reads row i's audio (16 kHz, [-1, 1]) when
    first asked, so a run decodes only the classes it uses."""

    meta: pd.DataFrame
    source: str  # where they were read from
    digest: str  # sha256 over the audio files' checksums, for run.json
    paths: list[Path] = field(default_factory=list)
    waves: dict[int, np.ndarray] = field(default_factory=dict)

    def waveform(self, i: int) -> np.ndarray:
        if i not in self.waves:
            self.waves[i] = read_wav(self.paths[i])
        return self.waves[i]


def read_meta(path: Path) -> pd.DataFrame:
    path = Path(path)
    if not path.is_file():
        raise Esc50Error(f"ESC-50 metadata not found: {path} (expected {LAYOUT})")
    try:
        meta = pd.read_csv(path)
    except (pd.errors.ParserError, UnicodeDecodeError, pd.errors.EmptyDataError) as exc:
        raise Esc50Error(f"{path}: not a readable CSV ({exc})") from exc
    missing = [c for c in META_COLUMNS if c not in meta.columns]
    if missing:
        raise Esc50Error(f"{path}: missing column(s) {missing}; ESC-50's esc50.csv has {list(META_COLUMNS)} and more")
    bad = meta[~meta.target.between(0, 49) | ~meta.fold.between(1, 5)]
    if len(bad):
        raise Esc50Error(
            f"{path}: row {int(bad.index[0]) + 2} has target {bad.target.iloc[0]} / fold "
            f"{bad.fold.iloc[0]} (targets are 0-49, folds 1-5)"
        )
    return meta


def read_wav(path: Path, rate: int = SAMPLE_RATE) -> np.ndarray:
    """A 16-bit PCM wav as float32 in [-1, 1], mono (channels averaged), resampled to `rate`."""
    from scipy.signal import resample_poly

    path = Path(path)
    if not path.is_file():
        raise Esc50Error(f"ESC-50 clip not found: {path} (expected {LAYOUT})")
    try:
        with wave.open(str(path)) as w:
            channels, width, source_rate, frames = w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()
            raw = w.readframes(frames)
    except (wave.Error, EOFError) as exc:
        raise Esc50Error(f"{path}: not a readable PCM wav file ({exc})") from exc
    if width != 2:
        raise Esc50Error(f"{path}: {8 * width}-bit samples, expected 16-bit PCM")
    if frames == 0 or len(raw) != frames * channels * width:
        raise Esc50Error(f"{path}: truncated ({len(raw)} bytes of audio for {frames} frames)")
    x = np.frombuffer(raw, "<i2").reshape(-1, channels).mean(axis=1).astype(np.float32) / 32768.0
    if source_rate != rate:
        g = gcd(rate, source_rate)
        x = resample_poly(x, rate // g, source_rate // g).astype(np.float32)
    return x


def read_mapping(path: Path = MAPPING) -> dict[int, list[str]]:
    """ESC-50 target -> AudioSet display names."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return {int(r["target"]): [n for n in r["audioset"].split(";") if n] for r in rows}


def audioset_labels(targets, mapping: dict[int, list[str]], class_names: list[str]) -> np.ndarray:
    """Multi-hot rows over AudioSet's classes for ESC-50 targets."""
    index = {n: i for i, n in enumerate(class_names)}
    unknown = sorted({n for t in set(map(int, targets)) for n in mapping[t] if n not in index})
    if unknown:
        raise ValueError(f"mapping names classes that are not AudioSet's: {unknown}")
    labels = np.zeros((len(targets), len(class_names)), np.float32)
    for row, t in enumerate(targets):
        labels[row, [index[n] for n in mapping[int(t)]]] = 1.0
    return labels


def load(meta_path: Path, audio_dir: Path, source: str, expected_digest: str | None = None) -> Clips:
    """Every clip the metadata lists, in audio_dir (checked and checksummed now, decoded when
    used); with `expected_digest` the files must be exactly the declared ones: the sha256 of the
    lines "<sha256 of the file>  audio/<name>" in the metadata's order."""
    meta = read_meta(meta_path)
    digest = hashlib.sha256()
    paths = []
    for name in meta.filename:
        path = Path(audio_dir) / name
        if not path.is_file():
            raise Esc50Error(f"ESC-50 clip {name} is listed in {meta_path} but missing: {path} (expected {LAYOUT})")
        digest.update(f"{manifests.sha256_of(path)}  audio/{name}\n".encode())
        paths.append(path)
    got = digest.hexdigest()
    if expected_digest and got != expected_digest:
        raise Esc50Error(
            f"ESC-50 audio in {audio_dir} differs from the subset declared in esc50.yaml "
            f"(digest {got}, expected {expected_digest}): a file is changed or corrupt"
        )
    return Clips(meta.reset_index(drop=True), source, got, paths)


def load_root(root: str | Path) -> Clips:
    """The official layout under `root` (all it lists; the full release has 2,000 clips)."""
    root = Path(root)
    if not (root / "meta" / "esc50.csv").is_file() or not (root / "audio").is_dir():
        raise Esc50Error(
            f"no ESC-50 at {root}: expected {LAYOUT}; download "
            "https://github.com/karolpiczak/ESC-50/archive/master.zip and unpack it"
        )
    return load(root / "meta" / "esc50.csv", root / "audio", str(root))


def load_declared() -> Clips:
    """The subset declared in data_manifests/esc50.yaml: metadata verified by the manifest, audio
    from the mirror, verified against the declared digest. Raises DataError when unavailable."""
    manifest = manifests.load("esc50")
    meta_path = manifests.resolve(manifest, "meta")
    mirror = manifests.mirror_dir()
    release = manifests_release(manifest)
    if mirror is None or not (mirror / release["mirror"] / "audio").is_dir():
        raise Esc50Error(
            f"ESC-50 audio not found: set ONDEVICE_DATA_MIRROR to a mirror holding "
            f"{release['mirror']}/audio, or pass the official archive's directory ({LAYOUT})"
        )
    return load(
        meta_path,
        mirror / release["mirror"] / "audio",
        f"mirror:{release['mirror']}",
        expected_digest=release["subset"]["sha256"],
    )


def manifests_release(manifest: manifests.Manifest) -> dict:
    """The manifest's `release` block (official archive and the mirror's subset digest)."""
    import yaml

    release = yaml.safe_load(manifest.path.read_text()).get("release")
    if not isinstance(release, dict) or "mirror" not in release or "sha256" not in release.get("subset", {}):
        raise manifests.DataError(f"malformed manifest {manifest.path}: needs release.mirror and release.subset.sha256")
    return release
