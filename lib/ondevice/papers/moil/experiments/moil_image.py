"""MoIL image classification (thesis Sec. 5.2-5.3, rows M1-M3 and the image half of M6):
incremental training of MobileNetV2 with global dataset mixing (GDM), layer freezing (LF) and
feature-map caching (FMC), against training from scratch on global + local data.

Default scale, real data: Fashion-MNIST is the global set (stand-in for ImageNet) and
scikit-learn's bundled handwritten digits the user's local set (stand-in for the 225 bird
species). Both are resized once to the preset's input size; greyscale enters MobileNetV2 as
three equal channels (`models/mobilenet_v2.py`). The model outputs logits over the union of the
10 global and 10 local classes (local class d is output 10 + d). Global accuracy = top-1 on
Fashion-MNIST test images, local accuracy = top-1 on held-out digits, both after every epoch.

Paper scale, real data (manual downloads): ImageNet is the global set and the 225 bird species
the local one, output over the union (1,000 + 225), streamed from their JPEG files with tf.data
(`data/image_folders.py`: decoded and resized per batch, GDM samples file names); the pre-trained
model is Keras's MobileNetV2 with its ImageNet weights (`models/mobilenet_v2.load_imagenet`).

Runs, each starting from the global model pre-trained on the global set (cached):
`baseline` (from scratch on all global + local training data), GDM(alpha) for every alpha of the
sweep (0 = local data only), GDM(alpha)+LF(n) for every n of the sweep, and
GDM(alpha)+LF(n)+FMC (the head trained from cached feature maps), for `seeds` incremental seeds.
Training time = steady-state seconds per step (median after warm-up) x steps of the
configuration, plus the caching pass for FMC; every configuration is timed in the same run,
and reported as ratios. Timing numbers differ from run to run: they live in tables whose timing
columns say "time"/"seconds", in figures and in log lines, never in displayed tables.

The notebook calls one stage per section: `load_data`, `pretrain`, `gdm_sweep`, `lf_sweep`,
`fmc`, `timing`, `cache_size`, `on_device`, `conclude`; `run` calls them all.
"""

from __future__ import annotations

import hashlib
import inspect
import itertools
import logging
import math
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import tensorflow as tf

from ondevice import streams
from ondevice.data import digits, fashion_mnist, image_folders, manifests
from ondevice.device import tflite
from ondevice.models import mobilenet_v2
from ondevice.papers.moil.techniques import feature_cache, gdm, layer_freezing
from ondevice.params import Params as BaseParams
from ondevice.report import claims, provenance, record
from ondevice.tasks.classification import ClassificationTask
from ondevice.training import model_cache
from ondevice.training.trainer import StepTimer, Trainer, seed_everything

NAME = "moil_image"
GLOBAL_CLASSES, LOCAL_CLASSES = 10, 10


