"""MoIL's audio data: a user's ESC-50 classes (local) and either other ESC-50 classes held out as
the global set (default) or the AudioSet evaluation set (paper scale), as YAMNet's log-mel patches
with each clip's AudioSet labels; without ESC-50, a synthetic stand-in set. Split per class into
training and validation clips (local) and a GDM mixing pool and an evaluation set (global)."""

from __future__ import annotations

import csv
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ondevice import streams
from ondevice.data import audio_features, esc50, manifests
from ondevice.models import yamnet
from ondevice.papers.moil.protocol import MoilParams
from ondevice.papers.moil.techniques import gdm


@dataclass(frozen=True)
class AudioParams(MoilParams):
    """The audio sets and the YAMNet weights: what `load_data` and `audio_model` read."""

    local_classes: int = 50  # ESC-50 classes the user trains on
    global_classes: int = 0  # held-out ESC-50 classes that stand in for AudioSet (0: AudioSet itself)
    local_val_fraction: float = 0.2  # the thesis: 1,600 training / 400 validation clips
    holdout_fraction: float = 0.2  # of each class's training clips, held out to choose the rate (`rate_choice`)
    global_eval_fraction: float = 0.5  # held-out clips scored; the rest is GDM's mixing pool
    data: str = "auto"  # auto | esc50 | synthetic (auto: ESC-50 when available, else stand-in)
    esc50_root: str = ""  # the official ESC-50 release unpacked (paper scale)
    audioset_root: str = ""  # the AudioSet evaluation set (paper scale), see load_audioset
    yamnet_h5: str = ""  # yamnet.h5 (paper scale); empty: the TFLite weights

    UNITS = len(yamnet.LAYERS) + 1  # YAMNet's 14 conv layers and the classifier (`yamnet.units`)

    def check(self) -> None:
        super().check()
        self.require(self.data in ("auto", "esc50", "synthetic"), "data", "must be 'auto', 'esc50' or 'synthetic'")
        self.require(1 <= self.local_classes <= 50, "local_classes", "must lie in [1, 50]")
        self.require(
            0 <= self.global_classes <= 50 - self.local_classes,
            "global_classes",
            "must lie in [0, 50 - local_classes] (held-out ESC-50 classes)",
        )
        self.require(
            self.global_classes >= 2 or self.audioset_root,
            "global_classes",
            "must be at least 2 (held-out ESC-50 classes), or set audioset_root to the AudioSet "
            "evaluation set (<root>/eval_segments.csv and <root>/audio/<YTID>_<start>.wav)",
        )
        self.require(0 < self.local_val_fraction < 1, "local_val_fraction", "must lie in (0, 1)")
        self.require(0 < self.global_eval_fraction < 1, "global_eval_fraction", "must lie in (0, 1)")
        self.require(0 < self.holdout_fraction < 1, "holdout_fraction", "must lie in (0, 1)")


@dataclass
class Part:
    """Clips as patches: `patches[i]` belongs to clip `clip[i]`; labels and classes are per clip."""

    patches: np.ndarray
    clip: np.ndarray
    labels: np.ndarray  # [clips, 521] multi-hot AudioSet labels
    classes: np.ndarray  # [clips] the class a clip is sampled under (ESC-50 target)
    ids: np.ndarray  # [clips] file names

    def __len__(self) -> int:
        return len(self.labels)

    def patch_labels(self) -> np.ndarray:
        return self.labels[self.clip]

    def subset(self, clips: np.ndarray) -> "Part":
        clips = np.asarray(clips, np.int64)
        keep = np.isin(self.clip, clips)
        renumber = np.full(len(self.labels), -1)
        renumber[clips] = np.arange(len(clips))
        return Part(
            self.patches[keep], renumber[self.clip[keep]], self.labels[clips], self.classes[clips], self.ids[clips]
        )

    @staticmethod
    def of(waveforms: list[np.ndarray], labels: np.ndarray, classes, ids) -> "Part":
        """Clips as YAMNet's patches, with their labels, classes and file names."""
        patches, clip = audio_features.clip_patches(waveforms)
        return Part(patches, clip, np.asarray(labels, np.float32), np.asarray(classes, np.int64), np.asarray(ids))

    @staticmethod
    def concat(parts: list["Part"]) -> "Part":
        offsets = np.cumsum([0] + [len(p) for p in parts[:-1]])
        return Part(
            np.concatenate([p.patches for p in parts]),
            np.concatenate([p.clip + o for p, o in zip(parts, offsets)]),
            np.concatenate([p.labels for p in parts]),
            np.concatenate([p.classes for p in parts]),
            np.concatenate([p.ids for p in parts]),
        )


