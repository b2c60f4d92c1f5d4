"""Why the SVD's time does not follow its work: the on-device LSTM step (the softmax trains; the
step `costs.time_epochs` times) profiled op by op with tf.profiler, uncompressed against SVD
(autlearn_cost).

Every op's busy time on TensorFlow's executor threads is read from the profiler's trace and added
up per part of the step: the embedding, the LSTM layers, the softmax's matmuls (one, or the SVD's
two), its bias (forward and gradient, vocabulary-wide), the cross-entropy over the vocabulary
(forward, and backward to the logits), the trained layer's weight gradient, the optimizer's
update. Beside each part its counted FLOPs (matrix products only, as `pruning.layer_flops` counts
them): a part whose time stays while its work goes, or whose rate falls, is what keeps the step
from following the count.
"""

from __future__ import annotations

import collections
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import tensorflow as tf
import tf_keras as keras
from tensorflow.tsl.profiler.protobuf import xplane_pb2

from ondevice.models import svd_compression
from ondevice.papers.autlearn import costs, step_timing
from ondevice.papers.autlearn.protocol import setting
from ondevice.papers.autlearn.techniques import pruning
from ondevice.report import claims

PARTS = (
    "embedding",
    "LSTM layers",
    "softmax matmuls",
    "softmax bias",
    "cross-entropy",
    "cross-entropy, backward",
    "trained layer's gradient",
    "optimizer update",
    "other",
)
SECTION = "Why time does not follow work: one step, op by op"
OPTIMIZER_FLOPS = {"sgd": 2.0, "adam": 12.0}  # per trained parameter and step
SOFTMAX_LAYERS = (f"/{svd_compression.SOFTMAX}/", f"/{svd_compression.PROJECTION}/")


def part_of(op: str) -> str:
    """The part of the step a profiled op ("name:type", names as TensorFlow's graph has them) is in."""
    name, kind = op.rsplit(":", 1)
    softmax = any(s in name for s in SOFTMAX_LAYERS)
    if name.startswith(("SGD/", "Adam/")):
        return "optimizer update"
    if softmax and "BiasAdd" in name:
        return "softmax bias"
    if name.startswith("gradient_tape/"):
        return "trained layer's gradient" if softmax else "cross-entropy, backward"
    if softmax:
        return "softmax matmuls"
    if name.startswith("AddN"):  # the logits' two gradient paths (log-sum-exp, the label's gather) summed
        return "cross-entropy, backward"
    if name.startswith(("ReduceLogSumExp", "GatherV2")):
        return "cross-entropy"
    if "/embedding/" in name:
        return "embedding"
    if "while" in name or "/lstm_" in name or name.startswith(("transpose", "TensorArray")):
        return "LSTM layers"
    return "other"


def op_milliseconds(step, batches: list, passes: int) -> dict[str, float]:
    """Busy milliseconds per step of each op on TensorFlow's executor threads, from a tf.profiler
    trace of `passes` passes over `batches` (the step already traced for their shapes)."""
    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(logdir)
        try:
            for _ in range(passes):
                for x, y in batches:
                    step(x, y)
        finally:
            tf.profiler.experimental.stop()
        space = xplane_pb2.XSpace()
        space.ParseFromString(next(Path(logdir).rglob("*.xplane.pb")).read_bytes())
    busy = collections.Counter()
    for plane in space.planes:
        for line in (line for line in plane.lines if line.name.startswith("tf_Compute")):
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                if ":" in name and "::" not in name:  # op "name:type"; not the executor's own events
                    busy[name] += event.duration_ps / 1e9
    return {op: ms / (passes * len(batches)) for op, ms in busy.items()}


def _counted(params, model: keras.Model, head: str, positions: float) -> dict[str, float]:
    """Counted FLOPs of each part of one step of `positions` positions (the rest count none)."""
    lstm = sum(pruning.layer_flops(la) for la in model.layers if isinstance(la, keras.layers.LSTM))
    out = [la for la in model.layers if la.name in (svd_compression.PROJECTION, svd_compression.SOFTMAX)]
    trained = sum(int(np.prod(w.shape)) for w in model.get_layer(head).trainable_weights)
    matmuls, grad = sum(pruning.layer_flops(la) for la in out), pruning.layer_flops(model.get_layer(head))
    update = OPTIMIZER_FLOPS[setting(params, "text").optimizer] * trained
    counted = {"LSTM layers": lstm * positions, "softmax matmuls": matmuls * positions}
    return counted | {"trained layer's gradient": grad * positions, "optimizer update": update}