class _NoRetracingWarning(logging.Filter):
    """TensorFlow warns when one Python function is traced often; here each model (pre-trained,
    baseline, every LF(n), every frozen part) gets its own compiled forward pass by design."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "triggered tf.function retracing" not in record.getMessage()


logging.getLogger("tensorflow").addFilter(_NoRetracingWarning())
STAND_IN = (
    "MoIL's ImageNet (global) and 225 bird species (local) image sets: Fashion-MNIST stands in for "
    "ImageNet and scikit-learn's handwritten digits for the bird species"
)
SOURCE = "Fan, MoIL (MASc thesis, U. Toronto, 2022)"

# The thesis's numbers. Accuracy losses are read as percentage points (the thesis does not say).
PAPER = claims.Paper(
    citation=f"{SOURCE}, Sec. 1, 5.2, 5.3 and footnote 5 (MobileNetV2, ImageNet + 225 bird species)",
    numbers=(
        claims.PaperNumber("global accuracy loss vs baseline, GDM", 0.215, "Sec. 5.2: GDM(1%) loses 21.5%"),
        claims.PaperNumber("global accuracy loss vs baseline, GDM+LF", 0.066, "Sec. 5.2: GDM(1%)+LF(1) loses 6.6%"),
        claims.PaperNumber("global accuracy change, FMC vs LF", 0.0, "Sec. 4.3 and 5.2: the accuracy stays the same"),
        claims.PaperNumber("local accuracy change, FMC vs LF", 0.0, "Sec. 4.3 and 5.2: the accuracy stays the same"),
        claims.PaperNumber("local accuracy, GDM+LF", 0.966, "Sec. 5.3.2: 96.6% with LF(1)"),
        claims.PaperNumber(
            "global accuracy drop, GDM(0)", 0.69, "Sec. 1: 69% drop after 20 epochs of local-only training"
        ),
        claims.PaperNumber("cached feature bytes per sample", 5120, "footnote 5: 1,280 float32"),
        claims.PaperNumber("raw / cached bytes per sample", 117.6, "footnote 5: 602,112 B raw vs 5,120 B"),
        claims.PaperNumber("raw / cached bytes per sample at 224x224x3", 117.6, "footnote 5"),
    ),
    effects=(),
)
# Speed-ups (time ratios) of Sec. 5.2 and 5.3.2: 3.2 years -> 371.2 h -> 12.3 h -> 48 min; LF(3) 29.2 h.
PAPER_TIME = {
    "GDM vs baseline": 74.0,
    "GDM+LF vs GDM": 30.1,
    "GDM+LF+FMC vs GDM+LF": 15.7,
    "GDM+LF+FMC vs baseline": 3.2 * 365.25 * 24 / 0.8,
    "LF(1) vs LF(3)": 29.2 / 12.3,
}


@dataclass(frozen=True)
class Params(BaseParams):
    image_size: int = 32  # square input of MobileNetV2 (the thesis: 224)
    width: float = 0.35  # MobileNetV2's width multiplier alpha (the thesis: 1.0)
    global_train: int = 12000  # Fashion-MNIST training images, equally many per class
    global_test: int = 2000  # Fashion-MNIST test images scored (global accuracy)
    local_samples: int = 0  # digits used (0: all 1,797)
    local_test_fraction: float = 0.3  # of each digit class, held out for local accuracy
    pretrain_epochs: int = 8  # the global model on the global set (cached)
    baseline_epochs: int = 8  # the baseline from scratch on global + local (cached)
    epochs: int = 8  # incremental training of every other configuration
    batch_size: int = 32
    learning_rate: float = 0.001  # Adam, pre-training and incremental (the thesis gives none)
    bn_momentum: float = (
        0.9  # batch normalisation's moving averages (Keras's MobileNetV2: 0.999, see models/mobilenet_v2.py)
    )
    alpha: float = 0.05  # GDM's ratio in the combined runs
    alphas: tuple[float, ...] = (0.0, 0.01, 0.05, 0.2)
    n: int = 1  # LF(n) of the combined runs (the thesis: LF(1))
    ns: tuple[int, ...] = (1, 2, 3, 6)
    seeds: int = 2  # incremental seeds: seed, seed + 1, ...
    warmup_steps: int = 5  # excluded from the steady-state step time
    timing_steps: int = 30  # steps timed for the baseline (the thesis's 30)
    tflite_check_steps: int = 3
    bootstrap: int = 2000
    thesis_size_check: bool = True  # also measure M6 at the thesis's 224x224x3 MobileNetV2 1.0
    global_data: str = "fashion_mnist"  # fashion_mnist | imagenet (paper scale, manual download)
    imagenet_root: str = ""  # <root>/train/<wnid>/*.JPEG and <root>/val/<wnid>/*.JPEG
    birds_root: str = ""  # <root>/train/<SPECIES>/*.jpg and <root>/test/<SPECIES>/*.jpg
    imagenet_weights: str = ""  # Keras's MobileNetV2 ImageNet .h5 (empty: data_manifests/mobilenet_v2_imagenet.yaml)

    PRESETS = {
        "smoke": dict(
            bn_momentum=0.5,
            global_train=600,
            global_test=300,
            local_samples=400,
            pretrain_epochs=2,
            baseline_epochs=1,
            epochs=2,
            alpha=0.2,
            alphas=(0.0, 0.2),
            ns=(1, 2),
            seeds=1,
            warmup_steps=2,
            timing_steps=5,
            tflite_check_steps=2,
            bootstrap=300,
        ),
        "default": dict(),
        "paper": dict(
            bn_momentum=0.999,
            image_size=224,
            width=1.0,
            global_data="imagenet",
            global_train=0,
            global_test=0,
            pretrain_epochs=0,
            baseline_epochs=150,
            epochs=60,
            alpha=0.01,
            alphas=(0.0, 0.001, 0.01, 0.1),
            ns=(1, 2, 3),
            seeds=3,
        ),
    }

    @property
    def seed_list(self) -> list[int]:
        return list(range(self.seed, self.seed + self.seeds))

    def check(self) -> None:
        self.require(self.image_size >= 32, "image_size", "must be at least 32 (MobileNetV2's five stride-2 stages)")
        self.require(self.width > 0, "width", "must be positive")
        self.require(
            self.global_data in ("fashion_mnist", "imagenet"), "global_data", "must be 'fashion_mnist' or 'imagenet'"
        )
        if self.global_data == "fashion_mnist":
            self.require(10 <= self.global_train <= 60000, "global_train", "must lie in [10, 60000]")
            self.require(10 <= self.global_test <= 10000, "global_test", "must lie in [10, 10000]")
            self.require(self.pretrain_epochs >= 1, "pretrain_epochs", "must be >= 1")
            self.require(
                self.local_samples == 0 or 40 <= self.local_samples <= 1797,
                "local_samples",
                "must be 0 (all) or in [40, 1797]",
            )
        else:  # ImageNet (0 = every image) and its weights, trained on for pretrain_epochs more epochs
            for name in ("global_train", "global_test", "local_samples", "pretrain_epochs"):
                self.require(getattr(self, name) >= 0, name, "must be >= 0 (0: all images / no further pre-training)")
        self.require(0 < self.local_test_fraction < 1, "local_test_fraction", "must lie in (0, 1)")
        self.require(self.baseline_epochs >= 1 and self.epochs >= 1, "epochs", "and baseline_epochs must be >= 1")
        self.require(self.batch_size >= 1, "batch_size", "must be >= 1")
        self.require(self.learning_rate > 0, "learning_rate", "must be positive")
        self.require(0 < self.bn_momentum < 1, "bn_momentum", "must lie in (0, 1)")
        self.require(0 <= self.alpha <= 1, "alpha", "must lie in [0, 1]")
        self.require(
            all(0 <= a <= 1 for a in self.alphas) and 0.0 in self.alphas and self.alpha in self.alphas,
            "alphas",
            "must lie in [0, 1] and include 0 and alpha",
        )
        self.require(1 <= self.n <= 19, "n", "must lie in [1, 19] (MobileNetV2 has 20 units; n = 20 freezes nothing)")
        self.require(
            all(1 <= n <= 19 for n in self.ns) and self.n in self.ns and len(self.ns) >= 2,
            "ns",
            "must hold at least two values in [1, 19], including n",
        )
        self.require(self.seeds >= 1, "seeds", "must be >= 1")
        self.require(
            self.warmup_steps >= 0 and self.timing_steps >= 2, "timing_steps", "must be >= 2 (warmup_steps >= 0)"
        )
        self.require(self.tflite_check_steps >= 0, "tflite_check_steps", "must be >= 0 (0 = skip)")
        self.require(self.bootstrap >= 100, "bootstrap", "must be at least 100 resamples")


# ----------------------------------------------------------------------------------- data


@dataclass
class Data:
    """Images (n, size, size, channels) float32 in [0, 1], in memory or (paper scale) as
    `image_folders.ImageFiles` streamed from JPEG files; labels in the union label space."""

    global_train: tuple[np.ndarray, np.ndarray]
    global_test: tuple[np.ndarray, np.ndarray]
    local_train: tuple[np.ndarray, np.ndarray]
    local_test: tuple[np.ndarray, np.ndarray]
    sources: list[dict]
    native_bytes: int  # bytes of one global image as distributed (28x28 uint8; decoded 8-bit RGB for JPEGs)
    global_classes: int = GLOBAL_CLASSES
    local_classes: int = LOCAL_CLASSES
    set_sources: tuple[str, ...] = (
        "Fashion-MNIST train",
        "Fashion-MNIST test",
        "digits (scikit-learn, bundled)",
        "digits (scikit-learn, bundled)",
    )
    stand_in: str | None = STAND_IN
    init_weights: str | None = None  # weights the pre-trained model starts from (paper: Keras's ImageNet .h5)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return self.global_train[0].shape[1:]

    @property
    def classes(self) -> int:
        return self.global_classes + self.local_classes

    def table(self) -> pd.DataFrame:
        rows = []
        for name, (x, y), source in zip(
            ("global train", "global test", "local train", "local test"),
            (self.global_train, self.global_test, self.local_train, self.local_test),
            self.set_sources,
        ):
            rows.append(
                {
                    "set": name,
                    "source": source,
                    "images": len(x),
                    "classes": len(np.unique(y)),
                    "labels": f"{int(y.min())}-{int(y.max())}",
                    "input": "x".join(map(str, x.shape[1:])),
                }
            )
        return pd.DataFrame(rows)


def _per_class(labels: np.ndarray, count: int, rng) -> np.ndarray:
    """Sorted indices of `count` samples, as equally many per class as possible."""
    classes = np.unique(labels)
    take = [count // len(classes) + (i < count % len(classes)) for i in range(len(classes))]
    return np.sort(
        np.concatenate([rng.choice(np.flatnonzero(labels == c), k, replace=False) for c, k in zip(classes, take)])
    )


def _resize(images: np.ndarray, size: int, scale: float) -> np.ndarray:
    """(n, h, w) -> (n, size, size, 1) float32 in [0, 1], bilinear, in chunks (memory)."""
    out = np.empty((len(images), size, size, 1), np.float32)
    for i in range(0, len(images), 4096):
        chunk = images[i : i + 4096, ..., None].astype(np.float32) / scale
        out[i : i + 4096] = tf.image.resize(chunk, (size, size), method="bilinear").numpy()
    return np.clip(out, 0.0, 1.0)


IMAGENET_LAYOUT = (
    "imagenet_root: the ILSVRC2012 classification set (image-net.org, login and terms), laid out as "
    "<imagenet_root>/train/<wnid>/*.JPEG (1,000 folders n01440764 ... n15075141, 1,281,167 images) and "
    "<imagenet_root>/val/<wnid>/*.JPEG (the 50,000 validation images sorted into the same 1,000 folders)"
)
BIRDS_LAYOUT = (
    "birds_root: Kaggle's '225 bird species' release (gpiosenka), laid out as "
    "<birds_root>/train/<SPECIES NAME>/*.jpg and <birds_root>/test/<SPECIES NAME>/*.jpg (225 folders each)"
)


def _imagenet_weights(params: Params) -> Path:
    if params.imagenet_weights:
        path = Path(params.imagenet_weights)
        if not path.is_file():
            raise manifests.DataError(
                f"imagenet_weights: no file at {path} (Keras's MobileNetV2 {params.width:g}/"
                f"{params.image_size} ImageNet weights, see data_manifests/mobilenet_v2_imagenet.yaml)"
            )
        return path
    return manifests.resolve("mobilenet_v2_imagenet", "weights")


def _folders(root: str, splits: tuple[str, str], layout: str):
    """Both splits of a one-folder-per-class set; they must have the same classes."""
    (x, y, classes), (tx, ty, test_classes) = (image_folders.scan(root, split, layout) for split in splits)
    if classes != test_classes:
        differ = sorted(set(classes) ^ set(test_classes))
        raise manifests.DataError(
            f"{root}/{splits[0]} and {root}/{splits[1]} have different class folders "
            f"({len(differ)} differ, e.g. {differ[:3]}): expected {layout}"
        )
    return (x, y), (tx, ty), classes


def _paper_data(params: Params, log) -> Data:
    """ImageNet (global, labels 0-999 in sorted-wnid order, as Keras's ImageNet classifier) and the
    bird species (local, labels 1000 + species index) as file lists streamed from their JPEGs;
    `global_train`, `global_test` and `local_samples` > 0 sample that many images, equally many per
    class (split seed); 0 takes every image. The bird set's own test split is the local test set."""
    if not params.imagenet_root or not params.birds_root:
        raise manifests.DataError(
            "paper scale needs two manual downloads (neither can be fetched automatically):\n"
            f"  {IMAGENET_LAYOUT};\n  {BIRDS_LAYOUT}.\n"
            "They are declared in data_manifests/imagenet.yaml and birds225.yaml; the ImageNet weights of MobileNetV2 "
            "1.0/224 in data_manifests/mobilenet_v2_imagenet.yaml (or pass imagenet_weights).\n"
            f"Given: imagenet_root={params.imagenet_root!r}, birds_root={params.birds_root!r}."
        )
    (gx, gy), (tx, ty), wnids = _folders(params.imagenet_root, ("train", "val"), IMAGENET_LAYOUT)
    (lx, ly), (sx, sy), species = _folders(params.birds_root, ("train", "test"), BIRDS_LAYOUT)
    weights = _imagenet_weights(params)
    rng = streams.rng(params.seed, "moil_image/split")

    def sample(count, x, y):  # a per-class sample of the file names (count = 0: all of them)
        keep = _per_class(y, count, rng) if count else slice(None)
        return x[keep], y[keep]

    (gx, gy), (tx, ty), (lx, ly) = (
        sample(params.global_train, gx, gy),
        sample(params.global_test, tx, ty),
        sample(params.local_samples, lx, ly),
    )
    files = lambda x: image_folders.ImageFiles(x, params.image_size)
    g = len(wnids)
    parts = {
        "global_train": (files(gx), gy),
        "global_test": (files(tx), ty),
        "local_train": (files(lx), ly + g),
        "local_test": (files(sx), sy + g),
    }

    def summary(name, root, keys):
        digest = hashlib.sha256("".join(parts[k][0].fingerprint() for k in keys).encode()).hexdigest()
        return {**manifests.load(name).summary(), "read_from": str(root), "file_list_sha256": digest}

    data = Data(
        **parts,
        native_bytes=params.image_size**2 * 3,
        global_classes=g,
        local_classes=len(species),
        sources=[
            summary("imagenet", params.imagenet_root, ("global_train", "global_test")),
            summary("birds225", params.birds_root, ("local_train", "local_test")),
            {
                **manifests.load("mobilenet_v2_imagenet").summary(),
                "read_from": str(weights),
                "sha256": manifests.sha256_of(weights),
            },
        ],
        set_sources=("ImageNet train", "ImageNet validation", "bird species train", "bird species test"),
        stand_in=None,
        init_weights=str(weights),
    )
    log(
        f"global: {len(gx)} training / {len(tx)} validation ImageNet images of {g} classes; local: "
        f"{len(lx)} / {len(sx)} "
        f"bird images of {len(species)} species; streamed from JPEG files at {params.image_size}x{params.image_size}x3"
    )
    return data


def load_data(params: Params, log=print) -> Data:
    """Fashion-MNIST (global) and digits (local), sampled per class with the split seed, resized
    once to the model's input size; local labels are shifted to 10-19."""
    if params.global_data == "imagenet":
        return _paper_data(params, log)
    fashion, manifest = fashion_mnist.load()
    rng = streams.rng(params.seed, "moil_image/split")
    (gx, gy), (tx, ty) = fashion["train"], fashion["test"]
    train_idx, test_idx = _per_class(gy, params.global_train, rng), _per_class(ty, params.global_test, rng)
    dx, dy = digits.load()
    if params.local_samples:
        keep = _per_class(dy, params.local_samples, rng)
        dx, dy = dx[keep], dy[keep]
    test_mask = np.zeros(len(dy), bool)
    for c in np.unique(dy):
        members = rng.permutation(np.flatnonzero(dy == c))
        test_mask[members[: max(1, round(params.local_test_fraction * len(members)))]] = True
    size = params.image_size
    data = Data(
        global_train=(_resize(gx[train_idx], size, 255.0), gy[train_idx].astype(np.int32)),
        global_test=(_resize(tx[test_idx], size, 255.0), ty[test_idx].astype(np.int32)),
        local_train=(_resize(dx[~test_mask], size, 1.0), (dy[~test_mask] + GLOBAL_CLASSES).astype(np.int32)),
        local_test=(_resize(dx[test_mask], size, 1.0), (dy[test_mask] + GLOBAL_CLASSES).astype(np.int32)),
        sources=[manifest.summary(), digits.summary(STAND_IN)],
        native_bytes=int(gx[0].nbytes),
    )
    log(
        f"global: {len(data.global_train[0])} training / {len(data.global_test[0])} test Fashion-MNIST images; "
        f"local: {len(data.local_train[0])} / {len(data.local_test[0])} digits; input {size}x{size}x1"
    )
    return data


# ----------------------------------------------------------------------------------- models


def task(input_shape, classes: int) -> ClassificationTask:
    return ClassificationTask(tuple(input_shape), classes)


def build(params: Params, data: Data):
    return mobilenet_v2.build(params.image_size, data.input_shape[-1], data.classes, params.width, params.bn_momentum)


def _chunks(x, batch: int):
    """x in order, `batch` samples at a time (streamed image files: decoded ahead by tf.data)."""
    if isinstance(x, image_folders.ImageFiles):
        return x.stream(np.arange(len(x)), batch)
    return (x[i : i + batch] for i in range(0, len(x), batch))


def _concat(parts: list):
    if isinstance(parts[0], image_folders.ImageFiles):
        return image_folders.ImageFiles.concat(parts)
    return np.concatenate(parts)


def predictor(model, batch: int = 256):
    """Logits of `model` in inference mode, one compiled call per batch."""
    fn = tf.function(
        lambda x: model(x, training=False), input_signature=[tf.TensorSpec([None, *model.input_shape[1:]], tf.float32)]
    )
    return lambda x: np.concatenate([fn(np.asarray(chunk, np.float32)).numpy() for chunk in _chunks(x, batch)])


def correct(predict, part: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Per test sample: is the top-1 class (over all 20) the label?"""
    return predict(part[0]).argmax(axis=1) == part[1]


def _epoch(trainer: Trainer, data, batch_size: int, rng) -> float:
    """One epoch's mean loss. Arrays (and the cache's batch source, data None) go through
    `Trainer.fit`; streamed image files are decoded batch by batch in the order the task would
    draw (one permutation from the same rng), so they never sit in memory all at once."""
    if data is None or not isinstance(data[0], image_folders.ImageFiles):
        (h,) = trainer.fit(data, 1, batch_size, rng)
        return h["loss"]
    x, y = data
    order = rng.permutation(len(x))
    losses = [
        trainer.step(images, y[order[i * batch_size : (i + 1) * batch_size]])
        for i, images in enumerate(x.stream(order, batch_size))
    ]
    return float(np.mean(losses)) if losses else float("nan")


def _fit_tracked(trainer: Trainer, data, epochs: int, batch_size: int, rng, evaluate, log, label: str) -> list[dict]:
    """Epoch 0 (before training) and every epoch: loss and global/local accuracy."""
    scores = evaluate()
    rows = [{"epoch": 0, "loss": float("nan"), **{k: float(v.mean()) for k, v in scores.items()}}]
    for epoch in range(1, epochs + 1):
        loss = _epoch(trainer, data, batch_size, rng)
        scores = evaluate()
        rows.append({"epoch": epoch, "loss": loss, **{k: float(v.mean()) for k, v in scores.items()}})
        log(
            f"{label} epoch {epoch}/{epochs}: loss {loss:.3f}, global accuracy {rows[-1]['global_accuracy']:.3f}, "
            f"local accuracy {rows[-1]['local_accuracy']:.3f}"
        )
    return rows


@dataclass
class Pretrained:
    weights: list[np.ndarray]
    baseline: list[np.ndarray]
    entries: dict[str, model_cache.Entry]
    correct: dict[str, dict[str, np.ndarray]]  # "pre-trained" / "baseline" -> test set -> per sample

    def history(self) -> pd.DataFrame:
        return pd.concat([pd.DataFrame(e.info["history"]).assign(run=name) for name, e in self.entries.items()])

    def cache(self) -> pd.DataFrame:
        return pd.DataFrame(
            [
                {"model": name, "from_cache": e.hit, "key": e.key[:20], "train_seconds": e.info["train_seconds"]}
                for name, e in self.entries.items()
            ]
        )


TRAINING_CODE = ("ondevice.models.mobilenet_v2", "ondevice.training.trainer", "ondevice.tasks.classification")


def _cached_model(
    name: str, params: Params, data: Data, parts: list, epochs: int, log, init: str | None = None
) -> model_cache.Entry:
    """A model trained on the concatenation of `parts` (cached by the model cache), from scratch
    or from Keras's ImageNet weights at `init` (new outputs freshly initialised)."""
    x = _concat([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])

    def train():
        seed_everything(streams.tf_seed(params.seed, f"moil_image/{name}"))
        model = build(params, data)
        if init:
            mobilenet_v2.load_imagenet(model, init, data.global_classes)
        trainer = Trainer(model, task(data.input_shape, data.classes), params.learning_rate)
        predict = predictor(model)
        evaluate = lambda: {
            "global_accuracy": correct(predict, data.global_test),
            "local_accuracy": correct(predict, data.local_test),
        }
        history = _fit_tracked(
            trainer, (x, y), epochs, params.batch_size, streams.rng(params.seed, f"batches/{name}"), evaluate, log, name
        )
        return model.get_weights(), {"history": history}

    fields = {
        k: getattr(params, k) for k in ("image_size", "width", "bn_momentum", "batch_size", "learning_rate", "seed")
    }
    fields["epochs"] = epochs
    data_ids = [
        x.fingerprint() if isinstance(x, image_folders.ImageFiles) else hashlib.sha256(x.tobytes()).hexdigest(),
        hashlib.sha256(y.tobytes()).hexdigest(),
    ] + ([manifests.sha256_of(Path(init))] if init else [])
    code = model_cache.code_digest(
        [f for m in TRAINING_CODE for f in provenance.module_files(m)],
        extra=inspect.getsource(_cached_model) + inspect.getsource(_fit_tracked),
    )
    return model_cache.load_or_train(f"moil_image_{name}", fields, data_ids, code, train, log)


def pretrain(params: Params, data: Data, log=print) -> Pretrained:
    """The global model (global data only: the cloud's pre-training) and the baseline (from
    scratch on global + local data), each trained once per machine through the model cache."""
    entries = {
        "pre-trained": _cached_model(
            "pretrained", params, data, [data.global_train], params.pretrain_epochs, log, init=data.init_weights
        ),
        "baseline": _cached_model(
            "baseline", params, data, [data.global_train, data.local_train], params.baseline_epochs, log
        ),
    }
    model = build(params, data)
    predict = predictor(model)
    scores = {}
    for name, entry in entries.items():
        model.set_weights(entry.weights)
        scores[name] = {"global": correct(predict, data.global_test), "local": correct(predict, data.local_test)}
        log(
            f"{name}: global accuracy {scores[name]['global'].mean():.3f}, local accuracy "
            f"{scores[name]['local'].mean():.3f}"
        )
    return Pretrained(entries["pre-trained"].weights, entries["baseline"].weights, entries, scores)


# ----------------------------------------------------------------------------------- runs


@dataclass
class Run:
    label: str
    alpha: float
    n: int | None
    fmc: bool
    seed: int
    history: list[dict]
    correct: dict[str, np.ndarray]
    samples: int
    steps: int
    steady_step_seconds: float
    cache_seconds: float = 0.0
    final_weights: list[np.ndarray] = field(default_factory=list, repr=False)
    step_seconds: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)  # after warm-up

    def row(self) -> dict:
        return {
            "run": self.label,
            "alpha": self.alpha,
            "n": self.n or 0,
            "fmc": self.fmc,
            "seed": self.seed,
            "training_samples": self.samples,
            "steps": self.steps,
            "global_accuracy": float(self.correct["global"].mean()),
            "local_accuracy": float(self.correct["local"].mean()),
            "steady_step_seconds": self.steady_step_seconds,
            "cache_build_seconds": self.cache_seconds,
            "training_time_seconds": self.steady_step_seconds * self.steps + self.cache_seconds,
        }


