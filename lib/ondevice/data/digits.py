"""scikit-learn's bundled handwritten digits (UCI optdigits test set: 1,797 8x8 images with 17
grey levels, 10 classes): the local data set of MoIL's image experiment at smoke and default
scale. It ships inside scikit-learn (`load_digits`), so nothing is downloaded; run.json records
the bundled file's checksum and scikit-learn's version instead of a manifest."""

from __future__ import annotations

import hashlib
from importlib import resources

import numpy as np
import sklearn
from sklearn.datasets import load_digits

BUNDLED = "datasets/data/digits.csv.gz"  # inside the sklearn package


def load() -> tuple[np.ndarray, np.ndarray]:
    """Images as float32 in [0, 1], shape (1797, 8, 8), and int labels 0-9."""
    bunch = load_digits()
    return (bunch.images / 16.0).astype(np.float32), bunch.target.astype(np.int64)


def summary(stand_in_for: str | None) -> dict:
    """What run.json records about this data set (the shape of `Manifest.summary`)."""
    blob = resources.files("sklearn").joinpath(BUNDLED).read_bytes()
    return {
        "name": "sklearn_digits",
        "license": "BSD-3-Clause (scikit-learn); UCI optdigits, CC BY 4.0",
        "stand_in_for": stand_in_for,
        "source": f"scikit-learn {sklearn.__version__}, bundled (load_digits)",
        "artifacts": [{"file": f"sklearn/{BUNDLED}", "sha256": hashlib.sha256(blob).hexdigest(), "size": len(blob)}],
    }
