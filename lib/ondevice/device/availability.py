"""When a phone may train, how long personal training takes on it, and training that spans windows.

AutLearn trains offline only while a phone is idle and charging (Sec. 2), so personalization
happens in windows and must survive the ends of windows. Three pieces:

- Phone training time from FLASH's measured per-layer training times (`LayerTimes`): for each
  phone and layer kind (embedding, LSTM, dense output), a non-negative least-squares fit of the
  measured seconds per batch on the layer's work (products of batch, sequence length and layer
  sizes). DL4J on the phone CPU, not TensorFlow Lite; the measurements cover sequence lengths
  2-10, so longer sequences rest on the fit's linearity in sequence length (stated, and checked
  by fitting on lengths <= 6 and predicting 8 and 10). `device_profile` turns a fit into the
  suite's device-profile format (the runner log of `tools/ondevice_runner.py`), which
  `device.device_profile.extrapolate_seconds` scales to a user's steps; every such number is an
  extrapolation and labelled so.
- Finishing within a window budget (`finish_seconds`): training needs `need` seconds of work in
  steps of `step` seconds; each window costs `overhead` seconds (restore at its start, save at its
  end) and a step cut off by a window's end is lost.
- Training across windows through the trainable TFLite file (`train_across_windows`): each
  window opens a fresh interpreter (the app was stopped in between), restores the last
  checkpoint through the `restore` signature, trains its steps and saves through `save`. The
  checkpoint holds the model's weights only, so resuming is exact for a stateless optimizer
  (SGD) and not for Adam, whose moments restart from zero.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tensorflow as tf
from scipy.optimize import nnls

from ..data import manifests
from ..models.lstm_lm import LSTMConfig
from . import tflite
from .device_profile import PROFILE_FORMAT

MANIFEST = "flash_device_times"
PHONES = {
    "redmi_note8": "Xiaomi Redmi Note 8",
    "nexus6": "Motorola/Google Nexus 6",
    "sumsung_note10": "Samsung Galaxy Note 10",
}
# phone-model strings of a trace that name a profiled phone (lower case, matched as substrings)
MODEL_ALIASES = {
    "redmi note 8": "redmi_note8",
    "nexus 6": "nexus6",
    "note 10": "sumsung_note10",
    "sm-n970": "sumsung_note10",
    "sm-n975": "sumsung_note10",
}
LAYERS = ("embedding", "lstm", "output")
# upstream's normalisation of [in, out, batch, seq]
NORMS = {"embedding": (1e4, 1e3, 50.0, 10.0), "lstm": (1e3, 1e3, 50.0, 10.0), "output": (1e3, 1e4, 50.0, 10.0)}
GRID = {"in_out": (0.05, 1.0), "batch": (5, 50), "seq": (2, 10)}  # the measured range (normalised in/out)
HEAD_UNITS = 2  # upstream's embedding and LSTM measurements include a 2-unit dense head, subtracted


def _work(layer: str, i, o, b, s) -> np.ndarray:
    """Work terms of one training batch through a layer (real sizes), one row per case."""
    i, o, b, s = np.broadcast_arrays(*(np.asarray(v, float) for v in (i, o, b, s)))
    one = np.ones(i.shape)
    if layer == "lstm":  # 4 gates: products of (input + hidden) x hidden per position, element-wise gate work
        return np.stack([one, b * s * o * (i + o) / 1e6, b * s * o / 1e3, b * s / 1e2], -1)
    if layer == "output":  # dense layer per position, and the update of its in x out weights
        return np.stack([one, b * s * i * o / 1e6, b * s * o / 1e3, i * o / 1e6], -1)
    if layer == "embedding":  # row look-ups per position, and the update of the vocabulary x dim table
        return np.stack([one, b * s * o / 1e3, i * o / 1e6, b * s / 1e2], -1)
    raise ValueError(f"layer must be one of {LAYERS}, got {layer!r}")


def _denormalise(layer: str, X: np.ndarray) -> tuple[np.ndarray, ...]:
    return tuple(X[:, k] * NORMS[layer][k] for k in range(4))


@dataclass(frozen=True)
class LayerTimes:
    """One phone's fitted per-layer training time; `fit` holds each layer's fit quality."""

    phone: str
    coef: dict[str, np.ndarray]
    fit: tuple[dict, ...]

    def layer_seconds(self, layer: str, in_size, out_size, batch, seq) -> np.ndarray:
        return _work(layer, in_size, out_size, batch, seq) @ self.coef[layer]

    def batch_seconds(self, config: LSTMConfig, batch: int, seq) -> np.ndarray:
        """Seconds to train one batch of the whole LSTM model (every layer trains) on this phone."""
        head = lambda units: self.layer_seconds("output", units, HEAD_UNITS, batch, seq)
        total = self.layer_seconds("embedding", config.input_vocab, config.embedding_dim, batch, seq) - head(
            config.embedding_dim
        )
        width = config.embedding_dim
        for _ in range(config.layers):
            total = (
                total + self.layer_seconds("lstm", width, config.hidden_units, batch, seq) - head(config.hidden_units)
            )
            width = config.hidden_units
        return total + self.layer_seconds("output", config.hidden_units, config.output_vocab, batch, seq)

    def outside_grid(self, config: LSTMConfig, batch: int, seq: float) -> list[str]:
        """What of this model and batch lies outside the measured range (extrapolated further)."""
        lo, hi = GRID["in_out"]
        sizes = {
            "embedding": (config.input_vocab, config.embedding_dim),
            "lstm": (min(config.embedding_dim, config.hidden_units), config.hidden_units),
            "output": (config.hidden_units, config.output_vocab),
        }
        out = [
            f"{layer} size"
            for layer, (i, o) in sizes.items()
            if not (lo <= i / NORMS[layer][0] <= hi and lo <= o / NORMS[layer][1] <= hi)
        ]
        if not GRID["batch"][0] <= batch <= GRID["batch"][1]:
            out.append("batch")
        if not GRID["seq"][0] <= seq <= GRID["seq"][1]:
            out.append("sequence length")
        return out


def fit_layer_times(phone: str, measurements: dict[str, tuple[np.ndarray, np.ndarray]]) -> LayerTimes:
    """Non-negative least squares per layer on all measurements; quality: R^2 on them, and the
    median relative error at sequence lengths 8 and 10 of a fit on lengths <= 6 (how well the
    fit extends to longer sequences)."""
    coef, fit = {}, []
    for layer in LAYERS:
        X, Y = measurements[layer]
        A, y = _work(layer, *_denormalise(layer, X)), np.asarray(Y, float).ravel()
        coef[layer], _ = nnls(A, y)
        pred = A @ coef[layer]
        short = _denormalise(layer, X)[3] <= 6
        held, _ = nnls(A[short], y[short])
        rel = np.abs(A[~short] @ held - y[~short]) / y[~short]
        fit.append(
            {
                "phone": phone,
                "layer": layer,
                "measurements": len(y),
                "r2": float(1 - ((y - pred) ** 2).sum() / ((y - y.mean()) ** 2).sum()),
                "median_rel_error_seq_8_10_from_seq_le_6": float(np.median(rel)),
                "measured_min_seconds": float(y.min()),
                "measured_max_seconds": float(y.max()),
            }
        )
    return LayerTimes(phone, coef, tuple(fit))


def load_layer_times(phones=tuple(PHONES)) -> dict[str, LayerTimes]:
    """Each phone's fit, from the FLASH measurements declared in data_manifests/flash_device_times.yaml."""
    manifest = manifests.load(MANIFEST)
    root = manifests.fetch(manifest)  # verified once, then read by layout
    out = {}
    for phone in phones:
        if phone not in PHONES:
            raise ValueError(f"no FLASH measurements for phone {phone!r}; measured: {sorted(PHONES)}")
        data = {}
        for layer in LAYERS:
            doc = json.loads((root / manifest.layout[f"{phone}/{layer}"]).read_text())
            data[layer] = (np.asarray(doc["X"], float), np.asarray(doc["Y"], float))
        out[phone] = fit_layer_times(phone, data)
    return out


def phone_of(model: str, unknown: str) -> str:
    """The profiled phone a trace's phone-model string names, else `unknown`."""
    name = model.lower()
    return next((phone for alias, phone in MODEL_ALIASES.items() if alias in name), unknown)


def device_profile(times: LayerTimes, config: LSTMConfig, batch: int, mean_length: float) -> dict:
    """A device profile in the runner-log format (`device.device_profile.load_device_profile`): the
    phone's extrapolated seconds per full training step at `mean_length`."""
    return {
        "format": PROFILE_FORMAT,
        "device": PHONES[times.phone],
        "variant": "full",
        "steady_step_seconds": float(times.batch_seconds(config, batch, mean_length)),
        "mean_length": float(mean_length),
        "batch_size": int(batch),
        "source": "extrapolated from FLASH's per-layer DL4J training times (data_manifests/flash_device_times.yaml)",
        "label": "extrapolated",
    }


def finish_seconds(windows: np.ndarray, t0, need: float, step: float, overhead: float = 0.0):
    """Seconds from each start time t0 until `need` seconds of training are done inside
    `windows` (sorted, disjoint (start, end) rows), or inf if the windows run out first."""
    if step <= 0 or overhead < 0:
        raise ValueError(f"step must be positive and overhead >= 0, got {step}, {overhead}")
    t = np.asarray(t0, float)
    needed = math.ceil(need / step - 1e-9)
    if not len(windows):
        return math.inf if np.ndim(t0) == 0 else np.full(t.shape, 0.0 if needed <= 0 else math.inf)
    steps = np.floor(np.maximum(windows[:, 1] - windows[:, 0] - overhead, 0.0) / step)
    done = np.concatenate([[0.0], np.cumsum(steps)])  # steps in the windows before window k: done[k]
    first = np.searchsorted(windows[:, 1], t, side="right")  # the first window still open at t
    k = np.minimum(first, len(windows) - 1)
    begin = np.maximum(windows[k, 0], t)
    partial = np.floor(np.maximum(windows[k, 1] - begin - overhead, 0.0) / step)  # steps left in it
    # windows after the first: the first whose cumulative steps reach what the partial one lacks
    later = np.searchsorted(done, done[k + 1] + needed - partial, side="left") - 1
    in_first = partial >= needed
    last = np.where(in_first, k, later)
    before = np.where(in_first, 0.0, partial + done[np.minimum(last, len(windows) - 1)] - done[k + 1])
    start = np.where(in_first, begin, windows[np.minimum(last, len(windows) - 1), 0])
    out = start + overhead / 2 + (needed - before) * step - t
    out = np.where((first >= len(windows)) | (last >= len(windows)), math.inf, out)
    out = np.where(needed <= 0, 0.0, out)
    return float(out) if np.ndim(t0) == 0 else out


def checkpoint_weights(path: str | Path, model) -> list[np.ndarray]:
    """The weights a `save` signature wrote, read back by name (as `restore` does)."""
    return [
        tf.raw_ops.Restore(file_pattern=str(path), tensor_name=w.name, dt=w.dtype).numpy().reshape(w.shape)
        for w in model.weights
    ]


def train_across_windows(
    flatbuffer: bytes, task, batches: list, steps_per_window, checkpoint: str | Path
) -> list[float]:
    """Train `batches` in order through the TFLite file, window by window: each window starts a
    fresh interpreter, restores the last checkpoint (none before the first), trains its steps and
    saves. Returns the losses; the final weights are in `checkpoint`."""
    if sum(steps_per_window) != len(batches):
        raise ValueError(f"the windows hold {sum(steps_per_window)} steps for {len(batches)} batches")
    path = np.array(str(checkpoint).encode())
    losses, done = [], 0
    for n, steps in enumerate(steps_per_window):
        interp = tflite.interpreter(flatbuffer)
        if n:
            interp.get_signature_runner("restore")(checkpoint_path=path)
        losses += tflite.train_on_device(interp, task, batches[done : done + steps])
        interp.get_signature_runner("save")(checkpoint_path=path)
        done += steps
    return losses