def label(alpha: float, n: int | None = None, fmc: bool = False) -> str:
    return f"GDM({alpha:g})" + (f"+LF({n})" if n else "") + ("+FMC" if fmc else "")


class Personalizer:
    """Incremental training from the pre-trained weights; one compiled trainer per LF(n) (None =
    all layers) reused over alphas and seeds, each run with a fresh optimizer state."""

    def __init__(self, params: Params, data: Data, pre: Pretrained):
        self.params, self.data, self.pre = params, data, pre
        self.task = task(data.input_shape, data.classes)
        self._trainers: dict = {}

    def _trainer(self, n):
        if n not in self._trainers:
            model = build(self.params, self.data)
            hooks = [layer_freezing.LayerFreezing(n, mobilenet_v2.units)] if n else []
            trainer = Trainer(model, self.task, self.params.learning_rate, hooks=hooks)
            self._trainers[n] = (trainer, predictor(model))
        return self._trainers[n]

    def mixed(self, alpha: float, seed: int):
        """D_M for this seed; the same for every run with this alpha (so LF, FMC share it). Streamed
        sets are mixed as file lists: the per-class sample picks file names, no image is read."""
        rng = streams.rng(seed, f"moil_image/gdm/{alpha}")
        (xl, yl), (xg, yg) = self.data.local_train, self.data.global_train
        if isinstance(xg, image_folders.ImageFiles):
            idx = gdm.sample_global(yg, alpha, rng)
            return image_folders.ImageFiles.concat([xl, xg.take(idx)]), np.concatenate([yl, yg[idx]])
        return gdm.mix(self.data.local_train, self.data.global_train, alpha, rng)

    def run(self, alpha: float, n: int | None, seed: int, log=print) -> Run:
        p = self.params
        trainer, predict = self._trainer(n)
        trainer.reset(self.pre.weights)
        trainer.timer = StepTimer(p.warmup_steps)
        x, y = self.mixed(alpha, seed)
        evaluate = lambda: {
            "global_accuracy": correct(predict, self.data.global_test),
            "local_accuracy": correct(predict, self.data.local_test),
        }
        history = _fit_tracked(
            trainer,
            (x, y),
            p.epochs,
            p.batch_size,
            streams.rng(seed, "moil_image/batches"),
            evaluate,
            log,
            f"seed {seed} {label(alpha, n)}",
        )
        final = {"global": correct(predict, self.data.global_test), "local": correct(predict, self.data.local_test)}
        return Run(
            label(alpha, n),
            alpha,
            n,
            False,
            seed,
            history,
            final,
            len(x),
            p.epochs * math.ceil(len(x) / p.batch_size),
            trainer.timer.steady(),
            final_weights=trainer.model.get_weights(),
            step_seconds=np.array(trainer.timer.durations[p.warmup_steps :]),
        )

    def run_fmc(self, alpha: float, n: int, seed: int, folder: Path, log=print) -> Run:
        """Algorithm 2: cache the frozen part's feature maps of D_M (and of both test sets, for
        evaluation), then train the head from the cache with the same batches as LF(n)."""
        p = self.params
        model = build(p, self.data)
        model.set_weights(self.pre.weights)
        layer_freezing.freeze(model, n, mobilenet_v2.units)
        frozen, head = layer_freezing.split(model, n, mobilenet_v2.units)
        x, y = self.mixed(alpha, seed)
        timer = StepTimer(warmup=1)  # the first batch traces the compiled forward pass
        features = feature_cache.build(frozen, x, folder / f"train-{seed}.npy", p.batch_size, timer)
        cache_seconds = float(np.median(timer.durations[1:] or timer.durations)) * len(timer.durations)
        tests = {
            k: (feature_cache.build(frozen, part[0], folder / f"{k}-{seed}.npy", 256), part[1])
            for k, part in (("global", self.data.global_test), ("local", self.data.local_test))
        }
        trainer = Trainer(
            head,
            task(features.shape[1:], self.data.classes),
            p.learning_rate,
            hooks=[feature_cache.CachedFeatures(features, y)],
            warmup_steps=p.warmup_steps,
        )
        predict = predictor(head)
        evaluate = lambda: {f"{k}_accuracy": correct(predict, part) for k, part in tests.items()}
        history = _fit_tracked(
            trainer,
            None,
            p.epochs,
            p.batch_size,
            streams.rng(seed, "moil_image/batches"),
            evaluate,
            log,
            f"seed {seed} {label(alpha, n, True)}",
        )
        final = {k: correct(predict, part) for k, part in tests.items()}
        return Run(
            label(alpha, n, True),
            alpha,
            n,
            True,
            seed,
            history,
            final,
            len(x),
            p.epochs * math.ceil(len(x) / p.batch_size),
            trainer.timer.steady(),
            cache_seconds,
            final_weights=model.get_weights(),
            step_seconds=np.array(trainer.timer.durations[p.warmup_steps :]),
        )


