"""The inference cache read two ways (autlearn_cost).

Sec. 4.3: the cache saves 30-40% of an online update's time "because the forward inference is saved
and only back-propagation is needed". Our step trains the last layer alone, and TensorFlow computes
that layer's gradient only, so the forward pass is nearly all of an update's work and the cache
saves nearly all of it (MobileNet: 99% of the counted work). A saving of 30-40% says that the
back-propagation is 60-70% of the paper's update, as in a step that back-propagates through every
layer (a framework computing each layer's gradient, then updating only the unfrozen ones). That
second reading is measured here: on each timed user's online batches, that step (the gradient of
every trainable weight; the last layer updated) against the forward pass alone, their passes
interleaved (`step_timing.time_interleaved`). With the cache, the update is that step without its
forward pass: estimated as the step's time less the forward pass's, both measured.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import tensorflow as tf

from ondevice.papers.autlearn import costs, step_timing
from ondevice.papers.autlearn.common import LAST_LAYER, MODEL_NAMES
from ondevice.papers.autlearn.protocol import setting, task
from ondevice.training.step import make_optimizer

CLAIMS = {"LSTM": "the inference cache shortens online updates (LSTM)"}
CLAIMS["MobileNet"] = "the inference cache shortens online updates (MobileNet)"


def full_backward_step(params, kind: str, model, head: str):
    """(x, y) -> loss: every trainable weight's gradient computed (the gradients are the function's
    outputs, so none is pruned from the graph), the last layer's applied by the on-device optimizer."""
    s, the_task = setting(params, kind), task(params, kind)
    optimizer, head_vars = make_optimizer(s.optimizer, s.learning_rate), model.get_layer(head).trainable_variables
    ids = {id(v) for v in head_vars}

    @tf.function(reduce_retracing=True)
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = the_task.loss(y, model(x, training=False))
        variables = model.trainable_variables
        grads = tape.gradient(loss, variables)
        optimizer.apply_gradients([(g, v) for g, v in zip(grads, variables) if id(v) in ids])
        return loss, grads

    return lambda x, y: float(step(x, y)[0])


def forward(model):
    """(x, y) -> None: the forward pass alone, as the prediction runs it (its logits are not copied out)."""
    call = tf.function(lambda x: model(x, training=False), reduce_retracing=True)

    def run(x, y):
        call(x)

    return run


def measure(params, data, variants: dict, log=print) -> pd.DataFrame:
    """Per model and timed user: milliseconds per online update of the forward pass, the head-only
    step (ours) and the step back-propagating through every layer, interleaved; and the cache's
    change under the second reading (the step over the step less the forward pass, minus 1). The
    models' weights are left as they were."""
    rows = []
    for kind, (base, *_) in variants.items():
        start, (users, train) = base.model.get_weights(), data.timed(kind)
        steps = {"forward": forward(base.model)}
        steps["head-only step"] = step_timing.step_function(params, kind, "tensorflow", base.model, base.head)
        steps["full backward step"] = full_backward_step(params, kind, base.model, LAST_LAYER[kind])
        for user in users:
            batches = costs.online_batches(params, kind, train[user])
            timing = params.timing_steps, params.warmup_steps, params.timing_repeats
            ms = {name: t[0] * 1e3 for name, t in step_timing.time_interleaved(steps, batches, *timing).items()}
            full, fwd = ms["full backward step"], ms["forward"]
            row = dict(model=MODEL_NAMES[kind], user=user, updates=len(batches))
            row |= {f"{n} time ms": t for n, t in ms.items()} | dict(forward_share_of_time=fwd / full)
            rows.append(row | dict(cache_time_change_full_backward=full / max(full - fwd, 1e-9) - 1))
        base.model.set_weights(start)
        log(f"{MODEL_NAMES[kind]}: the cache read two ways, {len(users)} users timed")
    return pd.DataFrame(rows)


def reading(table: pd.DataFrame, model: str) -> tuple[float, float]:
    """(the cache's change under the full-backward reading, the forward pass's share of that step):
    medians over the timed users."""
    rows = table[table.model == model]
    return float(np.median(rows.cache_time_change_full_backward)), float(np.median(rows.forward_share_of_time))
