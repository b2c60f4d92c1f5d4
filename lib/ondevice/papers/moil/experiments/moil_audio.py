"""MoIL audio (M4-M6): personalising the pre-trained YAMNet on a user's ESC-50 sounds with global
dataset mixing GDM(alpha), layer freezing LF(n) and feature-map caching FMC.

Default scale, real data: the published YAMNet (its TFLite weights imported into our Keras
YAMNet) and ESC-50 from the data mirror. The user owns `local_classes` ESC-50 classes (their clips
split into training and validation, labels mapped to AudioSet labels as in Table 5.1). Without
AudioSet, "global" accuracy is measured on `global_classes` other ESC-50 classes the user never
trains on: their clips are split into an evaluation set and a disjoint mixing pool (GDM samples
only the pool), scored by AUC on their mapped AudioSet labels; forgetting shows there. Paper
scale: all of ESC-50 is local and the AudioSet evaluation set is global. Without ESC-50 and the
mirror, a synthetic stand-in set (and a YAMNet pre-trained on it) lets the notebook complete.

AUC: ROC AUC per AudioSet class present (positives and negatives among the clips), averaged;
`metrics.roc_auc` is the exact area under the empirical ROC curve, i.e. the trapezoidal rule
over its points. A clip's scores are the mean of its patches' sigmoid scores (YAMNet's clip
scoring); training is per patch with the clip's labels.

Stages (the notebook calls one per section): `load_data`, `pretrained`, `gdm_sweep`, `lf_sweep`,
`fmc`, `benchmark`, `on_device`, `conclude`; `run` calls them all.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.special import expit

from ondevice import streams
from ondevice.data import audio_features, esc50, manifests
from ondevice.device import tflite
from ondevice.metrics import roc_auc
from ondevice.models import yamnet
from ondevice.papers.moil.techniques import feature_cache, gdm, layer_freezing
from ondevice.params import Params as BaseParams
from ondevice.report import claims, record
from ondevice.tasks.classification import ClassificationTask
from ondevice.training import model_cache
from ondevice.training.trainer import Trainer, seed_everything

NAME = "moil_audio"
PRE_AUC = 0.956  # Sec. 5.1.2: their pre-trained YAMNet on AudioSet

PAPER = claims.Paper(
    citation="Fan, MoIL: Enabling Efficient Incremental Training on Edge Devices, thesis 2022, Sec. 5.1.2, 5.2, "
    "5.3 (Fig. 5.4, 5.6, 5.8 and footnote 6); YAMNet pre-trained on AudioSet, local ESC-50",
    numbers=(
        claims.PaperNumber("global AUC, pre-trained", PRE_AUC, "Sec. 5.1.2"),
        claims.PaperNumber(
            "global AUC, GDM(0)",
            round(PRE_AUC * 0.97, 4),
            "Sec. 5.3.1: at most 3% loss for every alpha (the bound; Fig. 5.6 values are not given)",
        ),
        claims.PaperNumber("global AUC, GDM(alpha)", round(PRE_AUC * (1 - 0.016), 4), "Sec. 5.2: GDM(0.1%) -1.6% AUC"),
        claims.PaperNumber(
            "global AUC, GDM(alpha) + LF(n)", round(PRE_AUC * (1 - 0.009), 4), "Sec. 5.2: with LF(3) -0.9% AUC"
        ),
        claims.PaperNumber(
            "global AUC, GDM(alpha) + LF(n) + FMC",
            round(PRE_AUC * (1 - 0.009), 4),
            "Sec. 5.2: FMC does not change accuracy",
        ),
        claims.PaperNumber("largest global AUC loss over the alpha sweep", 0.03, "Sec. 5.3.1: at most 3%"),
        claims.PaperNumber("cached bytes per 10 s of audio (KB)", 960.0, "footnote 6: 960 KB"),
        claims.PaperNumber("raw waveform bytes per 10 s of audio (KB)", 625.0, "footnote 6: 625 KB"),
        claims.PaperNumber("cache size / raw waveform size", 960 / 625, "footnote 6: 50% more storage"),
    ),
    effects=(
        claims.Effect(
            "GDM(0) loses global AUC (catastrophic forgetting)", "global AUC, pre-trained", "global AUC, GDM(0)"
        ),
        claims.Effect(
            "mixing global data keeps more global AUC than GDM(0)", "global AUC, GDM(alpha)", "global AUC, GDM(0)"
        ),
        claims.Effect(
            "LF(n) keeps more global AUC than full training", "global AUC, GDM(alpha) + LF(n)", "global AUC, GDM(alpha)"
        ),
        claims.Effect(
            "FMC changes no global AUC", "global AUC, GDM(alpha) + LF(n) + FMC", "global AUC, GDM(alpha) + LF(n)"
        ),
    ),
)
# Timing claims: judged on measured step times (one run), kept out of the deterministic tables.
PAPER_TIME = {"LF(3) speed-up over full training": 4.1, "FMC speed-up over LF(3) without the cache": 1.8}


@dataclass(frozen=True)
class Params(BaseParams):
    local_classes: int = 50  # ESC-50 classes the user trains on
    global_classes: int = 0  # held-out ESC-50 classes that stand in for AudioSet (0: AudioSet itself)
    local_val_fraction: float = 0.2  # the thesis: 1,600 training / 400 validation clips
    global_eval_fraction: float = 0.5  # held-out clips scored; the rest is GDM's mixing pool
    alpha: float = 0.001  # GDM's sampling ratio of the combined runs (thesis: 0.1%)
    alphas: tuple[float, ...] = (0.0, 0.001, 0.01, 0.1)
    n: int = 3  # LF(n) of the combined runs (thesis: LF(3))
    ns: tuple[int, ...] = (1, 3, 5)
    epochs: int = 10
    batch_size: int = 32
    learning_rate: float = 0.0005  # Adam; the thesis's pre-training rate (it gives none for personalisation)
    timing_steps: int = 30  # steady-state steps timed per configuration (the thesis's 30)
    warmup_steps: int = 5
    tflite_check_steps: int = 3
    bootstrap: int = 2000
    data: str = "auto"  # auto | esc50 | synthetic (auto: ESC-50 when available, else stand-in)
    esc50_root: str = ""  # the official ESC-50 release unpacked (paper scale)
    audioset_root: str = ""  # the AudioSet evaluation set (paper scale), see load_audioset
    yamnet_h5: str = ""  # yamnet.h5 (paper scale); empty: the TFLite weights

    PRESETS = {
        "smoke": dict(
            local_classes=3,
            global_classes=3,
            alpha=0.5,
            alphas=(0.0, 0.5),
            n=2,
            ns=(1, 2),
            epochs=2,
            timing_steps=5,
            warmup_steps=2,
            tflite_check_steps=2,
            bootstrap=300,
        ),
        "default": dict(
            local_classes=20,
            global_classes=30,
            local_val_fraction=0.25,
            alpha=0.25,
            alphas=(0.0, 0.25, 1.0),
            ns=(1, 3, 5),
            epochs=5,
            bootstrap=1000,
        ),
        "paper": dict(),
    }

    def check(self) -> None:
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
        self.require(0 <= self.alpha <= 1, "alpha", "must lie in [0, 1]")
        self.require(
            bool(self.alphas) and all(0 <= a <= 1 for a in self.alphas), "alphas", "must hold values in [0, 1]"
        )
        self.require(0.0 in self.alphas, "alphas", "must include 0 (catastrophic forgetting)")
        self.require(self.alpha in self.alphas and self.alpha > 0, "alpha", "must be a positive value of alphas")
        units = len(yamnet.LAYERS) + 1
        self.require(1 <= self.n < units, "n", f"must lie in [1, {units - 1}] (YAMNet has {units} layers)")
        self.require(
            bool(self.ns) and all(1 <= n < units for n in self.ns), "ns", f"must hold values in [1, {units - 1}]"
        )
        self.require(self.n in self.ns, "n", "must be one of ns")
        for name in ("epochs", "batch_size", "timing_steps", "warmup_steps"):
            self.require(getattr(self, name) >= 1, name, "must be at least 1")
        self.require(self.learning_rate > 0, "learning_rate", "must be positive")
        self.require(self.tflite_check_steps >= 0, "tflite_check_steps", "must be >= 0 (0 = skip)")
        self.require(self.bootstrap >= 100, "bootstrap", "must be at least 100 resamples")


# ---------------------------------------------------------------------------------------------
# Data


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
    def concat(parts: list["Part"]) -> "Part":
        offsets = np.cumsum([0] + [len(p) for p in parts[:-1]])
        return Part(
            np.concatenate([p.patches for p in parts]),
            np.concatenate([p.clip + o for p, o in zip(parts, offsets)]),
            np.concatenate([p.labels for p in parts]),
            np.concatenate([p.classes for p in parts]),
            np.concatenate([p.ids for p in parts]),
        )


def _part(waveforms: list[np.ndarray], labels: np.ndarray, classes, ids) -> Part:
    patches, clip = audio_features.clip_patches(waveforms)
    return Part(patches, clip, np.asarray(labels, np.float32), np.asarray(classes, np.int64), np.asarray(ids))


@dataclass
class AudioData:
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
            present = _present(part.labels)
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


def _real_clips(params: Params, log) -> tuple[esc50.Clips, list[dict]]:
    if params.esc50_root:
        return esc50.load_root(params.esc50_root), []
    if params.scale == "paper":
        raise esc50.Esc50Error(f"the paper scale needs all of ESC-50: set esc50_root to {esc50.LAYOUT}")
    clips = esc50.load_declared()
    log(f"ESC-50: {len(clips.meta)} clips from {clips.source}, verified against data_manifests/esc50.yaml")
    return clips, [manifests.load("esc50").summary()]


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
    import csv as _csv

    with open(manifests.resolve("yamnet", "class_map"), newline="") as f:
        mids = {row["mid"]: int(row["index"]) for row in _csv.DictReader(f)}
    rows, waves, labels = [], [], []
    with open(csv_path, newline="") as f:
        for line, rec in enumerate(
            _csv.reader((line for line in f if not line.startswith("#")), skipinitialspace=True)
        ):
            if not rec:
                continue
            if len(rec) != 4:
                raise manifests.DataError(
                    f"{csv_path}: row {line + 1} has {len(rec)} fields, expected {AUDIOSET_LAYOUT}"
                )
            ytid, start, _, positive = (field.strip() for field in rec)
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


def load_data(params: Params, log=print) -> AudioData:
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
        n = params.local_classes + params.global_classes
        meta, waves = synthetic_clips(n, 8, params.seed)
        clips = esc50.Clips(meta, "synthetic", "", waves=dict(enumerate(waves)))
        class_names = [f"stand-in class {i}" for i in range(yamnet.CLASSES)]
        mapping = {c: [class_names[i] for i in cols] for c, cols in synthetic_mapping(n).items()}
        stand_in = (
            "ESC-50 and the published YAMNet (not found on this machine): synthetic tones in noise, "
            "8 clips per class, and a YAMNet pre-trained on other synthetic clips"
        )
        source = "synthetic stand-in"
        data = [
            {
                "name": "synthetic-audio",
                "license": "generated",
                "stand_in_for": stand_in,
                "artifacts": [{"file": "generated in memory", "sha256": "0" * 64, "size": 0}],
            }
        ]
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
        return _part(
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
        whole = _part(as_waves, as_labels, as_meta.target.to_numpy(), as_meta.filename.to_numpy())
        pool, evaluation = whole.subset(pool_i), whole.subset(eval_i)
        global_names = ["AudioSet evaluation set"]
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


# ---------------------------------------------------------------------------------------------
# Scoring


def _present(labels: np.ndarray) -> np.ndarray:
    pos = labels.sum(axis=0)
    return (pos > 0) & (pos < len(labels))


def clip_scores(predict, part: Part, inputs=None, batch: int = 256) -> np.ndarray:
    """Mean sigmoid score of each clip's patches: [clips, classes]."""
    x = part.patches if inputs is None else inputs
    logits = np.concatenate([predict(np.asarray(x[i : i + batch])) for i in range(0, len(x), batch)])
    scores = expit(logits.astype(np.float64))
    sums = np.zeros((len(part), scores.shape[1]))
    np.add.at(sums, part.clip, scores)
    return sums / np.bincount(part.clip, minlength=len(part))[:, None]