def gdm_sweep(params: Params, personal: Personalizer, log=print) -> list[Run]:
    """GDM(alpha) for every alpha of the sweep, all layers training (Fig. 5.5)."""
    return [personal.run(a, None, s, log) for s in params.seed_list for a in params.alphas]


def lf_sweep(params: Params, personal: Personalizer, log=print) -> list[Run]:
    """GDM(alpha)+LF(n) for every n of the sweep (Fig. 5.7)."""
    return [personal.run(params.alpha, n, s, log) for s in params.seed_list for n in params.ns]


def fmc(params: Params, personal: Personalizer, log=print) -> list[Run]:
    """GDM(alpha)+LF(n)+FMC, the cache in a temporary folder removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="moil-image-fmc-") as folder:
        return [personal.run_fmc(params.alpha, params.n, s, Path(folder), log) for s in params.seed_list]


def fmc_equality(runs: list[Run], params: Params) -> pd.DataFrame:
    """Per seed: FMC against LF(n) without the cache (same seed, data and batches): the largest
    weight difference after training and whether every test prediction agrees."""
    by = {(r.label, r.seed): r for r in runs}
    rows = []
    for s in params.seed_list:
        cached, plain = by[(label(params.alpha, params.n, True), s)], by[(label(params.alpha, params.n), s)]
        diff = max(float(np.abs(a - b).max()) for a, b in zip(cached.final_weights, plain.final_weights))
        rows.append(
            {
                "seed": s,
                "max |weight difference|": diff,
                "global predictions equal": bool(np.array_equal(cached.correct["global"], plain.correct["global"])),
                "local predictions equal": bool(np.array_equal(cached.correct["local"], plain.correct["local"])),
                "global accuracy, FMC": cached.correct["global"].mean(),
                "global accuracy, LF": plain.correct["global"].mean(),
                "local accuracy, FMC": cached.correct["local"].mean(),
                "local accuracy, LF": plain.correct["local"].mean(),
            }
        )
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------- timing and size


def baseline_step_seconds(params: Params, data: Data, personal: Personalizer) -> np.ndarray:
    """The baseline's steady step time, measured in this run like every other configuration:
    warm-up + `timing_steps` steps of full training on global + local batches (the model cache
    may have trained the baseline on another day)."""
    trainer, _ = personal._trainer(None)
    trainer.reset(personal.pre.weights)
    trainer.timer = StepTimer(params.warmup_steps)
    x = _concat([data.global_train[0], data.local_train[0]])
    y = np.concatenate([data.global_train[1], data.local_train[1]])
    batches = personal.task.batches((x, y), params.batch_size, streams.rng(params.seed, "moil_image/timing"))
    for _, (bx, by) in zip(range(params.warmup_steps + params.timing_steps), batches):
        trainer.step(bx, by)
    return np.array(trainer.timer.durations[params.warmup_steps :])


def timing(params: Params, data: Data, personal: Personalizer, runs: list[Run], log=print) -> pd.DataFrame:
    """Training time per configuration (median over seeds): steady step seconds x steps (+ the
    caching pass for FMC), and speed-ups over the baseline; every number from this run. The
    baseline's step durations are kept in `table.attrs["baseline_step_seconds"]`."""
    table = (
        pd.DataFrame([r.row() for r in runs])
        .groupby("run", sort=False)
        .agg(
            alpha=("alpha", "first"),
            n=("n", "first"),
            fmc=("fmc", "first"),
            steps=("steps", "first"),
            steady_step_seconds=("steady_step_seconds", "median"),
            cache_build_seconds=("cache_build_seconds", "median"),
            training_time_seconds=("training_time_seconds", "median"),
        )
        .reset_index()
    )
    samples = len(data.global_train[0]) + len(data.local_train[0])
    steps = params.baseline_epochs * math.ceil(samples / params.batch_size)
    durations = baseline_step_seconds(params, data, personal)
    step = float(np.median(durations))
    base = pd.DataFrame(
        [
            {
                "run": "baseline",
                "alpha": 1.0,
                "n": 0,
                "fmc": False,
                "steps": steps,
                "steady_step_seconds": step,
                "cache_build_seconds": 0.0,
                "training_time_seconds": step * steps,
            }
        ]
    )
    table = pd.concat([base, table], ignore_index=True)
    table["time_ratio_baseline_over_this"] = table.training_time_seconds.iloc[0] / table.training_time_seconds
    table.attrs["baseline_step_seconds"] = durations
    for r in table.itertuples():
        log(f"{r.run}: {r.steps} steps, training time ({r.training_time_seconds:.1f}s)")
    return table


