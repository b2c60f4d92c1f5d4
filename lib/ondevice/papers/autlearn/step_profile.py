"""Why the SVD's time does not follow its work: one on-device LSTM step (the softmax trains) timed
part by part, uncompressed against SVD (autlearn_cost).

Each part is timed as the difference between two TensorFlow functions that run the step up to and
including it: the embedding, the LSTM layers, the softmax's matmuls (one, or the SVD's two), the
cross-entropy over the vocabulary, the trained layer's gradient, the optimizer's update. The stages
run in turn, pass after pass, on the same batches, so that load from other processes hits them
alike; each stage's time is the median of its passes. Beside each part its counted FLOPs (matrix
products only, as `pruning.layer_flops` counts them): a part whose time stays while its work goes,
or whose rate falls, is what keeps the step from following the count.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import tensorflow as tf
import tf_keras as keras

from ondevice.models import svd_compression
from ondevice.papers.autlearn import costs, step_timing
from ondevice.papers.autlearn.protocol import setting, task
from ondevice.papers.autlearn.techniques import pruning
from ondevice.report import claims
from ondevice.training.step import make_optimizer

PARTS = ("embedding", "LSTM layers", "softmax matmuls", "cross-entropy", "trained layer's gradient", "optimizer update")
SECTION = "Why time does not follow work: one step, part by part"
OPTIMIZER_FLOPS = {"sgd": 2.0, "adam": 12.0}  # per trained parameter and step


def _stages(params, model: keras.Model, head: str) -> list:
    """One function per part: the step up to and including it, (x, y) -> a tensor."""
    s, t = setting(params, "text"), task(params, "text")
    first_out = model.get_layer(svd_compression.PROJECTION if _has(model, svd_compression.PROJECTION) else head)
    embed = keras.Model(model.input, model.get_layer("embedding").output)
    features = keras.Model(model.input, first_out.input)
    variables = model.get_layer(head).trainable_weights
    optimizer = make_optimizer(s.optimizer, s.learning_rate)
    optimizer.build(variables)

    def gradient(x, y):
        with tf.GradientTape() as tape:
            loss = t.loss(y, model(x, training=True))
        return loss, tape.gradient(loss, variables)

    def update(x, y):
        loss, grads = gradient(x, y)
        optimizer.apply_gradients(zip(grads, variables))
        return loss

    stages = (
        lambda x, y: embed(x, training=True),
        lambda x, y: features(x, training=True),
        lambda x, y: model(x, training=True),
        lambda x, y: t.loss(y, model(x, training=True)),
        lambda x, y: gradient(x, y)[1],
        update,
    )
    spec = [t.signature.inputs, t.signature.labels]
    return [tf.function(f, input_signature=spec) for f in stages]


def _has(model: keras.Model, name: str) -> bool:
    return any(layer.name == name for layer in model.layers)


def _counted(params, model: keras.Model, head: str, positions: float) -> list[float]:
    """Counted FLOPs of each part of one step of `positions` positions."""
    lstm = sum(pruning.layer_flops(la) for la in model.layers if isinstance(la, keras.layers.LSTM))
    out = [la for la in model.layers if la.name in (svd_compression.PROJECTION, svd_compression.SOFTMAX)]
    trained = sum(int(np.prod(w.shape)) for w in model.get_layer(head).trainable_weights)
    matmuls, grad = sum(pruning.layer_flops(la) for la in out), pruning.layer_flops(model.get_layer(head))
    update = OPTIMIZER_FLOPS[setting(params, "text").optimizer] * trained
    return [0.0, lstm * positions, matmuls * positions, 0.0, grad * positions, update]


def profile(params, data, variants: dict, log=print) -> pd.DataFrame:
    """`measure` on the first timed user's first `timing_steps` batches, uncompressed and SVD."""
    _, user, batches = next(costs.epochs(params, data, "text"))
    chosen = [v for v in variants["text"] if v.method in ("uncompressed", "SVD")]
    table = measure(params, [(v.method, v.model, v.head) for v in chosen], batches[: params.timing_steps])
    log(f"profile: {min(len(batches), params.timing_steps)} steps of {user}, {params.timing_repeats} passes per part")
    return table


def measure(params, models: list, batches: list) -> pd.DataFrame:
    """Per (method, model, trained layer) of `models` and part of the step: counted MFLOPs and
    measured milliseconds per step on `batches`, its share of the step and its rate. The models'
    weights are as before (the update stage trains them)."""
    positions = float(np.mean([np.size(x) for x, _ in batches]))
    stages = {method: _stages(params, model, head) for method, model, head in models}
    starts = {method: model.get_weights() for method, model, _ in models}
    for fns in stages.values():  # trace every batch shape before any timing
        for f in fns:
            step_timing.time_steps(f, batches, len(batches), params.warmup_steps)
    passes = {m: [[] for _ in PARTS] for m in stages}
    for _ in range(params.timing_repeats):
        for method, fns in stages.items():
            for i, f in enumerate(fns):
                passes[method][i].append(step_timing.time_steps(f, batches, len(batches), 0)[0])
    rows = []
    for method, model, head in models:
        model.set_weights(starts[method])
        cumulative = np.median(passes[method], axis=1) * 1e3
        ms = np.diff(np.concatenate([[0.0], cumulative]))
        for part, f, t in zip(PARTS, _counted(params, model, head, positions), ms):
            row = dict(method=method, part=part, counted_mflops=f / 1e6, step_time_ms=t)
            rate = f / t / 1e6 if t > 0 else np.nan
            rows.append(row | dict(share_of_step_time=t / cumulative[-1], gflops_per_s_at_step_time=rate))
    return pd.DataFrame(rows)


def diagnosis(table: pd.DataFrame) -> claims.Diagnosis:
    """The SVD row's diagnosis from `profile`'s table. The gap between the SVD step's measured time
    and the time its counted work predicts splits in two: parts whose work SVD does not remove
    (time at the uncompressed step's speed; the count sees none or little of it) and counted parts
    running slower than their own work predicts (the smaller matmuls below the larger ones' rate).
    The cause is the machine's (`Kind.HARDWARE`) only when the second is the larger; otherwise open."""
    wide = table.pivot(index="part", columns="method").reindex(list(PARTS))
    t_b, t_s = wide.step_time_ms.uncompressed, wide.step_time_ms.SVD
    f_b, f_s = wide.counted_mflops.uncompressed, wide.counted_mflops.SVD
    counted = f_b > 0
    predicted = t_b.where(~counted, t_b * f_s / f_b.where(counted, 1.0))  # each part at its own work
    predicted_total = t_b.sum() * f_s.sum() / f_b.sum()
    slower = float((t_s - predicted)[counted].sum())
    kept = float(predicted.sum() - predicted_total)
    parts = ", ".join(f"{p} {t_b[p]:.2f}->{t_s[p]:.2f}" for p in PARTS)
    rate = lambda f, t: f[counted].sum() / t[counted].sum() / 1e3
    text = (
        f"profile of one step, ms (uncompressed->SVD): {parts}; counted FLOPs predict {predicted_total:.2f} ms, "
        f"measured {t_s.sum():.2f}: {kept:.2f} ms of it is work SVD leaves (parts at the uncompressed speed), "
        f"{slower:.2f} ms the counted parts running slower ({rate(f_b, t_b):.1f} -> {rate(f_s, t_s):.1f} GFLOP/s)"
    )
    return claims.Diagnosis(text, SECTION, claims.Kind.HARDWARE if slower > kept else claims.Kind.OPEN)