@dataclass
class AudioData:
    """The user's clips (training, validation), the global ones (mixing pool, evaluation) and their provenance."""

    local_train: Part
    local_val: Part
    global_pool: Part
    global_eval: Part
    class_names: list[str]
    local_categories: list[str]
    global_categories: list[str]
    source: str
    stand_in: str | None
    data: list[dict]  # manifests' summaries for run.json
    raw_clip_bytes: int  # float32 16 kHz waveform bytes of one clip
    clip_seconds: float
    samples: list[np.ndarray] = field(default_factory=list)  # a few real clips for the TFLite agreement check
    notes: dict = field(default_factory=dict)

    def table(self) -> pd.DataFrame:
        rows = []
        for name, part in (
            ("local training", self.local_train),
            ("local validation", self.local_val),
            ("global mixing pool", self.global_pool),
            ("global evaluation", self.global_eval),
        ):
            present = scored(part.labels)
            rows.append(
                {
                    "set": name,
                    "clips": len(part),
                    "patches": len(part.patches),
                    "classes": len(np.unique(part.classes)),
                    "AudioSet labels scored": int(present.sum()),
                }
            )
        return pd.DataFrame(rows)


def _split_by_class(classes: np.ndarray, fraction: float, rng) -> tuple[np.ndarray, np.ndarray]:
    """Per class, round(fraction * n) (at least 1, at most n - 1) clips to the second set."""
    first, second = [], []
    for c in np.unique(classes):
        members = rng.permutation(np.flatnonzero(classes == c))
        k = min(max(1, int(round(fraction * len(members)))), len(members) - 1)
        second.extend(members[:k])
        first.extend(members[k:])
    return np.sort(first), np.sort(second)


def synthetic_clips(classes: int, clips_per_class: int, seed: int) -> tuple[pd.DataFrame, list[np.ndarray]]:
    """Stand-in audio: per class a harmonic tone at its own pitch, amplitude-modulated at its own
    rate, in noise; each clip draws its phase, loudness and noise level. 5 s at 16 kHz."""
    rng = streams.rng(seed, "moil-audio/synthetic")
    t = np.arange(5 * esc50.SAMPLE_RATE) / esc50.SAMPLE_RATE
    rows, waves = [], []
    for c in range(classes):
        f0 = 150 * 2 ** (5 * c / max(classes, 1))
        for i in range(clips_per_class):
            tone = sum(np.sin(2 * np.pi * f0 * h * t + rng.uniform(0, 2 * np.pi)) / h for h in (1, 2, 3))
            am = 0.5 + 0.5 * np.sin(2 * np.pi * (1 + c % 5) * t + rng.uniform(0, 2 * np.pi))
            x = rng.uniform(0.1, 0.4) * tone * am + rng.uniform(0.005, 0.05) * rng.standard_normal(len(t))
            waves.append(np.clip(x, -1, 1).astype(np.float32))
            rows.append(
                {"filename": f"synthetic-{c}-{i}.wav", "fold": 1 + i % 5, "target": c, "category": f"synthetic_{c}"}
            )
    return pd.DataFrame(rows), waves


