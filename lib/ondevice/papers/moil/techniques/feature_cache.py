"""Feature-map caching, FMC (thesis Sec. 4.3, Algorithm 2): with layer freezing the frozen part
computes the same feature map for a sample in every epoch, so it runs once per sample (training
and evaluation sets), the maps are stored on disk and the head trains from them. The cache is a
`.npy` file read memory-mapped, so it need not fit in memory."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import tensorflow as tf
import tf_keras as keras

from ondevice.training.step import Hook
from ondevice.training.trainer import StepTimer


def build(
    frozen: keras.Model, x: np.ndarray, path: Path, batch_size: int, timer: StepTimer | None = None
) -> np.ndarray:
    """Run `frozen` (inference mode, compiled) once over x and store the feature maps at `path`
    (written to a temporary file and renamed, so an interrupted build leaves no cache); returns
    them memory-mapped, read-only. `timer` receives each batch's seconds (the caching pass's cost)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    shape = (len(x), *frozen.output_shape[1:])
    forward = tf.function(
        lambda batch: frozen(batch, training=False),
        input_signature=[tf.TensorSpec([None, *frozen.input_shape[1:]], frozen.inputs[0].dtype)],
    )
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=shape)
        for i in range(0, len(x), batch_size):
            start = time.perf_counter()
            out[i : i + batch_size] = forward(np.asarray(x[i : i + batch_size])).numpy()
            if timer is not None:
                timer.add(time.perf_counter() - start)
        out.flush()
        del out
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return np.load(path, mmap_mode="r")


class CachedFeatures(Hook):
    """Batch source for a `Trainer` on the head: the cached feature maps and their labels,
    batched (and shuffled) exactly as the task batches raw inputs, so for the same rng the head
    sees the same samples in the same order as LF training without the cache."""

    def __init__(self, features: np.ndarray, labels: np.ndarray):
        if len(features) != len(labels):
            raise ValueError(f"{len(features)} cached feature maps but {len(labels)} labels")
        self.features, self.labels = features, labels

    def batches(self, task, data, batch_size, rng):
        return task.batches((self.features, self.labels), batch_size, rng)


def bytes_per_sample(array: np.ndarray) -> int:
    """Bytes one sample of `array` (first axis = samples) occupies."""
    return int(np.prod(array.shape[1:], dtype=np.int64)) * array.dtype.itemsize


def describe(features: np.ndarray) -> dict:
    """One cached feature map: its shape (e.g. "6x4x512") and its bytes."""
    return {
        "feature_shape": "x".join(str(d) for d in features.shape[1:]),
        "cached_bytes_per_sample": bytes_per_sample(features),
    }


def size_report(features: np.ndarray, raw_bytes_per_sample: int) -> dict:
    """Cached vs raw storage per sample (thesis footnotes 5 and 6 / M6); `raw / cached` > 1 means
    the cache is smaller than the raw input."""
    cached = describe(features)
    return {
        **cached,
        "raw_bytes_per_sample": int(raw_bytes_per_sample),
        "raw / cached": raw_bytes_per_sample / cached["cached_bytes_per_sample"],
    }
