"""Why a compression's time does not follow its work: the on-device step (the last layer trains;
the step `costs.time_epochs` times) profiled op by op with tf.profiler, uncompressed against each
of the paper's compressions (autlearn_cost): the LSTM's SVD and structured pruning at batch 16,
MobileNet's structured pruning at batch 1 and 16.

Every op's busy time on TensorFlow's executor threads is read from the profiler's trace and added
up per part of the step. LSTM: the embedding, the LSTM layers, the softmax's matmuls (one, or the
SVD's two), its bias (forward and gradient, vocabulary-wide), the cross-entropy over the vocabulary
(forward, and backward to the logits), the trained layer's weight gradient, the optimizer's update.
MobileNet: the input's resizing and grey-to-RGB, the convolutions, the depthwise convolutions,
batch normalisation, activations and padding, the head and its cross-entropy, the head's gradient,
the update. Beside each part its counted FLOPs (matrix products and convolutions only, as
`pruning.layer_flops` counts them): a part whose time stays while its work goes, or whose rate
falls, is what keeps the step from following the count. Beside the profile, the same compressions
at the paper scale's sizes (`paper_size`).

The rule for each row's diagnosis kind, fixed before the default run: the cause is the default's
sizes (`Kind.SCALE`) when, at the paper scale's sizes, the compression's measured time change agrees
in size with the paper's (`claims.audit`'s rule: same sign, within 3x); otherwise the machine's
(`Kind.HARDWARE`) when counted parts running slower than their work predicts explain more of the
gap than the work the compression leaves; otherwise open. The inference cache's rows: the paper read
two ways (`Kind.READ_TWO_WAYS`) when, under the full-backward reading (`cache_reading`), the cache's
measured change agrees in size with the paper's; otherwise open.
"""

from __future__ import annotations

import collections
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import tensorflow as tf
import tf_keras as keras
from tensorflow.tsl.profiler.protobuf import xplane_pb2

from ondevice.models import mobilenet_v1, svd_compression
from ondevice.papers.autlearn import cache_reading, costs, paper_size, step_timing
from ondevice.papers.autlearn.common import MODEL_NAMES
from ondevice.papers.autlearn.protocol import setting
from ondevice.papers.autlearn.techniques import pruning
from ondevice.report import claims