def synthetic_mapping(classes: int) -> dict[int, list[int]]:
    """Stand-in class c -> AudioSet output columns: its own and a parent shared by three classes."""
    return {c: [c, classes + c // 3] for c in range(classes)}


def _class_map() -> tuple[list[str], dict]:
    path = manifests.resolve("yamnet", "class_map")
    return yamnet.class_names(path), manifests.load("yamnet").summary()


def _real_clips(params: AudioParams, log) -> tuple[esc50.Clips, list[dict]]:
    if params.esc50_root:
        return esc50.load_root(params.esc50_root), []
    if params.scale == "paper":
        raise esc50.Esc50Error(f"the paper scale needs all of ESC-50: set esc50_root to {esc50.LAYOUT}")
    clips = esc50.load_declared()
    log(f"ESC-50: {len(clips.meta)} clips from {clips.source}, verified against data_manifests/esc50.yaml")
    return clips, [manifests.load("esc50").summary()]


AUDIOSET = "AudioSet evaluation set"  # the global set's one name at paper scale
AUDIOSET_LAYOUT = (
    "<audioset_root>/eval_segments.csv (the official CSV: '#' comment lines, then rows "
    'YTID, start_seconds, end_seconds, "mid,mid,...") and <audioset_root>/audio/<YTID>_<start_seconds '
    "as an integer>.wav (16-bit PCM, any rate; the clips you downloaded)"
)


def load_audioset(root: str | Path, class_names: list[str]) -> tuple[pd.DataFrame, list[np.ndarray], np.ndarray]:
    """The AudioSet evaluation set as (meta, waveforms, labels), laid out as `AUDIOSET_LAYOUT`.
    Labels are YAMNet's 521 outputs (by mid, from its class map); a listed clip that is missing
    is skipped (the thesis: some are no longer available), and so is one none of whose labels
    YAMNet outputs (6 of AudioSet's 527 classes are not among them). `target`, the class GDM
    samples a clip under, is the lowest of its labels' outputs (as `gdm.sampling_class`)."""
    root = Path(root)
    csv_path = root / "eval_segments.csv"
    if not csv_path.is_file() or not (root / "audio").is_dir():
        raise manifests.DataError(f"no AudioSet evaluation set at {root}: expected {AUDIOSET_LAYOUT}")
    with open(manifests.resolve("yamnet", "class_map"), newline="") as f:
        mids = {row["mid"]: int(row["index"]) for row in csv.DictReader(f)}
    rows, waves, labels = [], [], []
    with open(csv_path, newline="") as f:
        for line, rec in enumerate(csv.reader((line for line in f if not line.startswith("#")), skipinitialspace=True)):
            if not rec:
                continue
            if len(rec) != 4:
                raise manifests.DataError(
                    f"{csv_path}: row {line + 1} has {len(rec)} fields, expected {AUDIOSET_LAYOUT}"
                )
            ytid, start, _, positive = (value.strip() for value in rec)
            path = root / "audio" / f"{ytid}_{int(float(start))}.wav"
            outputs = [mids[m.strip()] for m in positive.split(",") if m.strip() in mids]
            if not path.is_file() or not outputs:
                continue
            y = np.zeros(len(class_names), np.float32)
            y[outputs] = 1
            waves.append(esc50.read_wav(path))
            labels.append(y)
            rows.append({"filename": path.name, "target": min(outputs)})
    if not rows:
        raise manifests.DataError(
            f"{root}/audio holds none of the clips listed in {csv_path} (with a label YAMNet "
            f"outputs): expected {AUDIOSET_LAYOUT}"
        )
    return pd.DataFrame(rows), waves, np.stack(labels)


def _synthetic_source(params: AudioParams):
    """The synthetic STAND-IN audio set: (clips, class names, ESC-50 -> AudioSet mapping, stand-in
    text, source name, data record)."""
    n = params.local_classes + params.global_classes
    meta, waves = synthetic_clips(n, 8, params.seed)
    clips = esc50.Clips(meta, "synthetic", "", waves=dict(enumerate(waves)))
    class_names = [f"stand-in class {i}" for i in range(yamnet.CLASSES)]
    mapping = {c: [class_names[i] for i in cols] for c, cols in synthetic_mapping(n).items()}
    stand_in = (
        "ESC-50 and the published YAMNet (not found on this machine): synthetic tones in noise, "
        "8 clips per class, and a YAMNet pre-trained on other synthetic clips"
    )
    data = [
        {
            "name": "synthetic-audio",
            "license": "generated",
            "stand_in_for": stand_in,
            "artifacts": [{"file": "generated in memory", "sha256": "0" * 64, "size": 0}],
        }
    ]
    return clips, class_names, mapping, stand_in, "synthetic stand-in", data


def load_data(params: AudioParams, log=print) -> AudioData:
    """Local and global sets as patches. `data="auto"` falls back to the synthetic stand-in only
    when ESC-50 cannot be found (and says so); `data="esc50"` and the paper scale make that an error."""
    rng = streams.rng(params.seed, "moil-audio/split")
    stand_in, data = None, []
    clips = None
    if params.data != "synthetic":
        try:
            clips, data = _real_clips(params, log)
            class_names, yamnet_summary = _class_map()
            data.append(yamnet_summary)
        except manifests.DataError as exc:
            if params.data == "esc50" or params.scale == "paper":
                raise
            log(f"ESC-50 or YAMNet unavailable ({exc}); using the synthetic STAND-IN audio set")
            clips = None
    if clips is None:
        clips, class_names, mapping, stand_in, source, data = _synthetic_source(params)
    else:
        mapping = esc50.read_mapping()
        source = f"ESC-50 ({clips.source})"
    meta = clips.meta
    targets = np.array(sorted(meta.target.unique()))
    if params.audioset_root:
        local_t, global_t = targets[: params.local_classes], np.array([], int)
    else:
        need = params.local_classes + params.global_classes
        if len(targets) < need:
            raise ValueError(f"{source} has {len(targets)} classes, local_classes + global_classes = {need}")
        chosen = rng.permutation(targets)[:need]
        local_t, global_t = np.sort(chosen[: params.local_classes]), np.sort(chosen[params.local_classes :])
    labels = esc50.audioset_labels(meta.target, mapping, class_names)

    def part_of(rows: np.ndarray) -> Part:
        return Part.of(
            [clips.waveform(i) for i in rows],
            labels[rows],
            meta.target.to_numpy()[rows],
            meta.filename.to_numpy()[rows],
        )

    local_rows = np.flatnonzero(meta.target.isin(local_t))
    train, val = _split_by_class(meta.target.to_numpy()[local_rows], params.local_val_fraction, rng)
    if params.audioset_root:
        as_meta, as_waves, as_labels = load_audioset(params.audioset_root, class_names)
        pool_i, eval_i = _split_by_class(as_meta.target.to_numpy(), params.global_eval_fraction, rng)
        whole = Part.of(as_waves, as_labels, as_meta.target.to_numpy(), as_meta.filename.to_numpy())
        pool, evaluation = whole.subset(pool_i), whole.subset(eval_i)
        global_names = [AUDIOSET]
    else:
        global_rows = np.flatnonzero(meta.target.isin(global_t))
        pool_i, eval_i = _split_by_class(meta.target.to_numpy()[global_rows], params.global_eval_fraction, rng)
        pool, evaluation = part_of(global_rows[pool_i]), part_of(global_rows[eval_i])
        global_names = sorted(meta[meta.target.isin(global_t)].category.unique())
    seconds = float(np.median([len(clips.waveform(i)) for i in local_rows])) / esc50.SAMPLE_RATE
    result = AudioData(
        local_train=part_of(local_rows[train]),
        local_val=part_of(local_rows[val]),
        global_pool=pool,
        global_eval=evaluation,
        class_names=class_names,
        local_categories=sorted(meta[meta.target.isin(local_t)].category.unique()),
        global_categories=global_names,
        source=source,
        stand_in=stand_in,
        data=data,
        raw_clip_bytes=int(round(seconds * esc50.SAMPLE_RATE)) * 4,
        clip_seconds=seconds,
        notes={"audio_digest": clips.digest},
        samples=[clips.waveform(i) for i in rng.choice(local_rows, size=min(8, len(local_rows)), replace=False)],
    )
    log(
        f"{source}: local classes {', '.join(result.local_categories)}; held-out (global) classes "
        f"{', '.join(result.global_categories)}"
    )
    return result


def scored(labels: np.ndarray) -> np.ndarray:
    """Which AudioSet labels an AUC can score: present on some clips and absent on others."""
    pos = labels.sum(axis=0)
    return (pos > 0) & (pos < len(labels))


def classes_table(data: AudioData) -> pd.DataFrame:
    """The user's classes and the held-out ones, with the AudioSet labels they are scored on."""
    mapping = esc50.read_mapping() if not data.stand_in else {}
    cats = pd.read_csv(esc50.MAPPING).set_index("category").target
    rows = [
        {"role": role, "class": c, "AudioSet labels": "; ".join(mapping.get(int(cats[c]), [])) if c in cats else ""}
        for role, names in (("local (user)", data.local_categories), ("global (held out)", data.global_categories))
        for c in names
    ]
    return pd.DataFrame(rows)


def data_banner(data: AudioData) -> str:
    """What the notebook says at the top about its data."""
    if data.stand_in:
        return (
            f"**This run uses stand-in data.** {data.stand_in}. Every number below comes from that "
            "synthetic set, not from ESC-50 or the published YAMNet; only the code path is exercised."
        )
    return (
        f"**Real data:** {data.source}, the published YAMNet's weights, {len(data.local_categories)} local (user) "
        f"classes and {len(data.global_categories)} held-out classes standing in for AudioSet."
    )


def mixed_training_set(data: AudioData, alpha: float, seed: int) -> Part:
    """D_M = D_L u SamplePerClass(D_G, alpha) over clips (eq. 4.1-4.2), sampled per held-out ESC-50
    class (the pool's clips carry several AudioSet labels; their ESC-50 class is the one each was
    drawn for). The draw depends on alpha and the seed alone, so every run with the same alpha
    mixes the same clips."""
    picks = gdm.sample_global(data.global_pool.classes, alpha, streams.rng(seed, f"moil-audio/gdm/{alpha:g}"))
    return Part.concat([data.local_train, data.global_pool.subset(picks)])


def hold_out(data: AudioData, fraction: float, seed: int) -> tuple[AudioData, Part]:
    """The rate choice's split of the user's *training* clips (never the validation clips, the
    local test set): per class, `fraction` of them (at least one, at most all but one) held out;
    the data with the rest as its training clips, and the held-out clips."""
    rest, held = _split_by_class(data.local_train.classes, fraction, streams.rng(seed, "moil-audio/rate-holdout"))
    return dataclasses.replace(data, local_train=data.local_train.subset(rest)), data.local_train.subset(held)