def class_aucs(part: Part, scores: np.ndarray) -> pd.Series:
    """AUC per AudioSet class present in the part (index: class column)."""
    cols = np.flatnonzero(_present(part.labels))
    return pd.Series([roc_auc(part.labels[:, c], scores[:, c]) for c in cols], index=cols)


def _predictor(model):
    import tensorflow as tf

    fn = tf.function(
        lambda x: model(x, training=False), input_signature=[tf.TensorSpec([None, *model.input_shape[1:]])]
    )
    return lambda x: fn(x).numpy()


def _quiet_retracing(fn):
    """Each run compiles its own train and predict functions; TensorFlow then warns about
    "retracing" the same Python lambdas (with object addresses that differ between runs)."""
    import functools

    import tensorflow as tf

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        logger = tf.get_logger()
        level = logger.level
        logger.setLevel("ERROR")
        try:
            return fn(*args, **kwargs)
        finally:
            logger.setLevel(level)

    return wrapper


# ---------------------------------------------------------------------------------------------
# The pre-trained model


@dataclass
class Pretrained:
    weights: list[np.ndarray]
    source: str
    agreement: pd.DataFrame | None
    global_auc: pd.Series
    local_auc: pd.Series


def _import_weights(params: Params, log) -> tuple[list[np.ndarray], str]:
    model = yamnet.build()
    if params.yamnet_h5:
        if not Path(params.yamnet_h5).is_file():
            raise manifests.DataError(
                f"yamnet_h5: no file at {params.yamnet_h5} (download "
                "https://storage.googleapis.com/audioset/yamnet.h5, see data_manifests/yamnet_h5.yaml)"
            )
        yamnet.load_h5(model, params.yamnet_h5)
        return model.get_weights(), f"yamnet.h5 ({params.yamnet_h5})"
    path = manifests.resolve("yamnet", "tflite")
    yamnet.import_tflite(model, path)
    log(f"YAMNet: imported the weights of {path.name} (int8 kernels dequantised, batch norm folded)")
    return model.get_weights(), "yamnet.tflite (imported)"