def speedups(params: Params, time_table: pd.DataFrame) -> pd.DataFrame:
    """The thesis's speed-ups (ratios of training times) beside ours."""
    t = time_table.set_index("run").training_time_seconds
    g, lf, fc = label(params.alpha), label(params.alpha, params.n), label(params.alpha, params.n, True)
    small = min(params.ns)
    large = 3 if 3 in params.ns and small < 3 else max(params.ns)  # the thesis's pair where the sweep has it
    ours = {
        "GDM vs baseline": t["baseline"] / t[g],
        "GDM+LF vs GDM": t[g] / t[lf],
        "GDM+LF+FMC vs GDM+LF": t[lf] / t[fc],
        "GDM+LF+FMC vs baseline": t["baseline"] / t[fc],
        "LF(1) vs LF(3)": t[label(params.alpha, large)] / t[label(params.alpha, small)],
    }
    names = {"LF(1) vs LF(3)": f"LF({small}) vs LF({large}) (thesis: LF(1) vs LF(3))"}
    return pd.DataFrame(
        [{"speed-up": names.get(k, k), "paper time ratio": PAPER_TIME[k], "our time ratio": v} for k, v in ours.items()]
    )


def benchmark(params: Params, runs: list[Run]) -> pd.DataFrame:
    """Steady step time of the same configuration three ways (median over seeds): full
    training, head-only with the forward pass (LF), head-only from the cache (FMC)."""
    rows = pd.DataFrame([r.row() for r in runs]).groupby("run").steady_step_seconds.median()
    ways = (
        ("full training (all layers)", label(params.alpha)),
        (f"head only, forward pass through the frozen part (LF({params.n}))", label(params.alpha, params.n)),
        (f"head only, from cached feature maps (LF({params.n})+FMC)", label(params.alpha, params.n, True)),
    )
    table = pd.DataFrame([{"training": w, "steady step seconds": rows[r]} for w, r in ways])
    table["time ratio full / this"] = table["steady step seconds"].iloc[0] / table["steady step seconds"]
    return table


