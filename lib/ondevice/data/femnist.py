"""LEAF FEMNIST (data_manifests/femnist.yaml): handwritten characters grouped by writer, with LEAF's
own per-writer train/test split (the `*_train_*.json` and `*_test_*.json` file of a pair hold the
same writers). A file is {"users": [...], "num_samples": [...], "user_data": {writer: {"x": [[784
floats in [0, 1]]], "y": [class]}}}: a row-major 28x28 grey image (1.0 = white background, dark
ink) and a class in 0-61 (digits, A-Z, a-z). Anything else stops the load with `DataError` naming
the file and the writer.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from . import leaf, manifests

CLASSES = 62
SIDE = 28


def read_file(path: str | Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Writer -> (images float32 (n, 28, 28, 1) in [0, 1], labels int32 (n,)) of one LEAF file."""
    path = Path(path)
    out = {}
    for writer, entry in leaf.user_entries(path, "writer"):
        try:
            x = np.asarray(entry["x"], dtype=np.float32)
            y = np.asarray(entry["y"])
        except (TypeError, ValueError) as exc:
            raise manifests.DataError(
                f"{path}: writer {writer!r}: 'x' is not a list of {SIDE * SIDE} numbers per image ({exc})"
            ) from None
        if x.ndim != 2 or x.shape[1] != SIDE * SIDE or len(x) == 0:
            raise manifests.DataError(
                f"{path}: writer {writer!r}: 'x' must hold rows of {SIDE * SIDE} pixels, got shape {x.shape}"
            )
        if not np.all((x >= 0) & (x <= 1)):
            raise manifests.DataError(f"{path}: writer {writer!r}: pixels must lie in [0, 1]")
        if y.shape != (len(x),) or not np.issubdtype(y.dtype, np.integer) or y.min() < 0 or y.max() >= CLASSES:
            raise manifests.DataError(
                f"{path}: writer {writer!r}: 'y' must hold one class in 0..{CLASSES - 1} per image"
            )
        out[str(writer)] = (x.reshape(-1, SIDE, SIDE, 1), y.astype(np.int32))
    if not out:
        raise manifests.DataError(f"{path}: no writers")
    return out


def _pairs(files: list[Path]) -> list[tuple[Path, Path]]:
    train = {f.name.replace("_train_", "_*_"): f for f in files if "_train_" in f.name}
    test = {f.name.replace("_test_", "_*_"): f for f in files if "_test_" in f.name}
    if not train or set(train) != set(test):
        raise manifests.DataError(
            f"FEMNIST files must come in *_train_*/*_test_* pairs; unmatched: "
            f"{sorted(set(train) ^ set(test)) or 'no train files'}"
        )
    return [(train[k], test[k]) for k in sorted(train, key=lambda k: (len(k), k))]


def load(directory: str | Path = "", pairs: int = 0) -> tuple[dict, dict, list[Path]]:
    """(train, test, files): writer -> (images, labels) with LEAF's split, from the first `pairs`
    train/test file pairs (0 = all) under `directory` (LEAF's output, e.g. the full FEMNIST at
    paper scale) or of the manifest (mirror or sources, sha256-verified) when it is empty."""
    if directory:
        files = sorted(Path(directory).rglob("*.json"))
    else:
        m = manifests.load("femnist")
        files = [manifests.fetch_artifact(m, a, verbose=False) for a in m.artifacts]
    chosen = _pairs(files)[: pairs or None]
    train, test = {}, {}
    for train_file, test_file in chosen:
        a, b = read_file(train_file), read_file(test_file)
        if set(a) != set(b):
            raise manifests.DataError(
                f"{train_file.name} and {test_file.name} hold different writers: {sorted(set(a) ^ set(b))[:5]}"
            )
        train.update(a)
        test.update(b)
    return train, test, [f for pair in chosen for f in pair]
