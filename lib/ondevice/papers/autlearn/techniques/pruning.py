"""AutLearn's cloud-side model compression (Sec. 3.5): structured magnitude pruning, searched.

This is the paper's argmax Accuracy(Model) s.t. Resource(Model) < Budget, the resource budget
lowered each round by a step (`search`'s `step` x the uncompressed model's FLOPs; NetAdapt's
schedule): every candidate layer (a convolution, a fully connected or an LSTM layer, or the
embedding; the paper treats an FC unit as a 1x1 filter) removes the fewest filters or units of
smallest L2 norm that meet the round's budget (`units_for`), so the candidates are compared at
equal resource, and the one whose pruned model scores best on the selection hold-out is re-trained
(in the cloud, on public data, to a plateau of that hold-out) and judged on the held-out data of
the accuracy budget, from the uncompressed model re-trained as many epochs (`retraining`). A
candidate outside the budget is not kept and the round's next one is tried; the rounds go on until
no candidate stays within the budget, with no round cap. Resource is counted FLOPs
(`forward_flops`); the paper measured phones, which we do not have.

Removing a unit really shrinks the model (`prune`): the layer loses the unit's kernel columns
(an LSTM loses the unit's column in each of its four gates and its recurrent row), per-channel
layers behind it (batch normalisation, depthwise convolution) lose the channel, and the next
weighted layer loses the matching input rows. A pruned model computes what the original does
with those units' incoming weights zeroed (exactly for Dense, LSTM and Embedding chains; behind
a convolution, a per-channel offset on the removed channel, a BN shift or a depthwise bias, is a
constant that goes too: the re-training absorbs it).

The unstructured alternative is `magnitude_pruning`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable

import numpy as np
import tensorflow as tf
import tf_keras as keras

PRUNABLE = (keras.layers.Dense, keras.layers.Conv2D, keras.layers.LSTM, keras.layers.Embedding)
PER_CHANNEL = (keras.layers.BatchNormalization, keras.layers.DepthwiseConv2D)
WEIGHTLESS_OK = (
    keras.layers.ReLU,
    keras.layers.Activation,
    keras.layers.Dropout,
    keras.layers.ZeroPadding2D,
    keras.layers.GlobalAveragePooling2D,
    keras.layers.GlobalMaxPooling2D,
    keras.layers.AveragePooling2D,
    keras.layers.MaxPooling2D,
    keras.layers.Reshape,
    keras.layers.Rescaling,
)


def flatten(model: keras.Model) -> keras.Model:
    """A copy of `model` with every nested sub-model that is a chain of layers (a Keras
    application used as one layer, like MobileNet's backbone) inlined, so its layers can be
    pruned; BatchNormalization layers of an inlined sub-model become non-trainable, which keeps
    them in inference mode as a sub-model called with training=False was."""
    copy = keras.models.clone_model(model)
    copy.set_weights(model.get_weights())
    tensors = {id(t): t for t in copy.inputs}
    for layer in copy.layers:
        if isinstance(layer, keras.layers.InputLayer):
            continue
        node = layer._inbound_nodes[0]
        args, kwargs = [
            tf.nest.map_structure(lambda t: tensors[id(t)] if id(t) in tensors else t, a)
            for a in (node.call_args, node.call_kwargs)
        ]
        if isinstance(layer, keras.Model):
            x = args[0]
            previous = layer.layers[0]
            for sub in layer.layers[1:]:
                inbound = [n.inbound_layers for n in sub._inbound_nodes]
                if len(inbound) != 1 or inbound[0] is not previous:
                    raise ValueError(f"cannot inline {layer.name}: {sub.name} does not follow {previous.name}")
                if isinstance(sub, keras.layers.BatchNormalization):
                    sub.trainable = False
                x, previous = sub(x), sub
            out = x
        else:
            out = layer(*args, **kwargs)
        for before, after in zip(tf.nest.flatten(node.outputs), tf.nest.flatten(out)):
            tensors[id(before)] = after
    return keras.Model(
        copy.inputs,
        [tensors[id(t)] for t in copy.outputs] if len(copy.outputs) > 1 else tensors[id(copy.outputs[0])],
        name=model.name,
    )


def width(layer) -> int:
    """The number of units (filters, LSTM units, embedding dimensions) a layer outputs."""
    if isinstance(layer, keras.layers.Embedding):
        return int(layer.output_dim)
    return int(layer.filters if isinstance(layer, keras.layers.Conv2D) else layer.units)


def _gate_columns(units: int, keep: np.ndarray) -> np.ndarray:
    """Columns of an LSTM kernel that belong to the kept units, in Keras's gate order (i, f, c, o)."""
    return np.concatenate([g * units + keep for g in range(4)])


def unit_norms(layer) -> np.ndarray:
    """L2 norm of each unit's incoming weights (its filter); biases are not part of a filter."""
    if isinstance(layer, keras.layers.LSTM):
        kernel, recurrent = layer.cell.kernel.numpy(), layer.cell.recurrent_kernel.numpy()
        h = width(layer)
        both = np.concatenate([kernel, recurrent], 0)
        return np.sqrt(sum((both[:, g * h : (g + 1) * h] ** 2).sum(0) for g in range(4)))
    if isinstance(layer, keras.layers.Embedding):
        return np.linalg.norm(layer.embeddings.numpy(), axis=0)
    kernel = layer.kernel.numpy()
    return np.sqrt((kernel.reshape(-1, kernel.shape[-1]) ** 2).sum(0))


def lowest_units(layer, k: int) -> np.ndarray:
    """Indices of the k units of smallest norm (ties: the lower index first), sorted."""
    if not 0 <= k < width(layer):
        raise ValueError(f"can remove 0 to {width(layer) - 1} of {layer.name}'s {width(layer)} units, not {k}")
    return np.sort(np.argsort(unit_norms(layer), kind="stable")[:k])


def _downstream(model: keras.Model, layer) -> tuple[list, list]:
    """(layers that carry the pruned channels unchanged or per channel, weighted layers that
    consume them). Refuses merges (residuals, concatenation) and anything that mixes channels."""
    carriers, consumers, todo = [], [], [layer]
    members = {id(l) for l in model.layers}
    while todo:
        current = todo.pop()
        for node in current._outbound_nodes:
            nxt = node.outbound_layer
            if id(nxt) not in members:
                continue
            if isinstance(nxt, PRUNABLE) and not isinstance(nxt, keras.layers.Embedding):
                consumers.append(nxt)
            elif isinstance(nxt, PER_CHANNEL + WEIGHTLESS_OK):
                if isinstance(nxt, keras.layers.DepthwiseConv2D) and nxt.depth_multiplier != 1:
                    raise ValueError(f"cannot prune through {nxt.name}: depth multiplier {nxt.depth_multiplier}")
                carriers.append(nxt)
                todo.append(nxt)
            else:
                raise ValueError(
                    f"cannot prune {layer.name}: its output reaches {nxt.name} "
                    f"({type(nxt).__name__}), which is not per channel"
                )
    if not consumers:
        raise ValueError(f"{layer.name} feeds no weighted layer: it is an output and cannot lose units")
    return carriers, consumers


def candidates(model: keras.Model) -> list[str]:
    """Layers that can lose units: prunable kinds whose output feeds another weighted layer."""
    out = []
    for layer in model.layers:
        if isinstance(layer, PRUNABLE) and width(layer) > 1:
            try:
                _downstream(model, layer)
            except ValueError:
                continue
            out.append(layer.name)
    return out


def prune(model: keras.Model, layer_name: str, remove) -> keras.Model:
    """A new, smaller model without the given units (indices) of `layer_name`; `model` is unchanged."""
    layer = model.get_layer(layer_name)
    if not isinstance(layer, PRUNABLE):
        raise ValueError(f"{layer_name} is a {type(layer).__name__}; prunable: Dense, Conv2D, LSTM, Embedding")
    old = width(layer)
    remove = np.unique(np.asarray(remove, int))
    if len(remove) and (remove.min() < 0 or remove.max() >= old) or len(remove) >= old:
        raise ValueError(f"cannot remove units {remove.tolist()} of {layer_name}'s {old}")
    keep = np.setdiff1d(np.arange(old), remove)
    carriers, consumers = _downstream(model, layer)
    carrier_names = {c.name for c in carriers}

    def clone(l):
        config = l.get_config()
        if l.name == layer_name:
            key = {keras.layers.Embedding: "output_dim", keras.layers.Conv2D: "filters"}.get(type(l), "units")
            config[key] = len(keep)
        elif l.name in carrier_names and isinstance(l, keras.layers.Reshape) and config["target_shape"][-1] == old:
            config["target_shape"] = (*config["target_shape"][:-1], len(keep))
        return type(l).from_config(config)

    pruned = keras.models.clone_model(model, clone_function=clone)
    consumer_names = {c.name for c in consumers}
    for new in pruned.layers:
        weights = model.get_layer(new.name).get_weights()
        if new.name == layer_name:
            weights = _slice_outputs(new, weights, keep, old)
        elif new.name in carrier_names and weights:
            weights = [
                w[..., keep, :] if isinstance(new, keras.layers.DepthwiseConv2D) and w.ndim == 4 else w[keep]
                for w in weights
            ]
        elif new.name in consumer_names:
            kernel = weights[0]
            weights[0] = kernel[:, :, keep, :] if kernel.ndim == 4 else kernel[keep]
        new.set_weights(weights)
    return pruned


def _slice_outputs(layer, weights: list, keep: np.ndarray, old: int) -> list:
    if isinstance(layer, keras.layers.LSTM):
        cols = _gate_columns(old, keep)
        kernel, recurrent, *bias = weights
        return [kernel[:, cols], recurrent[keep][:, cols], *[b[cols] for b in bias]]
    if isinstance(layer, keras.layers.Embedding):
        return [weights[0][:, keep]]
    return [weights[0][..., keep], *[b[keep] for b in weights[1:]]]


def zero_units(model: keras.Model, layer_name: str, units) -> None:
    """Zero the incoming weights and biases of `units` in place (what `prune` removes)."""
    layer = model.get_layer(layer_name)
    weights = layer.get_weights()
    units = np.asarray(units, int)
    if isinstance(layer, keras.layers.LSTM):
        cols = _gate_columns(width(layer), units)
        weights = [np.where(np.isin(np.arange(w.shape[-1]), cols), 0, w) for w in weights]
    else:
        for w in weights:
            w[..., units] = 0
    layer.set_weights(weights)


# ---- resources ------------------------------------------------------------------------------


def parameters(model: keras.Model) -> int:
    return int(sum(int(np.prod(w.shape)) for w in model.weights))


def layer_flops(layer) -> float:
    """Forward multiply-add FLOPs (2 per MAC) of one sample (one position for sequence layers,
    whose time axis is unknown); layers without matrix products count 0."""
    if isinstance(layer, keras.layers.LSTM):
        d, h = int(layer.input_shape[-1]), width(layer)
        return 2.0 * 4 * h * (d + h)
    if isinstance(layer, keras.layers.Dense):
        return 2.0 * int(layer.input_shape[-1]) * layer.units
    if isinstance(layer, keras.layers.DepthwiseConv2D):
        _, h, w, c = layer.output_shape
        kh, kw = layer.kernel_size
        return 2.0 * h * w * kh * kw * c
    if isinstance(layer, keras.layers.Conv2D):
        _, h, w, c = layer.output_shape
        kh, kw = layer.kernel_size
        return 2.0 * h * w * kh * kw * int(layer.input_shape[-1]) * c / layer.groups
    return 0.0


def forward_flops(model: keras.Model) -> float:
    """Forward FLOPs of one sample (per position for a sequence model): the pruning's Resource."""
    return float(sum(layer_flops(layer) for layer in model.layers))


def last_layer_train_flops(model: keras.Model, head: str, samples: int) -> float:
    """FLOPs of one training step of the last layer alone over `samples` samples (positions for a
    sequence model): the whole forward pass, the head's weight gradient (as much as its forward;
    no gradient flows below it) and Adam's ~12 operations per trained parameter."""
    layer = model.get_layer(head)
    trained = sum(int(np.prod(w.shape)) for w in layer.trainable_weights)
    return samples * (forward_flops(model) + layer_flops(layer)) + 12.0 * trained


# ---- the search ---------------------------------------------------------------------------


def flops_saved(model: keras.Model, layer_name: str, k: int) -> float:
    """Forward FLOPs (`forward_flops`) that removing k of `layer_name`'s units saves, counted from the
    shapes without building the pruned model: the layer's own share (an LSTM's is quadratic in its
    units), per-channel carriers' share and the consumers' input rows."""
    layer = model.get_layer(layer_name)
    n = width(layer)
    carriers, consumers = ({x.name: x for x in found}.values() for found in _downstream(model, layer))  # each once
    if isinstance(layer, keras.layers.LSTM):
        d = int(layer.input_shape[-1])
        saved = 2.0 * 4 * (n * (d + n) - (n - k) * (d + n - k))
    else:
        saved = layer_flops(layer) * k / n
    saved += sum(layer_flops(c) * k / int(c.input_shape[-1]) for c in carriers if layer_flops(c))
    for c in consumers:
        rows = int(c.input_shape[-1]) + (width(c) if isinstance(c, keras.layers.LSTM) else 0)
        saved += layer_flops(c) * k / rows
    return saved


def units_for(model: keras.Model, layer_name: str, flops: float) -> int:
    """The fewest units of `layer_name` whose removal saves at least `flops` (0: it cannot, even
    keeping one unit); the saving grows with the units removed, so a bisection finds them."""
    low, high = 1, width(model.get_layer(layer_name)) - 1
    if high < 1 or flops_saved(model, layer_name, high) < flops:
        return 0
    while low < high:
        mid = (low + high) // 2
        low, high = (low, mid) if flops_saved(model, layer_name, mid) >= flops else (mid + 1, high)
    return low


def reachable(model: keras.Model, names, flops: float) -> float | None:
    """`flops`, halved until some layer of `names` can save it, and at least the smallest saving of
    one unit (None: no layer can lose a unit). A round's step shrinks rather than end the search."""
    able = [n for n in names if width(model.get_layer(n)) > 1]
    if not able:
        return None
    floor = min(flops_saved(model, n, 1) for n in able)
    while flops > floor and not any(units_for(model, n, flops) for n in able):
        flops /= 2
    return max(flops, floor)


@dataclass(frozen=True)
class Round:
    round: int
    layer: str
    removed: int
    width_after: int
    parameters: int
    forward_flops: float
    work_removed: float  # share of the uncompressed model's forward FLOPs
    selection_before: float  # the pruned model's selection score before re-training (chooses the layer)
    epochs: int  # re-training epochs this round kept (to the selection plateau)
    epochs_total: int  # re-training epochs of the model so far (the control's epochs)
    val_accuracy: float  # judged, after re-training
    budget_from: float  # the epoch-matched reference (`reference(epochs_total)`)
    within_budget: bool  # kept; a candidate outside is dropped and the round's next one tried


def ranked(model: keras.Model, names, flops: float, select, max_candidates: int = 0) -> tuple[float, list[tuple]]:
    """(the round's step, `reachable` from `flops`; its candidates, best first: (selection score,
    layer, k, pruned model) for every layer of `names` that saves the step by losing its k lowest-norm
    units). `max_candidates`: only that many layers with the most FLOPs of `model` (0: all). Ties keep
    `names` order; no layer able to lose a unit: (0, [])."""
    if max_candidates:
        names = sorted(names, key=lambda n: -layer_flops(model.get_layer(n)))[:max_candidates]
    step = reachable(model, names, flops)
    tried = []
    for name in names if step else ():
        if k := units_for(model, name, step):
            trial = prune(model, name, lowest_units(model.get_layer(name), k))
            tried.append((select(trial), name, k, trial))
    return step or 0.0, sorted(tried, key=lambda t: -t[0])


def search(
    model: keras.Model,
    scores: Callable[[keras.Model], tuple[float, float]],
    retrain: Callable[[keras.Model, int], int],
    *,
    step: float = 0.05,
    max_drop: float = 0.01,
    layers: list[str] | None = None,
    max_candidates: int = 0,
    reference: Callable[[int], float] | None = None,
    log=print,
) -> tuple[keras.Model, list[Round]]:
    """The paper's argmax Accuracy(Model) s.t. Resource(Model) < Budget, the budget lowered each round
    by `step` x the uncompressed model's forward FLOPs (no round cap: the accuracy budget ends it).

    `scores(model)`: (judged top-1, selection top-1); `retrain(model, epochs_so_far)` re-trains in place
    and returns the epochs it kept; `reference(epochs)`: the accuracy a model re-trained that many
    epochs in all is judged from (default: the uncompressed model's judged top-1). Each round every
    candidate layer (`ranked`) loses as many lowest-norm units as the step needs; the best by selection
    score is re-trained and judged; outside `max_drop` of its reference it is not kept and the next
    candidate is tried. A step no layer can save is halved (`reachable`). The search stops when no
    candidate of a round stays within the budget or no layer can lose a unit. Returns the last kept
    model (`model` itself when none) and every re-trained candidate."""
    if not 0 < step < 1 or max_drop < 0:
        raise ValueError(f"need 0 < step < 1 and max_drop >= 0; got {step}, {max_drop}")
    if reference is None:
        base_judged = scores(model)[0]
        reference = lambda epochs: base_judged
    original, best, total, rounds = forward_flops(model), model, 0, []
    names = layers if layers is not None else candidates(model)
    for r in itertools.count(1):
        select = lambda m: scores(m)[1]
        need, tried = ranked(best, names, step * original, select, max_candidates)
        if not tried:
            log(f"pruning round {r}: no layer can lose a unit: stop")
            break
        kept = None
        for before, name, k, trial in tried:
            epochs = retrain(trial, total)
            acc, ref = scores(trial)[0], reference(total + epochs)
            ok, flops = acc >= ref - max_drop, forward_flops(trial)
            after = width(trial.get_layer(name))
            shape = (r, name, k, after, parameters(trial), flops, 1 - flops / original, before)
            rounds.append(Round(*shape, epochs, total + epochs, acc, ref, ok))
            log(
                f"pruning round {r} (step {need / original:.1%}): {name} -{k} -> {after} units "
                f"({1 - flops / original:.0%} of the work removed), "
                f"{epochs} re-training epoch(s), accuracy {acc:.4f} (budget from {ref:.4f})"
                f"{'' if ok else ', over the budget: not kept'}"
            )
            if ok:
                kept = trial, total + epochs
                break
        if kept is None:
            break
        best, total = kept
    return best, rounds