def profile(params, data, variants: dict, log=print) -> pd.DataFrame:
    """`measure` on the first timed user's first `timing_steps` batches, uncompressed and SVD."""
    _, user, batches = next(costs.epochs(params, data, "text"))
    chosen = [v for v in variants["text"] if v.method in ("uncompressed", "SVD")]
    table = measure(params, [(v.method, v.model, v.head) for v in chosen], batches[: params.timing_steps])
    log(f"profile: {min(len(batches), params.timing_steps)} steps of {user}, {params.timing_repeats} passes")
    return table


def measure(params, models: list, batches: list) -> pd.DataFrame:
    """Per (method, model, trained layer) of `models` and part of the on-device step: counted MFLOPs,
    the ops' busy milliseconds per step on `batches` (`op_milliseconds`; the models profiled in turn,
    one pass each, `timing_repeats` times, the median pass counting, so that load from other
    processes hits them alike), their share and rate, and the step's wall time
    (`step_timing.time_steps`). The models' weights are left as they were."""
    positions = float(np.mean([np.size(x) for x, _ in batches]))
    starts = {method: model.get_weights() for method, model, _ in models}
    steps = {method: step_timing.step_function(params, "text", "tensorflow", m, h) for method, m, h in models}
    timing = len(batches), params.warmup_steps, params.timing_repeats
    wall = {method: step_timing.time_steps(step, batches, *timing)[0] * 1e3 for method, step in steps.items()}
    passes = {method: [] for method in steps}
    for _ in range(params.timing_repeats):
        for method, step in steps.items():
            busy = collections.Counter()
            for op, ms in op_milliseconds(step, batches, 1).items():
                busy[part_of(op)] += ms
            passes[method].append([busy[part] for part in PARTS])
    rows = []
    for method, model, head in models:
        model.set_weights(starts[method])
        busy, counted = np.median(passes[method], axis=0), _counted(params, model, head, positions)
        for part, t in zip(PARTS, busy):
            f = counted.get(part, 0.0)
            row = dict(method=method, part=part, counted_mflops=f / 1e6, op_time_ms=t, share_of_op_time=t / busy.sum())
            rate = f / t / 1e6 if t > 0 else np.nan
            rows.append(row | dict(gflops_per_s_at_op_time=rate, step_wall_time_ms=wall[method]))
    return pd.DataFrame(rows)


def diagnosis(table: pd.DataFrame) -> claims.Diagnosis:
    """The SVD row's diagnosis from `measure`'s table. The gap between the SVD step's op time and the
    time its counted work predicts splits in two: parts whose work SVD does not remove (at the
    uncompressed step's speed; the count sees none or little of it) and counted parts running slower
    than their own work predicts (the smaller matmuls below the larger ones' rate). The cause is the
    machine's (`Kind.HARDWARE`) only when the second is the larger; otherwise open."""
    wide = table.pivot(index="part", columns="method").reindex(list(PARTS))
    t_b, t_s = wide.op_time_ms.uncompressed, wide.op_time_ms.SVD
    f_b, f_s = wide.counted_mflops.uncompressed, wide.counted_mflops.SVD
    counted = f_b > 0
    predicted = t_b.where(~counted, t_b * f_s / f_b.where(counted, 1.0))  # each part at its own work
    predicted_total = t_b.sum() * f_s.sum() / f_b.sum()
    slower = float((t_s - predicted)[counted].sum())
    kept = float(predicted.sum() - predicted_total)
    parts = ", ".join(f"{p} {t_b[p]:.2f}->{t_s[p]:.2f}" for p in PARTS if max(t_b[p], t_s[p]) >= 0.005)
    rate = lambda f, t: f[counted].sum() / t[counted].sum()
    text = (
        f"tf.profiler, op ms per step (uncompressed->SVD): {parts}; counted FLOPs predict {predicted_total:.2f} ms, "
        f"measured {t_s.sum():.2f}: {kept:.2f} ms is work SVD leaves (parts at the uncompressed speed), "
        f"{slower:.2f} ms the counted parts running slower ({rate(f_b, t_b):.1f} -> {rate(f_s, t_s):.1f} GFLOP/s)"
    )
    return claims.Diagnosis(text, SECTION, claims.Kind.HARDWARE if slower > kept else claims.Kind.OPEN)
