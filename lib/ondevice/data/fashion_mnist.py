"""Fashion-MNIST (data_manifests/fashion_mnist.yaml): the global data set of MoIL's image
experiment at smoke and default scale. The four idx files come from the Debian package
`dataset-fashion-mnist` or the official release and are verified by sha256."""

from __future__ import annotations

import numpy as np

from . import manifests

CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")


def read_idx(path) -> np.ndarray:
    """An uncompressed idx file (MNIST's format: zero bytes, type 0x08 = uint8, rank, big-endian
    dimensions, data) as a uint8 array."""
    raw = np.fromfile(path, dtype=np.uint8)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise ValueError(f"{path} is not an idx file of unsigned bytes")
    rank = int(raw[3])
    dims = tuple(int(d) for d in np.frombuffer(raw[4 : 4 + 4 * rank].tobytes(), dtype=">u4"))
    data = raw[4 + 4 * rank :]
    if data.size != int(np.prod(dims)):
        raise ValueError(f"{path}: header says {dims} ({int(np.prod(dims))} bytes) but holds {data.size}")
    return data.reshape(dims)


def load() -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], manifests.Manifest]:
    """{"train": (images, labels), "test": (images, labels)}: uint8 images (n, 28, 28), int labels
    0-9 (`CLASSES`), and the manifest (for run.json)."""
    manifest = manifests.load("fashion_mnist")
    out = {}
    for part, prefix in (("train", "train"), ("test", "test")):
        images = read_idx(manifests.resolve(manifest, f"{prefix}_images"))
        labels = read_idx(manifests.resolve(manifest, f"{prefix}_labels")).astype(np.int64)
        if len(images) != len(labels):
            raise ValueError(f"fashion_mnist {part}: {len(images)} images but {len(labels)} labels")
        out[part] = (images, labels)
    return out, manifest