def agreement(model, tflite_path: Path, waveforms: list[np.ndarray]) -> pd.DataFrame:
    """Our Keras YAMNet vs the published TFLite model on the first 0.975 s of real clips: scores
    on the TFLite model's own log-mel patch (the network alone) and on our front end's (end to
    end; the TFLite front end multiplies by int8-rounded DFT and mel matrices)."""
    interp = tflite.interpreter(Path(tflite_path).read_bytes())
    inp = interp.get_input_details()[0]["index"]
    out = {o["name"]: o["index"] for o in interp.get_output_details()}
    predict = _predictor(model)
    rows = []
    for i, w in enumerate(waveforms):
        x = np.pad(w, (0, max(0, audio_features.PATCH_SAMPLES - len(w))))[: audio_features.PATCH_SAMPLES]
        interp.set_tensor(inp, x[None].astype(np.float32))
        interp.invoke()
        ref, ref_mel = interp.get_tensor(out["Identity"])[0], interp.get_tensor(out["Identity_1"])
        ours_net = expit(predict(ref_mel[None])[0])
        ours = expit(predict(audio_features.patches(x)[:1])[0])
        rows.append(
            {
                "clip": i,
                "network: max |score difference|": float(np.abs(ours_net - ref).max()),
                "network: same top class": bool(ours_net.argmax() == ref.argmax()),
                "end to end: max |score difference|": float(np.abs(ours - ref).max()),
                "end to end: same top class": bool(ours.argmax() == ref.argmax()),
                "end to end: top-5 overlap": len(set(np.argsort(-ours)[:5]) & set(np.argsort(-ref)[:5])),
            }
        )
    return pd.DataFrame(rows)


def _synthetic_pretraining(params: Params, data: AudioData, log) -> list[np.ndarray]:
    """A YAMNet trained on fresh synthetic clips of every stand-in class (the stand-in's AudioSet)."""
    n = params.local_classes + params.global_classes
    fields = {"classes": n, "clips_per_class": 6, "epochs": 4, "batch_size": 32, "learning_rate": 1e-3}

    def train():
        seed_everything(params.seed)
        meta, waves = synthetic_clips(n, fields["clips_per_class"], params.seed + 1000)
        cols = synthetic_mapping(n)
        labels = np.zeros((len(meta), yamnet.CLASSES), np.float32)
        for row, t in enumerate(meta.target):
            labels[row, cols[t]] = 1
        part = _part(waves, labels, meta.target, meta.filename)
        model = yamnet.build(seed=params.seed, train_batchnorm=True)
        trainer = Trainer(model, _task(), fields["learning_rate"])
        history = trainer.fit(
            (part.patches, part.patch_labels()),
            fields["epochs"],
            fields["batch_size"],
            streams.rng(params.seed, "moil-audio/synthetic-pretraining"),
            log=log,
            label="stand-in pre-training",
        )
        return model.get_weights(), {"history": history}

    code = model_cache.code_digest([Path(__file__), Path(yamnet.__file__), Path(audio_features.__file__)])
    entry = model_cache.load_or_train(
        "moil_audio_synthetic_yamnet", {**fields, "seed": params.seed}, [], code, train, log
    )
    return entry.weights


def _task(input_shape=(yamnet.PATCH_FRAMES, yamnet.MEL_BINS)) -> ClassificationTask:
    return ClassificationTask(tuple(input_shape), yamnet.CLASSES, multi_label=True)


@_quiet_retracing
def pretrained(params: Params, data: AudioData, log=print) -> Pretrained:
    """The pre-trained YAMNet's weights (imported, or the stand-in's), its agreement with the
    published TFLite model on real clips, and its AUCs before any personalisation."""
    table = None
    if data.stand_in:
        weights, source = _synthetic_pretraining(params, data, log), "YAMNet pre-trained on synthetic stand-in clips"
    else:
        weights, source = _import_weights(params, log)
    model = yamnet.build()
    model.set_weights(weights)
    if not data.stand_in and not params.yamnet_h5:
        table = agreement(model, manifests.resolve("yamnet", "tflite"), data.samples)
    predict = _predictor(model)
    return Pretrained(
        weights,
        source,
        table,
        class_aucs(data.global_eval, clip_scores(predict, data.global_eval)),
        class_aucs(data.local_val, clip_scores(predict, data.local_val)),
    )


# ---------------------------------------------------------------------------------------------
# Personalisation runs


@dataclass
class Run:
    """One configuration's training: AUC per epoch, final per-class AUCs and its step timings."""

    name: str
    alpha: float
    n: int | None  # None: every layer trains
    fmc: bool
    history: list[dict]
    global_auc: pd.Series  # per class, after the last epoch
    local_auc: pd.Series
    train_clips: int
    steps_per_epoch: int
    steady_step_seconds: float
    cache_seconds: float = 0.0
    cache: dict | None = None  # FMC: feature-map cache report


def _label(alpha: float, n: int | None, fmc: bool) -> str:
    name = f"GDM({alpha:g})"
    if n is not None:
        name += f" + LF({n})"
    return name + (" + FMC" if fmc else "")


def mixed_training_set(params: Params, data: AudioData, alpha: float) -> Part:
    """D_M = D_L u SamplePerClass(D_G, alpha) over clips (eq. 4.1-4.2), sampled per held-out ESC-50
    class (the pool's clips carry several AudioSet labels; their ESC-50 class is the one each was
    drawn for). The draw depends on alpha alone, so every run with the same alpha mixes the same clips."""
    picks = gdm.sample_global(data.global_pool.classes, alpha, streams.rng(params.seed, f"moil-audio/gdm/{alpha:g}"))
    return Part.concat([data.local_train, data.global_pool.subset(picks)])


