"""Image classification sets stored as one folder of JPEG files per class (ImageNet's
`train/<wnid>/*.JPEG`, the bird species' `train/<SPECIES>/*.jpg`), streamed with tf.data: a set
is a list of files, and images are read, decoded and resized only when a batch of them is asked
for, so sets far larger than memory (ImageNet: 1.28 million images) train in constant memory.

`ImageFiles` behaves like the (n, size, size, 3) float32 array the in-memory sets are: `len`,
`shape`, and indexing by a slice or an index array decode just those images (in parallel). A
subset (`take`, e.g. GDM's per-class sample) or a union (`concat`) is a new file list, nothing
is decoded. Pixels are in [0, 1], resized (bilinear) to size x size; the model maps them to
[-1, 1], which is MobileNetV2's preprocessing (x / 127.5 - 1 on 8-bit values).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tensorflow as tf

from .manifests import DataError

SUFFIXES = (".jpg", ".jpeg")


def scan(root: str | Path, split: str, layout: str) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(paths, labels, class names) of `<root>/<split>/<class>/*.jpg|jpeg`: classes are the
    sorted folder names (for ImageNet: the order of Keras's class index), labels 0..k-1, files
    sorted within a class. `layout` describes the expected layout for the error messages."""
    folder = Path(root) / split
    if not folder.is_dir():
        raise DataError(f"no folder {folder}: expected {layout}")
    classes = sorted(d.name for d in folder.iterdir() if d.is_dir())
    if not classes:
        raise DataError(f"{folder} holds no class folders: expected {layout}")
    paths, labels = [], []
    for label, name in enumerate(classes):
        with os.scandir(folder / name) as entries:
            files = sorted(e.path for e in entries if e.is_file() and e.name.lower().endswith(SUFFIXES))
        if not files:
            raise DataError(f"{folder / name} holds no .jpg/.jpeg files: expected {layout}")
        paths.extend(files)
        labels.extend([label] * len(files))
    return np.array(paths), np.array(labels, np.int32), classes


def _decode(path, size: int):
    image = tf.io.decode_image(tf.io.read_file(path), channels=3, expand_animations=False)
    image = tf.image.resize(tf.image.convert_image_dtype(image, tf.float32), (size, size), method="bilinear")
    return tf.clip_by_value(image, 0.0, 1.0)


@dataclass(frozen=True, eq=False)
class ImageFiles:
    """Images as files, decoded on demand to (size, size, 3) float32 in [0, 1]."""

    paths: np.ndarray
    size: int

    dtype = np.dtype(np.float32)
    ndim = 4

    def __len__(self) -> int:
        return len(self.paths)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (len(self.paths), self.size, self.size, 3)

    def __getitem__(self, index) -> np.ndarray:
        """The decoded images at a slice or an index array (an int gives one image)."""
        if isinstance(index, (int, np.integer)):
            return self[np.array([index])][0]
        return next(
            self.stream(np.arange(len(self))[index], max(1, len(self.paths[index]))),
            np.zeros((0, self.size, self.size, 3), np.float32),
        )

    def take(self, index) -> "ImageFiles":
        """A subset, as a file list (nothing decoded)."""
        return ImageFiles(self.paths[index], self.size)

    @staticmethod
    def concat(parts: list["ImageFiles"]) -> "ImageFiles":
        sizes = {p.size for p in parts}
        if len(sizes) != 1:
            raise ValueError(f"image sets of different sizes cannot be joined: {sorted(sizes)}")
        return ImageFiles(np.concatenate([p.paths for p in parts]), sizes.pop())

    def stream(self, order: np.ndarray, batch_size: int):
        """Batches (numpy) of the images in `order`, decoded in parallel and prefetched by tf.data."""
        size = self.size
        data = (
            tf.data.Dataset.from_tensor_slices(self.paths[np.asarray(order, np.int64)].astype(str))
            .map(lambda p: _decode(p, size), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
            .batch(batch_size)
            .prefetch(tf.data.AUTOTUNE)
        )
        for batch in data.as_numpy_iterator():
            yield batch

    def fingerprint(self) -> str:
        """sha256 of the file names (the last two path parts: class folder and file) and sizes,
        in order: identifies the list without reading every image."""
        digest = hashlib.sha256()
        for p in self.paths:
            path = Path(p)
            digest.update(f"{path.parent.name}/{path.name}\0{path.stat().st_size}\n".encode())
        return digest.hexdigest()