def timing_effects(params: Params, runs: list[Run], time_table: pd.DataFrame) -> pd.DataFrame:
    """Speed-up claims: ratio of training times (steps x median step time, + the caching pass),
    with a bootstrap interval over the measured steps of each configuration (all seeds pooled).
    A ratio above 1 means faster, so the verdict is "holds" when the interval lies above 1."""
    steps = dict(zip(time_table.run, time_table.steps))
    durations = {"baseline": time_table.attrs["baseline_step_seconds"]}
    cache = {"baseline": 0.0}
    for r in runs:
        durations[r.label] = np.concatenate([durations.get(r.label, np.zeros(0)), r.step_seconds])
        cache[r.label] = float(time_table.set_index("run").cache_build_seconds[r.label])
    g, lf, fc = label(params.alpha), label(params.alpha, params.n), label(params.alpha, params.n, True)
    rng = streams.rng(params.seed, "moil_image/bootstrap/time")

    def total(name, sample):
        return steps[name] * np.median(sample, axis=-1) + cache[name]

    rows = []
    for claim, slow, fast, paper in (
        (f"GDM trains faster than the baseline ({g})", "baseline", g, PAPER_TIME["GDM vs baseline"]),
        (f"LF trains faster than GDM alone ({lf})", g, lf, PAPER_TIME["GDM+LF vs GDM"]),
        (f"FMC trains faster than LF without the cache ({fc})", lf, fc, PAPER_TIME["GDM+LF+FMC vs GDM+LF"]),
    ):
        a, b = durations[slow], durations[fast]
        ratio = float(total(slow, a) / total(fast, b))
        boot = total(slow, a[rng.integers(0, len(a), (params.bootstrap, len(a)))]) / total(
            fast, b[rng.integers(0, len(b), (params.bootstrap, len(b)))]
        )
        low, high = (float(q) for q in np.quantile(boot, [0.025, 0.975]))
        rows.append(
            {
                "effect": claim,
                "paper time ratio": paper,
                "our time ratio": ratio,
                "ci low (time ratio)": low,
                "ci high (time ratio)": high,
                "steps timed": f"{len(a)} / {len(b)}",
                "verdict (time)": "holds" if low > 1 else "does not hold" if high < 1 else "within noise",
            }
        )
    return pd.DataFrame(rows)


def cache_size(params: Params, data: Data, pre: Pretrained, log=print) -> pd.DataFrame:
    """M6: bytes per sample of the cached feature map of LF(n) vs the raw input, measured by
    building the cache for a few real images; the raw input counted as the thesis does (3
    channels x 4 bytes per value, footnote 5) and as stored (8-bit greyscale 28x28). With
    `thesis_size_check`, also at the thesis's 224x224x3 MobileNetV2 1.0."""
    sample = data.global_test[0][:8]
    rows = []
    with tempfile.TemporaryDirectory(prefix="moil-image-m6-") as folder:
        configs = [(params.image_size, params.width, data.input_shape[-1])]
        if params.thesis_size_check and configs[0] != (224, 1.0, 3):
            configs.append((224, 1.0, 3))
        for size, width, channels in configs:
            model = mobilenet_v2.build(size, channels, data.classes, width)
            if size == params.image_size and width == params.width:
                model.set_weights(pre.weights)
            frozen, _ = layer_freezing.split(model, params.n, mobilenet_v2.units)
            x = tf.image.resize(sample, (size, size)).numpy()
            x = np.repeat(x, channels, axis=-1) if x.shape[-1] != channels else x
            features = feature_cache.build(frozen, x, Path(folder) / f"m6-{size}.npy", 8)
            report = feature_cache.size_report(features, size * size * 3 * 4)
            rows.append(
                {
                    "input": f"{size}x{size}x{channels}",
                    "MobileNetV2 width": width,
                    "LF(n)": params.n,
                    "cached feature map": report["feature_shape"],
                    "cached bytes per sample": report["cached_bytes_per_sample"],
                    "raw bytes per sample (3 channels x 4 bytes, as the thesis)": report["raw_bytes_per_sample"],
                    "raw / cached": report["raw / cached"],
                    "raw bytes per sample (as stored, 8-bit)": data.native_bytes
                    if size == params.image_size
                    else size * size * 3,
                    "stored / cached": (data.native_bytes if size == params.image_size else size * size * 3)
                    / report["cached_bytes_per_sample"],
                }
            )
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------- on device


def on_device(params: Params, personal: Personalizer, log=print):
    """The personal model, GDM(alpha)+LF(n), exported as a trainable TFLite file (LF's frozen
    variables excluded from `train`); its first steps run in TensorFlow and through the
    interpreter from the pre-trained weights on the same batches. Its own random stream and
    copies of the model: no result changes."""
    if not params.tflite_check_steps:
        return None, None
    model = build(params, personal.data)
    model.set_weights(personal.pre.weights)
    x, y = personal.mixed(params.alpha, params.seed)
    batches = list(
        itertools.islice(
            personal.task.batches((x, y), params.batch_size, streams.rng(params.seed, "diagnostics/tflite")),
            params.tflite_check_steps,
        )
    )
    hooks = [layer_freezing.LayerFreezing(params.n, mobilenet_v2.units)]
    check = tflite.compare_training(model, personal.task, params.learning_rate, batches, hooks=hooks)
    table = pd.DataFrame(
        {
            "step": range(1, len(check["tflite"]) + 1),
            "loss_tensorflow": check["tensorflow"],
            "loss_tflite": check["tflite"],
        }
    )
    table["abs_difference"] = (table.loss_tflite - table.loss_tensorflow).abs()
    out_diff = float(np.abs(check["outputs_tflite"] - check["outputs_tensorflow"]).max())
    table.attrs["max_output_difference"] = out_diff
    log(
        f"on-device check: {len(table)} LF({params.n}) steps through the TFLite interpreter, max |loss difference| "
        f"{table.abs_difference.max():.2e}, max |logit difference| after them {out_diff:.2e}"
    )
    return table, check["flatbuffer"]


