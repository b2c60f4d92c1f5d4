"""Image augmentation as AutLearn uses it on device (Sec. 3.4): flip, rotation, scale, crop,
translation and Gaussian noise; its MobileNet experiment used crop, rotation and translation
(Sec. 5), our default. Generated images keep the shape, dtype and label of their original; at most
`cap` x the original count are generated (the paper: "at most 1x").

The geometric operations are tf_keras preprocessing layers drawing a transform per image; each
layer's seed is drawn from the numpy Generator passed in and the layers are built afresh per call,
so one Generator state gives one output. Crop is a zoom *in* (a centred crop of 1 - `crop` to 1 of
each side, resized back to the input size); with translation it lands anywhere in the image.
Scale zooms in or out. Gaussian noise is drawn from the Generator itself (tf_keras's
GaussianNoise layer ignores its seed across constructions). Borders are filled with the nearest
pixel, which suits any background colour.
"""

from __future__ import annotations

import numpy as np
import tf_keras as keras

OPERATIONS = ("flip", "rotation", "scale", "crop", "translation", "noise")
PAPER_MOBILENET = ("crop", "rotation", "translation")


def _layer(op: str, strength: float, seed: int):
    L = keras.layers
    if op == "flip":
        return L.RandomFlip("horizontal", seed=seed)
    if op == "rotation":  # factor: a fraction of a full turn
        return L.RandomRotation(strength, fill_mode="nearest", seed=seed)
    if op == "scale":
        return L.RandomZoom((-strength, strength), fill_mode="nearest", seed=seed)
    if op == "crop":
        return L.RandomZoom((-strength, 0.0), fill_mode="nearest", seed=seed)
    if op == "translation":
        return L.RandomTranslation(strength, strength, fill_mode="nearest", seed=seed)
    raise ValueError(f"unknown image augmentation {op!r}; known: {OPERATIONS}")


# How strong each operation is by default: rotation 0.05 of a turn (18 degrees), zoom and crop 10%
# of each side, translation 10% of height and width, noise 0.05 x the images' value range.
STRENGTH = {"flip": 1.0, "rotation": 0.05, "scale": 0.1, "crop": 0.1, "translation": 0.1, "noise": 0.05}


class ImageAugmenter:
    """Applies `operations` in the order given, each once per generated image."""

    def __init__(self, operations: tuple[str, ...] = PAPER_MOBILENET, strength: dict | None = None):
        unknown = sorted(set(operations) - set(OPERATIONS))
        if unknown or not operations:
            raise ValueError(
                f"image augmentation operations must be a non-empty subset of {OPERATIONS}, got {operations!r}"
            )
        self.operations = tuple(operations)
        self.strength = {**STRENGTH, **(strength or {})}
        for op in self.operations:
            if not 0 <= self.strength[op] <= 1:
                raise ValueError(f"image augmentation strength of {op!r} must be in [0, 1], got {self.strength[op]!r}")

    def transform(self, images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """One random transform of every image; (n, H, W) or (n, H, W, C) in, the same shape out."""
        x = np.asarray(images)
        if x.ndim not in (3, 4):
            raise ValueError(f"images must be (n, H, W) or (n, H, W, C), got shape {x.shape}")
        out = (x[..., None] if x.ndim == 3 else x).astype(np.float32)
        span = float(out.max() - out.min()) if out.size else 0.0
        for op in self.operations:
            if op == "noise":
                out = out + rng.normal(0.0, self.strength[op] * span, out.shape).astype(np.float32)
            else:
                out = _layer(op, self.strength[op], int(rng.integers(2**31 - 1)))(out, training=True).numpy()
        return (out[..., 0] if x.ndim == 3 else out).astype(x.dtype)


def augment_images(
    augmenter: ImageAugmenter,
    images: np.ndarray,
    labels: np.ndarray,
    rng: np.random.Generator,
    n_aug: int = 1,
    cap: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Generated images and their labels: as if `n_aug` transforms of every image were sampled down
    (uniformly, without replacement) to at most `cap` x len(images), but only the sampled ones are
    computed; the originals are not included."""
    if n_aug < 0 or cap < 0:
        raise ValueError(f"n_aug and cap must be >= 0, got n_aug={n_aug!r}, cap={cap!r}")
    if len(images) != len(labels):
        raise ValueError(f"{len(images)} images but {len(labels)} labels")
    limit = min(int(cap * len(images)), n_aug * len(images))
    source = rng.choice(np.tile(np.arange(len(images)), n_aug), limit, replace=False) if limit else np.zeros(0, int)
    source = np.sort(source)
    if not len(source):
        return images[:0], labels[:0]
    return augmenter.transform(images[source], rng), labels[source]
