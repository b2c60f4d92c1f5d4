"""MoIL's image data: Fashion-MNIST (global) and scikit-learn's digits (local) in memory, or at the
paper scale ImageNet and the 225 bird species streamed from their JPEG files, in one label space
(the global classes, then the local ones); and MobileNetV2 over them: build, predict, train an epoch."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import tensorflow as tf

from ondevice import streams
from ondevice.data import digits, fashion_mnist, image_folders, manifests
from ondevice.models import mobilenet_v2
from ondevice.papers.moil.protocol import EVALUATION_BATCH, MoilParams, fit_epoch, forward
from ondevice.tasks.classification import ClassificationTask
from ondevice.training.trainer import Trainer

GLOBAL_CLASSES, LOCAL_CLASSES = 10, 10
STAND_IN = (
    "MoIL's ImageNet (global) and 225 bird species (local) image sets: Fashion-MNIST stands in for "
    "ImageNet and scikit-learn's handwritten digits for the bird species"
)


@dataclass(frozen=True)
class ImageParams(MoilParams):
    """The image sets and MobileNetV2: what `load_data` reads, `build` builds and `image_model` pre-trains."""

    image_size: int = 32  # square input of MobileNetV2 (the thesis: 224)
    width: float = 0.35  # MobileNetV2's width multiplier alpha (the thesis: 1.0)
    bn_momentum: float = 0.9  # batch normalisation's moving averages (Keras's: 0.999, see models/mobilenet_v2.py)
    global_train: int = 12000  # Fashion-MNIST training images, equally many per class
    global_test: int = 2000  # Fashion-MNIST test images scored (global accuracy)
    local_samples: int = 0  # digits used (0: all 1,797)
    local_test_fraction: float = 0.3  # of each digit class, held out for local accuracy
    pretrain_epochs: int = 8  # the global model on the global set (cached)
    baseline_epochs: int = 60  # at most; the baseline (from scratch on global + local, cached) trains to a plateau
    baseline_holdout: float = 0.1  # of the baseline's training images, held out to judge the plateau
    baseline_patience: int = 3  # epochs without a 1% fall of the held-out loss before the baseline stops
    thesis_size_check: bool = True  # also measure M6 at the thesis's 224x224x3 MobileNetV2 1.0
    global_data: str = "fashion_mnist"  # fashion_mnist | imagenet (paper scale, manual download)
    imagenet_root: str = ""  # <root>/train/<wnid>/*.JPEG and <root>/val/<wnid>/*.JPEG
    birds_root: str = ""  # <root>/train/<SPECIES>/*.jpg and <root>/test/<SPECIES>/*.jpg
    imagenet_weights: str = ""  # Keras's MobileNetV2 ImageNet .h5 (empty: data_manifests/mobilenet_v2_imagenet.yaml)

    UNITS = 20  # MobileNetV2's weighted architecture rows (`mobilenet_v2.units`)

    def check(self) -> None:
        super().check()
        self.require(self.image_size >= 32, "image_size", "must be at least 32 (MobileNetV2's five stride-2 stages)")
        self.require(self.width > 0, "width", "must be positive")
        self.require(0 < self.bn_momentum < 1, "bn_momentum", "must lie in (0, 1)")
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
        self.require(self.baseline_epochs >= 1, "baseline_epochs", "must be >= 1")
        self.require(0 < self.baseline_holdout < 0.5, "baseline_holdout", "must lie in (0, 0.5)")
        self.require(self.baseline_patience >= 1, "baseline_patience", "must be >= 1")


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


def _imagenet_weights(params: ImageParams) -> Path:
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


def _paper_data(params: ImageParams, log) -> Data:
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


def load_data(params: ImageParams, log=print) -> Data:
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


def task(input_shape, classes: int) -> ClassificationTask:
    return ClassificationTask(tuple(input_shape), classes)


def build(params: ImageParams, data: Data):
    return mobilenet_v2.build(params.image_size, data.input_shape[-1], data.classes, params.width, params.bn_momentum)


def chunks(x, batch: int):
    """x in order, `batch` samples at a time (streamed image files: decoded ahead by tf.data)."""
    if isinstance(x, image_folders.ImageFiles):
        return x.stream(np.arange(len(x)), batch)
    return (x[i : i + batch] for i in range(0, len(x), batch))


def concat(parts: list):
    if isinstance(parts[0], image_folders.ImageFiles):
        return image_folders.ImageFiles.concat(parts)
    return np.concatenate(parts)


def take(x, index: np.ndarray):
    """The samples of x at `index` (streamed image files: their file names, nothing decoded)."""
    return x.take(index) if isinstance(x, image_folders.ImageFiles) else x[index]


def predictor(model):
    """Logits of `model` in inference mode over any number of images, one compiled call per batch."""
    predict = forward(model)
    return lambda x: np.concatenate([predict(chunk) for chunk in chunks(x, EVALUATION_BATCH)])


def correct(predict, part: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Per test sample: is the top-1 class (over all of them) the label?"""
    return predict(part[0]).argmax(axis=1) == part[1]


def losses(predict, part: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Per sample: the cross-entropy of its label under the softmax of the logits."""
    logits = predict(part[0]).astype(np.float64)
    top = logits.max(axis=1)
    log_sum = top + np.log(np.exp(logits - top[:, None]).sum(axis=1))
    return log_sum - logits[np.arange(len(part[1])), part[1]]


def stream_epoch(trainer: Trainer, data, batch_size: int, rng) -> float:
    """One epoch's mean loss. Arrays (and the cache's batch source, data None) go through
    `Trainer.fit`; streamed image files are decoded batch by batch in the order the task would
    draw (one permutation from the same rng), so they never sit in memory all at once."""
    if data is None or not isinstance(data[0], image_folders.ImageFiles):
        return fit_epoch(trainer, data, batch_size, rng)
    x, y = data
    order = rng.permutation(len(x))
    losses = [
        trainer.step(images, y[order[i * batch_size : (i + 1) * batch_size]])
        for i, images in enumerate(x.stream(order, batch_size))
    ]
    return float(np.mean(losses)) if losses else float("nan")