TEXT_PARTS = (
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
IMAGE_PARTS = (
    "input",
    "convolutions",
    "depthwise convolutions",
    "batch normalisation",
    "activations and padding",
    "head and cross-entropy",
    "trained layer's gradient",
    "optimizer update",
    "other",
)
PARTS = {"text": TEXT_PARTS, "image": IMAGE_PARTS}
SECTION = "Why time does not follow work: one step, op by op"
CACHE_SECTION = "The inference cache read two ways"
OPTIMIZER_FLOPS = {"sgd": 2.0, "adam": 12.0}  # per trained parameter and step
SOFTMAX_LAYERS = (f"/{svd_compression.SOFTMAX}/", f"/{svd_compression.PROJECTION}/")
IMAGE_INPUT = ("/resize/", "/grey_to_rgb/", "/to_unit_range/")
ENERGY = "optimisations lower the LSTM's training energy (performance governor)"


def part_of(op: str, kind: str = "text") -> str:
    """The part of the step a profiled op ("name:type", names as TensorFlow's graph has them) is in."""
    name, op_type = op.rsplit(":", 1)
    if name.startswith(("SGD/", "Adam/")):
        return "optimizer update"
    if kind == "image":
        return _image_part(name, op_type)
    softmax = any(s in name for s in SOFTMAX_LAYERS)
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


def _image_part(name: str, op_type: str) -> str:
    if name.startswith("gradient_tape/"):  # only the head trains: every gradient op is the head's
        return "trained layer's gradient"
    if f"/{mobilenet_v1.HEAD}/" in name or "SoftmaxCrossEntropy" in op_type or name.startswith("Mean"):
        return "head and cross-entropy"
    if any(s in name for s in IMAGE_INPUT):
        return "input"
    if "Depthwise" in op_type:
        return "depthwise convolutions"
    if "Conv2D" in op_type:  # oneDNN fuses a convolution with its batch normalisation and ReLU6
        return "convolutions"
    if "BatchNorm" in op_type:
        return "batch normalisation"
    if "Relu" in op_type or op_type == "Pad":
        return "activations and padding"
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


def _counted(params, kind: str, model: keras.Model, head: str, samples: float) -> dict[str, float]:
    """Counted FLOPs of each part of one step of `samples` positions or images (the rest count none)."""
    flops = lambda types: sum(pruning.layer_flops(la) for la in model.layers if type(la) in types)
    trained = sum(int(np.prod(w.shape)) for w in model.get_layer(head).trainable_weights)
    grad = pruning.layer_flops(model.get_layer(head))
    counted = {"trained layer's gradient": grad * samples}
    counted["optimizer update"] = OPTIMIZER_FLOPS[setting(params, kind).optimizer] * trained
    if kind == "image":
        convs, depthwise = flops({keras.layers.Conv2D}), flops({keras.layers.DepthwiseConv2D})
        parts = {"convolutions": convs, "depthwise convolutions": depthwise, "head and cross-entropy": grad}
    else:
        out = [la for la in model.layers if la.name in (svd_compression.PROJECTION, svd_compression.SOFTMAX)]
        parts = {"LSTM layers": flops({keras.layers.LSTM}), "softmax matmuls": sum(map(pruning.layer_flops, out))}
    return counted | {part: f * samples for part, f in parts.items()}


def measure(params, models: list, batches: list, kind: str = "text") -> pd.DataFrame:
    """Per (method, model, trained layer) of `models` and part of the on-device step: counted MFLOPs,
    the ops' busy milliseconds per step on `batches` (`op_milliseconds`; the models profiled in turn,
    one pass each, `timing_repeats` times, the median pass counting, so that load from other
    processes hits them alike), their share and rate, and the step's wall time
    (`step_timing.time_interleaved`). The models' weights are left as they were."""
    samples = float(np.mean([np.size(x) if kind == "text" else len(x) for x, _ in batches]))
    starts = {method: model.get_weights() for method, model, _ in models}
    steps = {method: step_timing.step_function(params, kind, "tensorflow", m, h) for method, m, h in models}
    timing = len(batches), params.warmup_steps, params.timing_repeats
    wall = {method: t[0] * 1e3 for method, t in step_timing.time_interleaved(steps, batches, *timing).items()}
    passes = {method: [] for method in steps}
    for _ in range(params.timing_repeats):
        for method, step in steps.items():
            busy = collections.Counter()
            for op, ms in op_milliseconds(step, batches, 1).items():
                busy[part_of(op, kind)] += ms
            passes[method].append([busy[part] for part in PARTS[kind]])
    rows = []
    for method, model, head in models:
        model.set_weights(starts[method])
        busy, counted = np.median(passes[method], axis=0), _counted(params, kind, model, head, samples)
        for part, t in zip(PARTS[kind], busy):
            f = counted.get(part, 0.0)
            row = dict(method=method, part=part, counted_mflops=f / 1e6, op_time_ms=t, share_of_op_time=t / busy.sum())
            rate = f / t / 1e6 if t > 0 else np.nan
            rows.append(row | dict(gflops_per_s_at_op_time=rate, step_wall_time_ms=wall[method]))
    return pd.DataFrame(rows)


@dataclass
class Profile:
    """The op profiles of every (model, batch) (`measure`'s rows, with model and batch), the
    compressions timed at the paper scale's sizes (`paper_size.measure`) and the inference cache
    read two ways (`cache_reading.measure`)."""

    ops: pd.DataFrame
    paper_size: pd.DataFrame
    cache: pd.DataFrame

    def tables(self) -> dict[str, pd.DataFrame]:
        changes = paper_size.changes(self.paper_size)
        tables = dict(step_profile=self.ops, paper_size_time=self.paper_size, paper_size_changes=changes)
        return tables | dict(cache_readings=self.cache)

    def diagnoses(self, flops: pd.DataFrame) -> dict[str, claims.Diagnosis]:
        """Per effect of a compression (and the energy row, modelled from the pruned LSTM's busy
        time): its diagnosis, by the module's rule, against `flops`' paper change of the effect."""
        paper = flops.set_index("effect")["paper change"]
        changes, out = paper_size.changes(self.paper_size), {}
        for model, batch, method in self.ops[["model", "batch", "method"]].drop_duplicates().itertuples(index=False):
            if method == "uncompressed":
                continue
            claim = _claim(model, batch, method)
            both = self.ops[(self.ops.model == model) & (self.ops.batch == batch)]
            both = both[both.method.isin(["uncompressed", method])]
            wide = paper_size.change_of(changes, model, method, batch)
            out[claim] = diagnosis(both, method, wide, paper.get(claim), model)
        for model, claim in cache_reading.CLAIMS.items():
            if (self.cache.model == model).any() and claim in paper:
                out[claim] = cache_diagnosis(*cache_reading.reading(self.cache, model), paper[claim])
        if (lstm := out.get(_claim("LSTM", 0, "structured pruning"))) is not None:
            out[ENERGY] = claims.Diagnosis(
                f"modelled from the pruned epoch's busy time; {lstm.text}", SECTION, lstm.kind
            )
        return out


def cache_diagnosis(change: float, forward_share: float, paper: float) -> claims.Diagnosis:
    """The cache's row under the full-backward reading (`cache_reading`): the paper read two ways when
    that reading's change agrees in size with the paper's (the module's rule), else open."""
    text = (
        "the paper's 30-40% saving reads as an update that back-propagates through every layer; measured "
        f"that way, the forward pass is {forward_share:.0%} of the step and the cache changes its time {change:+.0%} "
        "(ours computes the last layer's gradient alone, so the forward pass is nearly all of it)"
    )
    kind = claims.Kind.READ_TWO_WAYS if claims.agrees_in_size(paper, change) else claims.Kind.OPEN
    return claims.Diagnosis(text, CACHE_SECTION, kind)


def _claim(model: str, batch: int, method: str) -> str:
    if model == "LSTM":
        return f"{method} shortens the LSTM's epoch"
    return f"{method} shortens MobileNet's epoch (batch {batch})"


def profile(params, data, variants: dict, log=print) -> Profile:
    """`measure` on the first timed user's first `timing_steps` batches of each batch size, uncompressed
    and each of the paper's compressions; the same compressions at the paper scale's sizes; the
    inference cache read two ways."""
    tables = []
    for kind, compressed in variants.items():
        chosen = [(v.method, v.model, v.head) for v in compressed if v.method in ("uncompressed", *paper_size.METHODS)]
        seen = set()
        for batch, user, batches in costs.epochs(params, data, kind):
            if batch in seen:
                continue
            seen.add(batch)
            table = measure(params, chosen, batches[: params.timing_steps], kind)
            tables.append(table.assign(model=MODEL_NAMES[kind], batch=batch))
            steps = min(len(batches), params.timing_steps)
            passes = params.timing_repeats
            log(f"profile: {MODEL_NAMES[kind]}, {steps} steps of {user} at batch {batch}, {passes} passes")
    wide, cache = paper_size.measure(params, data, variants, log), cache_reading.measure(params, data, variants, log)
    return Profile(pd.concat(tables, ignore_index=True), wide, cache)


def diagnosis(table: pd.DataFrame, method: str = "SVD", wide=None, paper=None, model: str = "LSTM") -> claims.Diagnosis:
    """A compression's diagnosis from `measure`'s table of it and the uncompressed model. The gap
    between the compressed step's op time and the time its counted work predicts splits in two:
    parts whose work the compression does not remove (at the uncompressed step's speed; the count
    sees none or little of it) and counted parts running slower than their own work predicts (the
    smaller products below the larger ones' rate). `wide`: (time change, work change) at the paper
    scale's sizes; `paper`: the paper's change. The kind follows the module's rule."""
    wide_t = table.pivot(index="part", columns="method", values=["op_time_ms", "counted_mflops"])
    wide_t = wide_t.reindex([p for p in dict.fromkeys((*TEXT_PARTS, *IMAGE_PARTS)) if p in wide_t.index])
    t_b, t_s = wide_t.op_time_ms.uncompressed, wide_t.op_time_ms[method]
    f_b, f_s = wide_t.counted_mflops.uncompressed, wide_t.counted_mflops[method]
    counted = f_b > 0
    predicted = t_b.where(~counted, t_b * f_s / f_b.where(counted, 1.0))  # each part at its own work
    predicted_total = t_b.sum() * f_s.sum() / f_b.sum()
    slower = float((t_s - predicted)[counted].sum())
    kept = float(predicted.sum() - predicted_total)
    parts = ", ".join(f"{p} {t_b[p]:.2f}->{t_s[p]:.2f}" for p in wide_t.index if max(t_b[p], t_s[p]) >= 0.005)
    rate = lambda f, t: f[counted].sum() / t[counted].sum()
    text = (
        f"tf.profiler, op ms per step (uncompressed->{method}): {parts}; "
        f"counted FLOPs predict {predicted_total:.2f} ms, measured {t_s.sum():.2f}: "
        f"{kept:.2f} ms is work {method} leaves (parts at the uncompressed speed), "
        f"{slower:.2f} ms the counted parts running slower ({rate(f_b, t_b):.1f} -> {rate(f_s, t_s):.1f} GFLOP/s)"
    )
    kind = claims.Kind.HARDWARE if slower > kept else claims.Kind.OPEN
    if wide is not None:
        sizes = paper_size.SIZES["text" if model == "LSTM" else "image"]
        text += (
            f"; at the paper scale's sizes ({sizes}) the step's time changes {wide[0]:+.0%} ({wide[1]:+.0%} by FLOPs)"
        )
        if paper is not None and claims.agrees_in_size(paper, wide[0]):
            kind = claims.Kind.SCALE
    return claims.Diagnosis(text, SECTION, kind)
