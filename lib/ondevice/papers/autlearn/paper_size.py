"""The same compressions at the paper scale's model sizes, timed on this machine (autlearn_cost):
does the on-device step's time follow the removed work once the models are as wide as the paper's?

The default scale trains narrower models than the paper scale: the LSTM has 96 units (paper scale:
400, DeepType's; AutLearn states only the 10K vocabulary and the two layers), MobileNet is alpha 0.25
at 64 px (paper scale and the paper: alpha 1.0 at 224 px). Where most of a narrow step's time is work
no compression touches (the vocabulary-wide softmax bias and cross-entropy, small ops' fixed costs),
a wider model shifts the time to the work that compression removes. A step's time does not depend
on its weights' values, so the paper-size models carry random weights: each compression keeps the
same share of every layer it shrank (structured pruning: the units of smallest norm, as the search
removes them; SVD: the same share of the rank) and both are timed with the same on-device step, on
the default's own batches of the timed users (`costs.epochs`). Nothing here is trained or scored.
"""

from __future__ import annotations

import pandas as pd
import tf_keras as keras

from ondevice.data import femnist
from ondevice.models import lstm_lm, mobilenet_v1, svd_compression
from ondevice.papers.autlearn import common, costs, step_timing
from ondevice.papers.autlearn.common import LAST_LAYER, MODEL_NAMES
from ondevice.papers.autlearn.techniques import pruning
from ondevice.streams import tf_seed

SIZES = {"text": "embedding 400, 400 LSTM units", "image": "alpha 1.0 at 224 px"}
METHODS = ("structured pruning", "SVD")  # the paper's compressions (not the magnitude ablation)
CHANGES = {"step_seconds": "time_change", "gflops": "work_change"}


def uncompressed(params, data, kind: str) -> keras.Model:
    """The model of `kind` at the paper scale's sizes, random weights (a fixed seed)."""
    size = common.MODEL_PRESETS["paper"]
    if kind == "text":
        vocab, layers = data.text.vocab, params.lstm_layers
        config = lstm_lm.LSTMConfig(vocab.input_size, vocab.size, size["embedding_dim"], size["hidden_units"], layers)
        return lstm_lm.build(config, seed=tf_seed(params.seed, "paper-size/lstm"))
    alpha = common.DATA_PRESETS["paper"]["mobilenet_alpha"]
    seed = tf_seed(params.seed, "paper-size/mobilenet")
    return pruning.flatten(mobilenet_v1.build(None, alpha, size["image_size"], femnist.CLASSES, seed=seed))


def like(variant, base: keras.Model, wide: keras.Model) -> keras.Model:
    """`variant`'s compression of `base` applied to `wide`, the same model at larger sizes."""
    if variant.method == "SVD":
        rank = variant.model.get_layer(svd_compression.PROJECTION).units
        full = base.get_layer(svd_compression.SOFTMAX).input_shape[-1]
        wide_full = wide.get_layer(svd_compression.SOFTMAX).input_shape[-1]
        return svd_compression.compress(wide, max(1, round(wide_full * rank / full)))
    for name in pruning.candidates(base):
        kept, was = pruning.width(variant.model.get_layer(name)), pruning.width(base.get_layer(name))
        if kept < was:
            layer = wide.get_layer(name)
            remove = pruning.width(layer) - max(1, round(pruning.width(layer) * kept / was))
            wide = pruning.prune(wide, name, pruning.lowest_units(layer, remove))
    return wide


def measure(params, data, variants: dict, log=print) -> pd.DataFrame:
    """Per model, batch size, timed user and method (uncompressed and each of the paper's compressions):
    the step's steady seconds (`step_timing.time_interleaved`, as `costs.time_epochs` times the default's)
    and counted GFLOPs of the epoch, at the paper scale's sizes; the time and work ratios to the
    uncompressed model's (their change: uncompressed / method - 1)."""
    rows = []
    for kind, compressed in variants.items():
        base = next(v for v in compressed if v.method == "uncompressed")
        wide = uncompressed(params, data, kind)
        models = {"uncompressed": wide} | {
            v.method: like(v, base.model, wide) for v in compressed if v.method in METHODS
        }
        steps = {
            m: step_timing.step_function(params, kind, "tensorflow", model, LAST_LAYER[kind])
            for m, model in models.items()
        }
        for batch, user, batches in costs.epochs(params, data, kind):
            timing = params.timing_steps, params.warmup_steps, params.timing_repeats
            timed = step_timing.time_interleaved(steps, batches, *timing)
            for method, model in models.items():
                seconds = timed[method][0]
                flops = costs.epoch_flops(model, LAST_LAYER[kind], batches)
                row = dict(model=MODEL_NAMES[kind], sizes=SIZES[kind], batch=batch, user=user, method=method)
                rows.append(row | dict(steps=len(batches), gflops=flops / 1e9, step_seconds=seconds))
        log(f"{MODEL_NAMES[kind]} at the paper scale's sizes ({SIZES[kind]}): {', '.join(models)} timed")
    return with_changes(pd.DataFrame(rows))


def with_changes(table: pd.DataFrame) -> pd.DataFrame:
    """`table` with each row's time and counted-work change: the same (model, batch, user)'s
    uncompressed step over the row's, minus 1 (the uncompressed rows: 0)."""
    key = ["model", "batch", "user"]
    ref = table[table.method == "uncompressed"].set_index(key)
    index = pd.MultiIndex.from_frame(table[key])
    changes = {c: ref[col].reindex(index).to_numpy() / table[col] - 1 for col, c in CHANGES.items()}
    return table.assign(**changes)


def changes(table: pd.DataFrame) -> pd.DataFrame:
    """Median over the timed users of each (model, batch, method)'s time and counted-work change."""
    compressed = table[table.method != "uncompressed"]
    return compressed.groupby(["model", "batch", "method"], as_index=False)[["time_change", "work_change"]].median()


def change_of(summary: pd.DataFrame, model: str, method: str, batch: int | None = None) -> tuple[float, float] | None:
    """(time change, work change) of `method` on `model` (at `batch`; None: the only batch), or None."""
    rows = summary[(summary.model == model) & (summary.method == method)]
    rows = rows if batch is None else rows[rows.batch == batch]
    return (float(rows.time_change.iloc[0]), float(rows.work_change.iloc[0])) if len(rows) == 1 else None