@_quiet_retracing
def personalize(
    params: Params,
    data: AudioData,
    pre: Pretrained,
    alpha: float,
    n: int | None = None,
    fmc: bool = False,
    log=print,
    cache_dir: Path | None = None,
) -> Run:
    """Train the pre-trained YAMNet on the mixed set for `epochs`, scoring global and local AUC
    after every epoch. With FMC the frozen part runs once per clip patch (training and both
    evaluation sets), the maps go to .npy files and the head trains from them; batches are drawn
    from the same stream as without the cache, so FMC and LF(n) see the same batches."""
    if fmc and n is None:
        raise ValueError("FMC needs layer freezing (n)")
    seed_everything(params.seed)
    name = _label(alpha, n, fmc)
    train = mixed_training_set(params, data, alpha)
    model = yamnet.build()
    model.set_weights(pre.weights)
    hooks = [layer_freezing.LayerFreezing(n, yamnet.units)] if n is not None else []
    labels = train.patch_labels()
    cache_seconds, cache = 0.0, None
    if fmc:
        layer_freezing.freeze(model, n, yamnet.units)
        frozen, head = layer_freezing.split(model, n, yamnet.units)
        tmp = Path(cache_dir or tempfile.mkdtemp(prefix="moil-audio-fmc-"))
        start = time.perf_counter()
        feats = {"train": feature_cache.build(frozen, train.patches, tmp / "train.npy", 256)}
        cache_seconds = time.perf_counter() - start  # Algorithm 2 caches D_M; evaluation sets below
        feats.update(
            {
                key: feature_cache.build(frozen, part.patches, tmp / f"{key}.npy", 256)
                for key, part in (("global", data.global_eval), ("local", data.local_val))
            }
        )
        per_patch = feature_cache.bytes_per_sample(feats["train"])
        cache = {
            **feature_cache.size_report(feats["train"], data.raw_clip_bytes // _patches_per_clip(data)),
            "cache_file_bytes": sum((tmp / f"{k}.npy").stat().st_size for k in feats),
            "patches_cached": sum(len(f) for f in feats.values()),
            "bytes_per_patch": per_patch,
        }
        trainer = Trainer(
            head,
            _task(head.input_shape[1:]),
            params.learning_rate,
            hooks=[feature_cache.CachedFeatures(feats["train"], labels)],
            warmup_steps=params.warmup_steps,
        )
        fit_data = (feats["train"], labels)
        predict = _predictor(head)
        score = {
            "global": lambda: clip_scores(predict, data.global_eval, feats["global"]),
            "local": lambda: clip_scores(predict, data.local_val, feats["local"]),
        }
    else:
        trainer = Trainer(model, _task(), params.learning_rate, hooks=hooks, warmup_steps=params.warmup_steps)
        fit_data = (train.patches, labels)
        predict = _predictor(model)
        score = {
            "global": lambda: clip_scores(predict, data.global_eval),
            "local": lambda: clip_scores(predict, data.local_val),
        }
    rng = streams.rng(params.seed, "moil-audio/batches")
    history = [
        {
            "run": name,
            "epoch": 0,
            "global_auc": float(pre.global_auc.mean()),
            "local_auc": float(pre.local_auc.mean()),
            "loss": float("nan"),
        }
    ]
    for epoch in range(1, params.epochs + 1):
        h = trainer.fit(fit_data, 1, params.batch_size, rng)[0]
        g, l_ = class_aucs(data.global_eval, score["global"]()), class_aucs(data.local_val, score["local"]())
        history.append(
            {
                "run": name,
                "epoch": epoch,
                "global_auc": float(g.mean()),
                "local_auc": float(l_.mean()),
                "loss": h["loss"],
                "epoch_seconds": h["seconds"],
            }
        )
        log(
            f"{name} epoch {epoch}/{params.epochs}: loss {h['loss']:.4f}, global AUC {g.mean():.4f}, "
            f"local AUC {l_.mean():.4f} ({h['seconds']:.1f}s)"
        )
    steps = -(-len(labels) // params.batch_size)
    return Run(name, alpha, n, fmc, history, g, l_, len(train), steps, trainer.timer.steady(), cache_seconds, cache)


def _patches_per_clip(data: AudioData) -> int:
    return audio_features.patches_per_clip(int(round(data.clip_seconds * esc50.SAMPLE_RATE)))


def gdm_sweep(params: Params, data: AudioData, pre: Pretrained, log=print) -> list[Run]:
    """GDM(alpha) with every layer training, for each alpha (Fig. 5.6)."""
    return [personalize(params, data, pre, a, log=log) for a in params.alphas]


def lf_sweep(params: Params, data: AudioData, pre: Pretrained, log=print) -> list[Run]:
    """GDM(alpha) + LF(n) for each n (Fig. 5.8)."""
    return [personalize(params, data, pre, params.alpha, n, log=log) for n in params.ns]


def fmc(params: Params, data: AudioData, pre: Pretrained, lf_runs: list[Run], log=print) -> tuple[Run, Run]:
    """GDM(alpha) + LF(n) + FMC, and the LF(n) run without the cache it must equal."""
    lf = next((r for r in lf_runs if r.n == params.n), None) or personalize(
        params, data, pre, params.alpha, params.n, log=log
    )
    with tempfile.TemporaryDirectory(prefix="moil-audio-fmc-") as tmp:
        cached = personalize(params, data, pre, params.alpha, params.n, fmc=True, log=log, cache_dir=Path(tmp))
    return cached, lf


def fmc_equality(cached: Run, lf: Run) -> pd.DataFrame:
    """FMC vs LF without caching, epoch by epoch (same seed, same batches)."""
    a, b = pd.DataFrame(cached.history), pd.DataFrame(lf.history)
    return pd.DataFrame(
        {
            "epoch": a.epoch,
            "global AUC, LF": b.global_auc,
            "global AUC, FMC": a.global_auc,
            "local AUC, LF": b.local_auc,
            "local AUC, FMC": a.local_auc,
            "max |AUC difference|": np.maximum((a.global_auc - b.global_auc).abs(), (a.local_auc - b.local_auc).abs()),
        }
    )


def cache_table(cached: Run, data: AudioData) -> pd.DataFrame:
    """M6: what FMC stores per clip against the raw waveform (float32 at 16 kHz, the thesis's
    625 KB per 10 s) and against the 16-bit 44.1 kHz file, scaled to 10 s as in footnote 6."""
    c, per_clip = cached.cache, _patches_per_clip(data)
    per10 = audio_features.patches_per_clip(10 * esc50.SAMPLE_RATE)
    rows = [
        {
            "what": "feature-map cache (our clip)",
            "per": f"{data.clip_seconds:g} s clip",
            "shape": f"{per_clip} x {c['feature_shape']}",
            "bytes": per_clip * c["bytes_per_patch"],
        },
        {
            "what": "raw waveform, float32 16 kHz",
            "per": f"{data.clip_seconds:g} s clip",
            "shape": "",
            "bytes": data.raw_clip_bytes,
        },
        {
            "what": "raw file, int16 44.1 kHz",
            "per": f"{data.clip_seconds:g} s clip",
            "shape": "",
            "bytes": int(round(data.clip_seconds * 44100)) * 2,
        },
        {
            "what": "feature-map cache",
            "per": "10 s of audio",
            "shape": f"{per10} x {c['feature_shape']}",
            "bytes": per10 * c["bytes_per_patch"],
        },
        {
            "what": "raw waveform, float32 16 kHz",
            "per": "10 s of audio",
            "shape": "",
            "bytes": 10 * esc50.SAMPLE_RATE * 4,
        },
    ]
    table = pd.DataFrame(rows)
    table["KB"] = table.bytes / 1024
    table["vs raw float32 waveform"] = table.bytes / np.where(
        table.per == "10 s of audio", 10 * esc50.SAMPLE_RATE * 4, data.raw_clip_bytes
    )
    return table


# ---------------------------------------------------------------------------------------------
# Step timing in one run


@_quiet_retracing
def benchmark(params: Params, data: AudioData, pre: Pretrained, log=print) -> pd.DataFrame:
    """Steady-state step time (median after warm-up, `timing_steps` steps, batch `batch_size`) of
    full training, head-only (LF(1)) and LF(n) with the forward pass, and both from the cache,
    back to back in this process, plus the frozen part's forward time per patch (FMC's one-off
    cache build)."""
    train = mixed_training_set(params, data, params.alpha)
    x, y = train.patches, train.patch_labels()
    order = streams.rng(params.seed, "moil-audio/benchmark").permutation(len(x))
    steps = params.warmup_steps + params.timing_steps
    idx = [
        np.resize(order, steps * params.batch_size)[i * params.batch_size : (i + 1) * params.batch_size]
        for i in range(steps)
    ]
    rows = []
    for n in dict.fromkeys((None, 1, params.n)):  # LF(1) is head-only training; LF(n) the combined runs
        for cached in (False,) if n is None else (False, True):
            model = yamnet.build()
            model.set_weights(pre.weights)
            if n is None:
                trainer, inputs = Trainer(model, _task(), params.learning_rate, warmup_steps=params.warmup_steps), x
                build_per_patch = 0.0
            else:
                hook = layer_freezing.LayerFreezing(n, yamnet.units)
                if cached:
                    layer_freezing.freeze(model, n, yamnet.units)
                    frozen, head = layer_freezing.split(model, n, yamnet.units)
                    sample = np.concatenate([x[i] for i in idx])
                    start = time.perf_counter()
                    feats = np.concatenate(
                        [frozen(sample[i : i + 256], training=False).numpy() for i in range(0, len(sample), 256)]
                    )
                    build_per_patch = (time.perf_counter() - start) / len(sample)
                    trainer = Trainer(
                        head, _task(head.input_shape[1:]), params.learning_rate, warmup_steps=params.warmup_steps
                    )
                    inputs = np.zeros((len(x), *feats.shape[1:]), np.float32)
                    inputs[np.concatenate(idx)] = feats
                else:
                    trainer, inputs = (
                        Trainer(model, _task(), params.learning_rate, hooks=[hook], warmup_steps=params.warmup_steps),
                        x,
                    )
                    build_per_patch = 0.0
            for i in idx:
                trainer.step(inputs[i], y[i])
            name = (
                "full training"
                if n is None
                else f"LF({n})" + (" from the cache (FMC)" if cached else " with forward pass")
            )
            rows.append(
                {
                    "configuration": name,
                    "n": n if n is not None else 0,
                    "cached": cached,
                    "steady_step_seconds": trainer.timer.steady(),
                    "step_seconds": trainer.timer.durations[params.warmup_steps :],
                    "cache_build_seconds_per_patch": build_per_patch,
                }
            )
            log(
                f"timing {name}: {params.timing_steps} steps after {params.warmup_steps} warm-up "
                f"({sum(trainer.timer.durations[params.warmup_steps :]):.1f}s)"
            )
    table = pd.DataFrame(rows)
    full = table.steady_step_seconds.iloc[0]
    table["time ratio to full training"] = table.steady_step_seconds / full
    steps_epoch = -(-len(x) // params.batch_size)
    # FMC adds its one-off pass of the frozen part over the training set (Algorithm 2)
    table["training_time_seconds (epochs x steps x step)"] = (
        params.epochs * steps_epoch * table.steady_step_seconds + table.cache_build_seconds_per_patch * len(x)
    )
    return table


def benchmark_ratios(bench: pd.DataFrame, n: int) -> dict[str, float]:
    """The printed ratios: head-only from cache vs with forward pass vs full training."""
    t = bench.set_index("configuration").steady_step_seconds
    return {
        "full training / head-only with forward pass (LF(1))": t["full training"] / t["LF(1) with forward pass"],
        "head-only with forward pass / head-only from cache": t["LF(1) with forward pass"]
        / t["LF(1) from the cache (FMC)"],
        "full training / head-only from cache": t["full training"] / t["LF(1) from the cache (FMC)"],
        f"full training / LF({n})": t["full training"] / t[f"LF({n}) with forward pass"],
        f"LF({n}) / LF({n}) from the cache": t[f"LF({n}) with forward pass"] / t[f"LF({n}) from the cache (FMC)"],
    }


def timing_effects(params: Params, bench: pd.DataFrame, rng) -> pd.DataFrame:
    """Speed-up claims, judged on per-step times (paired by step, one run): the 95% interval of the
    ratio of median step times from a bootstrap over the timed steps."""
    steps = bench.set_index("configuration").step_seconds
    pairs = {
        "LF(3) speed-up over full training": ("full training", f"LF({params.n}) with forward pass"),
        "FMC speed-up over LF(3) without the cache": (
            f"LF({params.n}) with forward pass",
            f"LF({params.n}) from the cache (FMC)",
        ),
    }
    rows = []
    for claim, (slow, fast) in pairs.items():
        r = claims.paired_effect(np.asarray(steps[slow]), np.asarray(steps[fast]), rng, n_boot=params.bootstrap)
        rows.append(
            {
                "effect": claim.replace("LF(3)", f"LF({params.n})"),
                "paper speed-up (time)": PAPER_TIME[claim],
                "our speed-up (time)": 1 + r["change"],
                "ci low (time)": 1 + r["ci_low"],
                "ci high (time)": 1 + r["ci_high"],
                "timed steps": r["users"],
                "verdict (time)": r["verdict"],
            }
        )
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------
# On device


def on_device(params: Params, data: AudioData, pre: Pretrained, log=print):
    """Export the personal model (GDM(alpha) + LF(n)) as a trainable TFLite file and run its first
    training steps in TensorFlow and through the interpreter from the same weights and batches."""
    if not params.tflite_check_steps:
        return None, None
    train = mixed_training_set(params, data, params.alpha)
    task = _task()
    batches = list(
        task.batches(
            (train.patches, train.patch_labels()),
            params.batch_size,
            streams.rng(params.seed, "moil-audio/diagnostics/tflite"),
        )
    )[: params.tflite_check_steps]
    model = yamnet.build()
    model.set_weights(pre.weights)
    check = tflite.compare_training(
        model, task, params.learning_rate, batches, hooks=[layer_freezing.LayerFreezing(params.n, yamnet.units)]
    )
    table = pd.DataFrame(
        {"step": range(1, len(batches) + 1), "loss_tensorflow": check["tensorflow"], "loss_tflite": check["tflite"]}
    )
    table["abs_difference"] = (table.loss_tflite - table.loss_tensorflow).abs()
    table.attrs["max_output_difference"] = float(np.abs(check["outputs_tflite"] - check["outputs_tensorflow"]).max())
    log(
        f"on-device check: {len(table)} LF({params.n}) steps through the TFLite interpreter, max |loss difference| "
        f"{table.abs_difference.max():.2e}, max |logit difference| after them "
        f"{table.attrs['max_output_difference']:.2e}"
    )
    return table, check["flatbuffer"]


# ---------------------------------------------------------------------------------------------
# Conclusions


def runs_table(runs: list[Run], pre: Pretrained, params: Params) -> pd.DataFrame:
    rows = []
    for r in runs:
        rows.append(
            {
                "run": r.name,
                "alpha": r.alpha,
                "n": r.n if r.n is not None else 0,
                "fmc": r.fmc,
                "training clips": r.train_clips,
                "steps per epoch": r.steps_per_epoch,
                "global AUC": float(r.global_auc.mean()),
                "local AUC": float(r.local_auc.mean()),
                "global AUC change": float(r.global_auc.mean() / pre.global_auc.mean() - 1),
                "local AUC change": float(r.local_auc.mean() / pre.local_auc.mean() - 1),
                "steady_step_seconds": r.steady_step_seconds,
                "training_time_seconds": params.epochs * r.steps_per_epoch * r.steady_step_seconds + r.cache_seconds,
            }
        )
    return pd.DataFrame(rows).drop_duplicates("run")


def conclude(
    params: Params,
    data: AudioData,
    pre: Pretrained,
    alpha_runs: list[Run],
    lf_runs: list[Run],
    cached: Run,
    lf: Run,
    bench: pd.DataFrame,
    on_device_table,
    flatbuffer,
    wall_time_s: float,
) -> record.Result:
    """Tables, headline numbers, the thesis's numbers beside ours and three-way verdicts."""
    by_alpha = {r.alpha: r for r in alpha_runs}
    g0, ga = by_alpha[0.0], by_alpha[params.alpha]
    runs = runs_table([*alpha_runs, *lf_runs, cached], pre, params)
    cache = cache_table(cached, data)
    ten = cache[cache.per == "10 s of audio"].set_index("what").bytes
    ours = {
        "global AUC, pre-trained": float(pre.global_auc.mean()),
        "global AUC, GDM(0)": float(g0.global_auc.mean()),
        "global AUC, GDM(alpha)": float(ga.global_auc.mean()),
        "global AUC, GDM(alpha) + LF(n)": float(lf.global_auc.mean()),
        "global AUC, GDM(alpha) + LF(n) + FMC": float(cached.global_auc.mean()),
        "largest global AUC loss over the alpha sweep": float(
            max(1 - r.global_auc.mean() / pre.global_auc.mean() for r in alpha_runs)
        ),
        "cached bytes per 10 s of audio (KB)": ten["feature-map cache"] / 1024,
        "raw waveform bytes per 10 s of audio (KB)": ten["raw waveform, float32 16 kHz"] / 1024,
    }
    ours["cache size / raw waveform size"] = (
        ours["cached bytes per 10 s of audio (KB)"] / ours["raw waveform bytes per 10 s of audio (KB)"]
    )
    numbers = claims.paper_vs_ours(PAPER, ours)
    numbers.loc[numbers.quantity.str.contains("LF\\(n\\)"), "quantity"] = numbers.quantity.str.replace(
        "LF(n)", f"LF({params.n})", regex=False
    )
    measured = {
        "GDM(0) loses global AUC (catastrophic forgetting)": (pre.global_auc, g0.global_auc),
        "mixing global data keeps more global AUC than GDM(0)": (ga.global_auc, g0.global_auc),
        "LF(n) keeps more global AUC than full training": (lf.global_auc, ga.global_auc),
        "FMC changes no global AUC": (cached.global_auc, lf.global_auc),
    }
    measured = {k: (b.to_numpy(), w.to_numpy()) for k, (b, w) in measured.items()}
    effects = claims.effects_table(
        PAPER, measured, streams.rng(params.seed, "moil-audio/bootstrap"), n_boot=params.bootstrap
    )
    effects["effect"] = effects.effect.str.replace("LF(n)", f"LF({params.n})", regex=False)
    per_seed = {
        "global AUC, pre-trained": ours["global AUC, pre-trained"],
        "global AUC, GDM(0)": ours["global AUC, GDM(0)"],
        f"global AUC, GDM({params.alpha:g})": ours["global AUC, GDM(alpha)"],
        f"global AUC, GDM({params.alpha:g}) + LF({params.n})": ours["global AUC, GDM(alpha) + LF(n)"],
        f"local AUC, GDM({params.alpha:g}) + LF({params.n})": float(lf.local_auc.mean()),
        "local AUC, pre-trained": float(pre.local_auc.mean()),
    }
    headline = {q: claims.headline([v]) for q, v in per_seed.items()}
    timing = timing_effects(params, bench, streams.rng(params.seed, "moil-audio/bootstrap/time"))
    history = pd.DataFrame([h for r in [*alpha_runs, *lf_runs, cached] for h in r.history]).drop_duplicates(
        ["run", "epoch"]
    )
    tables = {
        "data": data.table(),
        "classes": classes_table(data),
        "history": history,
        "runs": runs,
        "fmc_equality": fmc_equality(cached, lf),
        "cache_size": cache,
        "benchmark": bench.drop(columns="step_seconds"),
        "timing_effects": timing,
        "headline": claims.headline_table(headline),
        "paper_vs_ours": numbers,
        "effects": effects,
    }
    if pre.agreement is not None:
        tables["tflite_agreement"] = pre.agreement
    if on_device_table is not None:
        tables["on_device"] = on_device_table
    ratios = benchmark_ratios(bench, params.n)
    return record.Result(
        experiment=NAME,
        params=params.to_dict(),
        tables=tables,
        headline=headline,
        models={"yamnet_personal_trainable.tflite": flatbuffer} if flatbuffer else {},
        data=data.data,
        stand_in_data=data.stand_in,
        wall_time_s=wall_time_s,
        notes={
            "source": data.source,
            "weights": pre.source,
            "local_classes": data.local_categories,
            "global_classes": data.global_categories,
            "benchmark_time_ratios": ratios,
            "timing_effects": timing.to_dict("records"),
            **data.notes,
            "tflite_max_loss_difference": float(on_device_table.abs_difference.max())
            if on_device_table is not None
            else None,
        },
    )


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


def run(params: Params, log=print) -> record.Result:
    """All stages in order, as the notebook runs them."""
    start = time.perf_counter()
    data = load_data(params, log)
    pre = pretrained(params, data, log)
    alpha_runs = gdm_sweep(params, data, pre, log)
    lf_runs = lf_sweep(params, data, pre, log)
    cached, lf = fmc(params, data, pre, lf_runs, log)
    bench = benchmark(params, data, pre, log)
    table, flatbuffer = on_device(params, data, pre, log)
    return conclude(
        params, data, pre, alpha_runs, lf_runs, cached, lf, bench, table, flatbuffer, time.perf_counter() - start
    )


# ---------------------------------------------------------------------------------------------
# Figures


def _curves(history: pd.DataFrame, runs: list[str], time_rows: pd.DataFrame, title: str):
    import matplotlib.pyplot as plt
    import seaborn as sns
    from matplotlib.ticker import MaxNLocator

    h = history[history.run.isin(runs)]
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    for ax, col, name in (
        (axes[0], "global_auc", "(a) global AUC (held-out classes)"),
        (axes[1], "local_auc", "(b) local AUC (user's validation clips)"),
    ):
        sns.lineplot(data=h, x="epoch", y=col, hue="run", hue_order=runs, marker="o", ax=ax, legend=ax is axes[1])
        ax.set(title=name, ylabel="AUC")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[1].legend(title="", fontsize=8, frameon=False)
    sns.barplot(data=time_rows, y="label", x="seconds", ax=axes[2], color="#5b8db8")
    axes[2].set(
        title="(c) training time on this CPU (estimated)", xlabel="seconds (epochs x steps x steady step)", ylabel=""
    )
    fig.suptitle(title)
    sns.despine(fig)
    fig.tight_layout()
    return fig


def plot_overall(params: Params, runs: pd.DataFrame, history: pd.DataFrame, bench: pd.DataFrame):
    """Fig. 5.4: GDM(alpha), + LF(n), + FMC: AUC per epoch and training time."""
    a, n = params.alpha, params.n
    names = [f"GDM({a:g})", f"GDM({a:g}) + LF({n})", f"GDM({a:g}) + LF({n}) + FMC"]
    t = bench.set_index("configuration")["training_time_seconds (epochs x steps x step)"]
    times = pd.DataFrame(
        {
            "label": names,
            "seconds": [t["full training"], t[f"LF({n}) with forward pass"], t[f"LF({n}) from the cache (FMC)"]],
        }
    )
    return _curves(history, names, times, "Personalising YAMNet (cf. thesis Fig. 5.4)")


def plot_sweep(runs: pd.DataFrame, history: pd.DataFrame, names: list[str], title: str):
    """Fig. 5.6 / 5.8: one curve per alpha or per n, and each run's training time."""
    r = runs.set_index("run").loc[names]
    times = pd.DataFrame({"label": names, "seconds": r.training_time_seconds.to_numpy()})
    return _curves(history, names, times, title)


def main(argv=None) -> None:
    """`python -m ondevice.papers.moil.experiments.moil_audio [scale]`: the step-time benchmark alone, its
    ratios printed (one run; timings vary from run to run, so the notebook keeps them out of its
    displayed tables)."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    params = Params.for_scale(args[0] if args else "default")
    data = load_data(params)
    bench = benchmark(params, data, pretrained(params, data))
    for name, ratio in benchmark_ratios(bench, params.n).items():
        print(f"{name}: {ratio:.2f}x")


if __name__ == "__main__":
    main()


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


def units_table(model=None) -> pd.DataFrame:
    """YAMNet's layers as MoIL counts them: LF(n) trains the last n rows."""
    model = model or yamnet.build()
    rows = []
    found = yamnet.units(model)
    for i, unit in enumerate(found, 1):
        rows.append(
            {
                "layer": i,
                "LF(n) trains it for n >=": len(found) - i + 1,
                "Keras layers": ", ".join(l.name for l in unit),
                "parameters": int(sum(np.prod(w.shape) for l in unit for w in l.weights)),
                "output": "x".join(str(d) for d in unit[-1].output_shape[1:]),
            }
        )
    return pd.DataFrame(rows)


def plot_benchmark(bench: pd.DataFrame):
    """Steady-state step time of each configuration, with its ratio to full training."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    fig, ax = plt.subplots(figsize=(7, 3))
    ms = bench.assign(ms=1000 * bench.steady_step_seconds)
    sns.barplot(data=ms, y="configuration", x="ms", color="#5b8db8", ax=ax)
    for i, (t, ratio) in enumerate(zip(ms.ms, ms["time ratio to full training"])):
        ax.text(t, i, f"  {1 / ratio:.1f}x faster" if ratio < 1 else "  baseline", va="center", fontsize=8)
    ax.set(
        xlabel="ms per training step (median after warm-up, this CPU, one run)",
        ylabel="",
        title="Step time: full training, layer freezing, feature-map caching",
    )
    sns.despine(fig)
    fig.tight_layout()
    return fig