# ----------------------------------------------------------------------------------- conclusions


def history_table(pre: Pretrained, runs: list[Run]) -> pd.DataFrame:
    """Loss and accuracies per epoch of every run (epoch 0: the pre-trained model)."""
    rows = [
        {"run": r.label, "alpha": r.alpha, "n": r.n or 0, "fmc": r.fmc, "seed": r.seed, **h}
        for r in runs
        for h in r.history
    ]
    base = pd.DataFrame(pre.entries["baseline"].info["history"]).assign(
        run="baseline", alpha=1.0, n=0, fmc=False, seed=-1
    )
    return pd.concat([base, pd.DataFrame(rows)], ignore_index=True)[
        ["run", "alpha", "n", "fmc", "seed", "epoch", "loss", "global_accuracy", "local_accuracy"]
    ]


def _bootstrap(better: np.ndarray, worse: np.ndarray, rng, n_boot: int, level: float = 0.95) -> dict:
    """Difference of accuracies (better - worse), mean over seeds, with a paired bootstrap over
    test samples (the same resampled samples for both runs and every seed)."""
    b, w = better.astype(float), worse.astype(float)  # (seeds, samples)
    change = float((b.mean(axis=1) - w.mean(axis=1)).mean())
    idx = rng.integers(0, b.shape[1], size=(n_boot, b.shape[1]))
    boot = (b[:, idx].mean(axis=2) - w[:, idx].mean(axis=2)).mean(axis=0)
    low, high = (float(q) for q in np.quantile(boot, [(1 - level) / 2, (1 + level) / 2]))
    verdict = "holds" if low > 0 else "does not hold" if high < 0 else "within noise"
    return {"our change": change, "ci low": low, "ci high": high, "verdict": verdict, "level": level}


def effects(params: Params, pre: Pretrained, runs: list[Run]) -> pd.DataFrame:
    """Each directional claim as a difference of accuracies (better minus worse run, positive =
    as the thesis says), paired bootstrap over test samples and seeds, three-way verdict."""
    by = {}
    for r in runs:
        by.setdefault(r.label, []).append(r)
    seeds = len(params.seed_list)

    def acc(name, part):
        if name in pre.correct:
            return np.stack([pre.correct[name][part]] * seeds)
        return np.stack([r.correct[part] for r in sorted(by[name], key=lambda r: r.seed)])

    g, lf, fc, g0 = label(params.alpha), label(params.alpha, params.n), label(params.alpha, params.n, True), label(0.0)
    lo, hi = label(params.alpha, min(params.ns)), label(params.alpha, max(params.ns))
    claims_ = [  # (claim, part, better, worse, paper change)
        (f"GDM(0) forgets the global classes ({g0} below the pre-trained model)", "global", "pre-trained", g0, 0.69),
        (f"mixing global data forgets less ({g} above {g0})", "global", g, g0, float("nan")),
        (f"LF preserves global accuracy ({lf} above {g})", "global", lf, g, 0.215 - 0.066),
        (f"more frozen layers keep more global accuracy ({lo} above {hi})", "global", lo, hi, float("nan")),
        (f"FMC changes no global accuracy ({fc} vs {lf}; the thesis: none)", "global", fc, lf, 0.0),
        (f"FMC changes no local accuracy ({fc} vs {lf}; the thesis: none)", "local", fc, lf, 0.0),
    ]
    rng = streams.rng(params.seed, "moil_image/bootstrap")
    rows = []
    for claim, part, better, worse, paper in claims_:
        b, w = acc(better, part), acc(worse, part)
        rows.append(
            {
                "effect": claim,
                "test set": part,
                "paper change": paper,
                **_bootstrap(b, w, rng, params.bootstrap),
                "test samples": b.shape[1],
                "seeds": b.shape[0],
            }
        )
    return pd.DataFrame(rows)


def verdict_text(effects_table: pd.DataFrame, stand_in: str | None = STAND_IN) -> str:
    """A Markdown bullet per effect; changes are differences of accuracy in percentage points."""
    lines = []
    for _, r in effects_table.iterrows():
        paper = (
            "the thesis gives no number"
            if math.isnan(r["paper change"])
            else f"the thesis: {100 * r['paper change']:+.1f} points"
        )
        lines.append(
            f"- **{r['effect']}**: {r['verdict']}: {100 * r['our change']:+.1f} points ({r['level']:.0%} interval "
            f"{100 * r['ci low']:+.1f} to {100 * r['ci high']:+.1f}, {r['test samples']} {r['test set']} test "
            f"samples x {r['seeds']} seed(s); {paper})."
        )
    lines.append("- For the two FMC rows, *within noise* is what the thesis claims (no change).")
    if stand_in:
        lines.append(
            f"- Our data is **stand-in data** for {stand_in}. Absolute accuracies are not the thesis's; "
            "the direction and size of each effect are what we compare."
        )
    return "\n".join(lines)


def conclude(
    params: Params,
    data: Data,
    pre: Pretrained,
    runs: list[Run],
    time_table: pd.DataFrame,
    size_table: pd.DataFrame,
    on_device_table,
    flatbuffer,
    wall_time_s: float,
) -> record.Result:
    """Tables, headline numbers over seeds, the thesis's numbers beside ours, effects."""
    final = pd.DataFrame([r.row() for r in runs])
    g, lf, fc, g0 = label(params.alpha), label(params.alpha, params.n), label(params.alpha, params.n, True), label(0.0)
    per = lambda run, col: final[final.run == run].sort_values("seed")[col].to_numpy()
    base_global = float(pre.correct["baseline"]["global"].mean())
    pre_global = float(pre.correct["pre-trained"]["global"].mean())
    per_seed = {
        "global accuracy loss vs baseline, GDM": base_global - per(g, "global_accuracy"),
        "global accuracy loss vs baseline, GDM+LF": base_global - per(lf, "global_accuracy"),
        "local accuracy, GDM+LF": per(lf, "local_accuracy"),
        "global accuracy drop, GDM(0)": pre_global - per(g0, "global_accuracy"),
    }
    headline = {q: claims.headline(list(map(float, v))) for q, v in per_seed.items()}
    ours = {q: h["value"] for q, h in headline.items()}
    ours["global accuracy change, FMC vs LF"] = float((per(fc, "global_accuracy") - per(lf, "global_accuracy")).mean())
    ours["local accuracy change, FMC vs LF"] = float((per(fc, "local_accuracy") - per(lf, "local_accuracy")).mean())
    ours["cached feature bytes per sample"] = float(size_table["cached bytes per sample"].iloc[0])
    ours["raw / cached bytes per sample"] = float(size_table["raw / cached"].iloc[0])
    at_224 = size_table[size_table.input == "224x224x3"]
    ours["raw / cached bytes per sample at 224x224x3"] = (
        float(at_224["raw / cached"].iloc[0]) if len(at_224) else float("nan")
    )
    numbers = claims.paper_vs_ours(PAPER, ours)
    if not len(at_224):
        numbers = numbers[numbers.quantity != "raw / cached bytes per sample at 224x224x3"]
    numbers["ours (setting)"] = numbers.quantity.map(_our_setting(params))
    tables = {
        "data": data.table(),
        "pretraining": pre.history(),
        "pretraining_cache": pre.cache(),
        "history": history_table(pre, runs),
        "final": final,
        "timing": time_table,
        "speedups_time": speedups(params, time_table),
        "benchmark_time": benchmark(params, runs),
        "timing_effects": timing_effects(params, runs, time_table),
        "fmc_vs_lf": fmc_equality(runs, params),
        "cache_size": size_table,
        "headline": claims.headline_table(headline),
        "paper_vs_ours": numbers,
        "effects": effects(params, pre, runs),
    }
    if on_device_table is not None:
        tables["on_device"] = on_device_table
    return record.Result(
        experiment=NAME,
        params=params.to_dict(),
        tables=tables,
        headline=headline,
        models={f"moil_mobilenet_v2_lf{params.n}_trainable.tflite": flatbuffer} if flatbuffer else {},
        data=data.sources,
        stand_in_data=data.stand_in,
        wall_time_s=wall_time_s,
        notes={
            "seeds": params.seed_list,
            "pretrained_global_accuracy": pre_global,
            "baseline_global_accuracy": base_global,
            "baseline_local_accuracy": float(pre.correct["baseline"]["local"].mean()),
            "models_from_cache": {k: e.hit for k, e in pre.entries.items()},
            "speedups (volatile)": dict(
                zip(tables["speedups_time"]["speed-up"], tables["speedups_time"]["our time ratio"])
            ),
            "tflite_max_output_difference": on_device_table.attrs["max_output_difference"]
            if on_device_table is not None
            else None,
        },
    )


def _our_setting(params: Params) -> dict:
    g, lf = label(params.alpha), label(params.alpha, params.n)
    return {
        "global accuracy loss vs baseline, GDM": g,
        "global accuracy loss vs baseline, GDM+LF": lf,
        "global accuracy change, FMC vs LF": f"{lf}+FMC vs {lf}",
        "local accuracy change, FMC vs LF": f"{lf}+FMC vs {lf}",
        "local accuracy, GDM+LF": lf,
        "global accuracy drop, GDM(0)": f"pre-trained - GDM(0) after {params.epochs} epochs",
        "cached feature bytes per sample": f"LF({params.n}) at "
        "{params.image_size}x{params.image_size}, width {params.width}",
        "raw / cached bytes per sample": f"{params.image_size}x{params.image_size}x3 float32 input",
        "raw / cached bytes per sample at 224x224x3": "MobileNetV2 1.0, 224x224x3, LF(1)"
        if params.n == 1
        else f"LF({params.n})",
    }


def run(params: Params, log=print) -> record.Result:
    """All stages in order, as the notebook runs them."""
    start = time.perf_counter()
    data = load_data(params, log)
    pre = pretrain(params, data, log)
    personal = Personalizer(params, data, pre)
    runs = gdm_sweep(params, personal, log) + lf_sweep(params, personal, log) + fmc(params, personal, log)
    time_table = timing(params, data, personal, runs, log)
    size_table = cache_size(params, data, pre, log)
    table, flatbuffer = on_device(params, personal, log)
    return conclude(params, data, pre, runs, time_table, size_table, table, flatbuffer, time.perf_counter() - start)


# ----------------------------------------------------------------------------------- plots


def _curves(ax, history: pd.DataFrame, runs: list[str], metric: str, title: str):
    import seaborn as sns

    h = history[history.run.isin(runs)]
    sns.lineplot(data=h, x="epoch", y=metric, hue="run", hue_order=runs, marker="o", errorbar=None, ax=ax)
    ax.set(title=title, ylabel=metric.replace("_", " "), ylim=(0, 1))
    ax.legend(title="", fontsize=8, frameon=False)


def _times(ax, time_table: pd.DataFrame, runs: list[str]):
    t = time_table.set_index("run").loc[runs]
    ax.barh(range(len(t)), t.training_time_seconds, color="#d1495b")
    ax.set_yticks(range(len(t)), t.index)
    ax.set_xscale("log")
    ax.invert_yaxis()
    ax.set(title="total training time (this machine)", xlabel="seconds (log)")


def plot_figure(history: pd.DataFrame, time_table: pd.DataFrame, runs: list[str], title: str):
    """Global accuracy and local accuracy per epoch, and total training time (as Fig. 5.3/5.5/5.7)."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    fig, axes = plt.subplots(1, 3, figsize=(15, 3.8))
    _curves(axes[0], history, runs, "global_accuracy", "(a) global accuracy (Fashion-MNIST)")
    _curves(axes[1], history, runs, "local_accuracy", "(b) local accuracy (digits)")
    _times(axes[2], time_table, [r for r in runs if r in set(time_table.run)])
    fig.suptitle(title)
    sns.despine(fig)
    fig.tight_layout()
    return fig


def plot_benchmark(bench: pd.DataFrame):
    """Steady step time of full training, head with forward pass, head from cache, with ratios."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 2.6))
    ax.barh(range(len(bench)), bench["steady step seconds"] * 1000, color=["#8c8c8c", "#edae49", "#d1495b"])
    ax.set_yticks(range(len(bench)), bench.training)
    ax.invert_yaxis()
    for i, (ms, ratio) in enumerate(zip(bench["steady step seconds"] * 1000, bench["time ratio full / this"])):
        ax.annotate(
            f"{ms:.1f} ms, {ratio:.1f}x faster than full" if i else f"{ms:.1f} ms",
            (ms, i),
            xytext=(4, 0),
            textcoords="offset points",
            va="center",
            fontsize=8,
        )
    ax.set(
        xlabel="steady-state milliseconds per step (median after warm-up)",
        title="Benchmark: one training step, same run",
    )
    ax.set_xlim(0, ax.get_xlim()[1] * 1.6)
    fig.tight_layout()
    return fig


def plot_speedups(table: pd.DataFrame, timing_effects_table: pd.DataFrame):
    """The thesis's speed-ups (black marks) beside ours (bars, with the bootstrap interval and
    the verdict where the speed-up is a judged claim), log scale."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 3))
    y = np.arange(len(table))
    ax.barh(y, table["our time ratio"], color="#d1495b", label="ours (this machine)")
    judged = timing_effects_table.reset_index(drop=True)  # the first rows of `table`, in the same order
    ax.errorbar(
        judged["our time ratio"],
        y[: len(judged)],
        xerr=[
            judged["our time ratio"] - judged["ci low (time ratio)"],
            judged["ci high (time ratio)"] - judged["our time ratio"],
        ],
        fmt="none",
        color="0.2",
        capsize=3,
    )
    for i, verdict in enumerate(judged["verdict (time)"]):
        ax.annotate(
            verdict, (table["our time ratio"].iloc[i], i), xytext=(6, -9), textcoords="offset points", fontsize=8
        )
    ax.scatter(table["paper time ratio"], y, color="black", marker="|", s=250, label="thesis (Galaxy S21)", zorder=3)
    ax.set_yticks(y, table["speed-up"])
    ax.invert_yaxis()
    ax.axvline(1, color="0.6", lw=1, ls="--")
    ax.set(
        xscale="log", xlabel="speed-up (ratio of training times, log)", title="Speed-ups, thesis vs ours, with verdicts"
    )
    ax.legend(frameon=False, fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig
