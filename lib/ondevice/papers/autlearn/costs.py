"""What personal training costs, on this machine and on AutLearn's phones (autlearn_cost,
autlearn_availability).

On this machine: an epoch of the on-device step (the last layer trains, every step runs the whole
forward pass) per timed user, measured (steady-state step time x steps) or, where a run must
reproduce bit for bit, counted (FLOPs on the modelled CPU); on the TensorFlow path or a compiler's;
online updates with and without the inference cache; full training against fine-tuning. On the
phones, which are not here: time extrapolated from FLASH's per-layer DL4J measurements
(`device.availability`), energy modelled from a phone's power profile (`device.energy`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import tf_keras as keras

from ondevice import streams
from ondevice.data import per_user_text
from ondevice.device import availability as av
from ondevice.device.device_profile import extrapolate_seconds
from ondevice.device.energy import profiles
from ondevice.device.energy.base import MODELLED
from ondevice.device.energy.modelled import ModelledMeter
from ondevice.device.energy.workload import step_flops
from ondevice.models import svd_compression
from ondevice.papers.autlearn import online_learning, protocol, step_timing
from ondevice.papers.autlearn.common import MODEL_NAMES
from ondevice.papers.autlearn.techniques import pruning
from ondevice.papers.autlearn.techniques.compiler import quiet_tracing
from ondevice.tasks import typing_protocol
from ondevice.tasks.next_word import NextWordTask
from ondevice.training.fine_tune import FineTune
from ondevice.training.trainer import Trainer, seed_everything

CACHE = ("without cache", "with cache")


# ---- AutLearn's on-device step on this machine (autlearn_cost) -----------------------------------
# `data.timed(kind)` gives the timed users of a model kind and their training parts; `variants` maps
# each kind to its `compression.Compressed` models, the uncompressed one first.


def counted_seconds(params, flops: float) -> float:
    """Busy seconds of counted work on the modelled CPU at its reference (top) speed."""
    return flops / (params.flops_per_cycle * params.governor_model().ref_khz * 1e3)


def epoch_flops(model: keras.Model, head: str, batches: list, cached: bool = False) -> float:
    """Counted FLOPs of training `head` on `batches` (positions for the LSTM, images for MobileNet):
    the whole forward pass and the head's gradient, or, from the inference cache, the head's forward
    pass and gradient alone; and Adam's ~12 operations per trained parameter."""
    layer = model.get_layer(head)
    trained = sum(int(np.prod(w.shape)) for w in layer.trainable_weights)
    samples = [int(np.asarray(x).size if np.ndim(x) == 2 else len(x)) for x, _ in batches]
    if cached:
        return float(sum(n * 2 * pruning.layer_flops(layer) + 12.0 * trained for n in samples))
    return float(sum(pruning.last_layer_train_flops(model, head, n) for n in samples))


def batch_sizes(params, kind: str) -> tuple[int, ...]:
    return (params.text_personal_batch_size,) if kind == "text" else params.image_batch_sizes


def epochs(params, data, kind: str):
    """(batch size, user, batches) of one personal epoch per timed user and batch size: every
    variant and path is timed on the same batches."""
    users, train = data.timed(kind)
    for batch in batch_sizes(params, kind):
        for user in users:
            rng = streams.rng(params.seed, f"autlearn-cost/epoch/{user}")
            yield batch, user, protocol.batches(params, kind, train[user], batch, rng)


def _time(params, steps: dict, batches: list) -> dict[str, tuple[float, int]]:
    return step_timing.time_interleaved(steps, batches, params.timing_steps, params.warmup_steps, params.timing_repeats)


def time_epochs(params, data, variants: dict, log=print) -> pd.DataFrame:
    """Per model, batch size, timed user and compression: one personal epoch of last-layer training
    on the TensorFlow path, in seconds (measured: mean steady step x steps, the compressions' passes
    interleaved on each user's batches, `step_timing.time_interleaved`; counted: FLOPs on the
    modelled CPU), with its counted GFLOPs beside it."""
    rows, measured = [], params.time_source == "measured"
    with quiet_tracing():
        for kind, compressed in variants.items():
            steps = {}
            for v in compressed if measured else ():
                steps[v.method] = step_timing.step_function(params, kind, "tensorflow", v.model, v.head)
            for batch, user, batches in epochs(params, data, kind):
                timed = _time(params, steps, batches) if measured else {}
                for v in compressed:
                    flops = epoch_flops(v.model, v.head, batches)
                    per_step, n = timed.get(v.method, (0.0, 0))
                    seconds = per_step * len(batches) if measured else counted_seconds(params, flops)
                    row = dict(model=MODEL_NAMES[kind], batch=batch, user=user, method=v.method, steps=len(batches))
                    rows.append(row | dict(gflops=flops / 1e9, steps_timed=n, epoch_seconds=seconds))
            sizes = ", ".join(map(str, batch_sizes(params, kind)))
            methods = ", ".join(v.method for v in compressed)
            log(f"{MODEL_NAMES[kind]} ({methods}): {len(data.timed(kind)[0])} users timed at batch {sizes}")
    return pd.DataFrame(rows)


def compiler(params, data, variants: dict, log=print) -> pd.DataFrame:
    """Per model, batch size and timed user: the uncompressed model's epoch on each of
    `compiler_paths`, each path's step made from the same weights, their passes interleaved on each
    user's batches; always measured (compilers change time, not FLOPs)."""
    rows = []
    with quiet_tracing():
        for kind, (base, *_) in variants.items():
            start, steps = base.model.get_weights(), {}
            for path in params.compiler_paths:
                base.model.set_weights(start)
                steps[path] = step_timing.step_function(params, kind, path, base.model, base.head)
            for batch, user, batches in epochs(params, data, kind):
                for path, (per_step, timed) in _time(params, steps, batches).items():
                    row = dict(model=MODEL_NAMES[kind], batch=batch, user=user, path=path, steps=len(batches))
                    rows.append(row | dict(epoch_time_seconds=per_step * len(batches), steps_timed_time=timed))
            log(f"{MODEL_NAMES[kind]} on {', '.join(params.compiler_paths)}: timed")
            base.model.set_weights(start)
    return pd.DataFrame(rows)


def first_step_losses(params, data, variants: dict) -> pd.DataFrame:
    """The loss of one step of the uncompressed model on each path, from the same weights on the
    same batch: they must agree."""
    rows = []
    for kind, (base, *_) in variants.items():
        start, (users, train) = base.model.get_weights(), data.timed(kind)
        rng = streams.rng(params.seed, "autlearn-cost/parity")
        batch = protocol.batches(params, kind, train[users[0]], 16, rng)[0]
        losses = {}
        for path in params.compiler_paths:
            base.model.set_weights(start)
            with quiet_tracing():
                losses[path] = step_timing.step_function(params, kind, path, base.model, base.head)(*batch)
        base.model.set_weights(start)
        for path, loss in losses.items():
            row = dict(model=MODEL_NAMES[kind], path=path, first_step_loss=loss)
            rows.append(row | dict(abs_difference=abs(loss - losses["tensorflow"])))
    return pd.DataFrame(rows)


def online(params, data, variants: dict, log=print) -> pd.DataFrame:
    """Per model and timed user: the updates of an online stream (its first `online_samples`
    samples in order, an update every `online_batch_size`) without the cache (the fine-tune step:
    a forward pass through every layer, then the head's gradient) and with it (the head's update
    from the features the prediction already computed). Inference itself is the same on both sides
    and not counted."""
    rows, measured = [], params.time_source == "measured"
    with quiet_tracing():
        for kind, (base, *_) in variants.items():
            start, (users, train) = base.model.get_weights(), data.timed(kind)
            trainer = online_learning.online_trainer(params, kind, base.model) if measured else None
            for user in users:
                batches = online_batches(params, kind, train[user])
                flops = {c: epoch_flops(base.model, base.head, batches, c == "with cache") for c in CACHE}
                if measured:
                    timing = params.timing_steps, params.warmup_steps, params.timing_repeats
                    seconds = step_timing.update_seconds(trainer, start, batches, *timing)
                else:
                    seconds = {c: counted_seconds(params, f) for c, f in flops.items()}
                for c in CACHE:
                    row = dict(model=MODEL_NAMES[kind], user=user, condition=c, updates=len(batches))
                    rows.append(row | dict(gflops=flops[c] / 1e9, update_seconds=seconds[c]))
            base.model.set_weights(start)
            log(f"{MODEL_NAMES[kind]}: online updates timed for {len(users)} users")
    return pd.DataFrame(rows)


def online_batches(params, kind: str, part) -> list:
    """The user's first `online_samples` samples in order, in batches of `online_batch_size`."""
    n = min(params.online_samples, len(part) if kind == "text" else len(part[1]))
    b = params.online_batch_size
    if kind == "text":
        return [part.padded(np.arange(i, min(i + b, n))) for i in range(0, n, b)]
    return [(part[0][i : i + b], part[1][i : i + b]) for i in range(0, n, b)]


# ---- full training against fine-tuning on this machine (autlearn_availability) -------------------


def personal_batches(params, corpus: per_user_text.Corpus, user: str) -> list:
    """One epoch of a user's personal training batches (the earlier part of the user's lines)."""
    train, _ = corpus.personal(user, params.personal_train_fraction)
    rng = streams.rng(params.seed, f"personal/{user}")
    return list(NextWordTask(params.k).batches(train, params.personal_batch_size, rng))


def host_times(params, corpus: per_user_text.Corpus, log=print) -> pd.DataFrame:
    """Per test user and variant (`full`, `fine_tune`): steps per epoch, mean padded length, and the
    host's seconds per step: the steady-state median of `timing_steps` steps after warm-up, both
    variants stepping in turn so that load from other processes hits them alike (measured), or the
    FLOPs of the user's batches at `host_gflops` (counted). Step time does not depend on the
    weights, so DeepType's freshly initialised LSTM is timed. Seconds per epoch = step x steps."""
    seed_everything(params.seed)
    model, task = typing_protocol.build_model(params, corpus, params.seed), NextWordTask(params.k)
    start, rate, optimizer = model.get_weights(), params.personal_learning_rate, params.personal_optimizer
    trainers = {
        "full": Trainer(model, task, rate, optimizer),
        "fine_tune": Trainer(model, task, rate, optimizer, hooks=[FineTune()]),
    }
    rows = []
    for user in corpus.split.test:
        batches = personal_batches(params, corpus, user)
        if params.host_time == "measured":
            for trainer in trainers.values():
                trainer.reset(start)
                trainer.timer.durations.clear()
            for n in range(trainers["full"].timer.warmup + params.timing_steps):
                x, y = batches[n % len(batches)]
                for trainer in trainers.values():
                    trainer.step(x, y)
            steps = {v: t.timer.steady() for v, t in trainers.items()}
        else:
            steps = {}
            for variant, t in trainers.items():
                flops = [
                    step_flops(model, t.variables_to_train, int(x.size), model.output_shape[-1]) for x, _ in batches
                ]
                steps[variant] = float(np.mean(flops)) / (params.host_gflops * 1e9)
        samples, lengths = int(sum(len(x) for x, _ in batches)), [x.shape[1] for x, _ in batches]
        for variant, step in steps.items():
            row = dict(user=user, variant=variant, samples=samples, steps_per_epoch=len(batches))
            row |= dict(mean_padded_length=float(np.mean(lengths)), host_step_seconds=step)
            rows.append(row | dict(host_seconds_per_epoch=step * len(batches), host_time=params.host_time))
        log(f"timed {user}: {len(batches)} steps per epoch")
    return pd.DataFrame(rows)


def fine_tune_time_ratio(host: pd.DataFrame) -> float:
    """Fine-tune / full step time: the median over users (a property of the model, not of the user;
    the median keeps a step slowed by another process from moving it)."""
    wide = host.pivot(index="user", columns="variant", values="host_step_seconds")
    return float((wide.fine_tune / wide.full).median())


# ---- on the phones: time extrapolated, energy modelled -----------------------------------------


def layer_times(phones=tuple(av.PHONES)) -> tuple[dict[str, av.LayerTimes], pd.DataFrame]:
    """Each phone's per-layer training time fitted to FLASH's measurements, and the fits' quality."""
    fits = av.load_layer_times(phones)
    return fits, pd.DataFrame([f for t in fits.values() for f in t.fit])


def phones(params, data, variants: dict, log=print):
    """autlearn_cost: the LSTM's personal epoch per timed user and compression, extrapolated to each phone
    (`last_layer_epoch_seconds`), with its ratio to the uncompressed model's; the fits' quality."""
    fits, fit_table = layer_times(params.phones)
    rows = []
    for v in variants["text"]:
        for _, user, batches in epochs(params, data, "text"):
            shapes = [np.shape(x) for x, _ in batches]
            for phone, fit in fits.items():
                seconds = last_layer_epoch_seconds(fit, v.model, shapes)
                row = dict(phone=av.PHONES[phone], method=v.method, user=user, steps=len(batches))
                rows.append(row | dict(epoch_seconds_extrapolated=seconds, label="extrapolated"))
    table = pd.DataFrame(rows)
    uncompressed = table[table.method == "uncompressed"].set_index(["phone", "user"]).epoch_seconds_extrapolated
    per_phone_user = table.set_index(["phone", "user"]).index.map(uncompressed)
    table["time_ratio_to_uncompressed"] = table.epoch_seconds_extrapolated / per_phone_user
    log(f"phones: {', '.join(av.PHONES[p] for p in fits)} (extrapolated from FLASH's measurements)")
    return table, fit_table


def phone_times(params, corpus: per_user_text.Corpus, host: pd.DataFrame, fits: dict[str, av.LayerTimes]):
    """Per test user, phone and variant: seconds per epoch on the phone, extrapolated. Full training:
    the phone's device profile (FLASH's layer times at our sizes, at the users' mean length), scaled
    to the user's steps and mean length by `extrapolate_seconds`; fine-tuning: that x the host's
    fine-tune / full step-time ratio (the phones' measurements cover full training only). Returns the
    table and the device profiles."""
    config = typing_protocol.model_config(params, corpus)
    batch, mean_length = params.personal_batch_size, float(host.mean_padded_length.mean())
    device_profiles = {phone: av.device_profile(t, config, batch, mean_length) for phone, t in fits.items()}
    ratio = {"fine_tune": fine_tune_time_ratio(host), "full": 1.0}
    host_minutes = host.set_index(["user", "variant"]).host_seconds_per_epoch / 60
    rows = []
    for r in host[host.variant == "full"].itertuples():
        for phone, profile in device_profiles.items():
            e = extrapolate_seconds(profile, r.steps_per_epoch, r.mean_padded_length)
            outside = ", ".join(fits[phone].outside_grid(config, batch, r.mean_padded_length)) or "-"
            for variant, scale in ratio.items():
                step, minutes = e["step_seconds"] * scale, e["seconds"] * scale / 60
                row = dict(user=r.user, phone=phone, variant=variant, steps_per_epoch=r.steps_per_epoch)
                row |= dict(phone_step_seconds=step, phone_minutes_per_epoch=minutes)
                row |= dict(host_minutes_per_epoch=float(host_minutes[(r.user, variant)]))
                rows.append(row | dict(outside_measured_grid=outside, label=e["label"]))
    return pd.DataFrame(rows), device_profiles


def lstm_layers(model: keras.Model) -> list[tuple[str, int, int, bool]]:
    """(FLASH layer kind, in, out, trains) per layer of an LSTM (an SVD softmax is two dense layers)."""
    out = []
    for layer in model.layers:
        if isinstance(layer, keras.layers.Embedding):
            out.append(("embedding", layer.input_dim, layer.output_dim, False))
        elif isinstance(layer, keras.layers.LSTM):
            out.append(("lstm", int(layer.input_shape[-1]), layer.units, False))
        elif isinstance(layer, keras.layers.Dense):
            out.append(("output", int(layer.input_shape[-1]), layer.units, layer.name == svd_compression.SOFTMAX))
    return out


def last_layer_epoch_seconds(fit: av.LayerTimes, model: keras.Model, shapes: list[tuple[int, int]]) -> float:
    """An LSTM's epoch of last-layer training on a phone, extrapolated: for each batch (its shape)
    the trained layer's time plus a third of each lower layer's (its forward pass: backward costs
    about twice the forward). Lengths beyond FLASH's 2-10 rest on the fit's linearity."""
    layers = lstm_layers(model)
    return sum(_layer_seconds(fit, *layer, *shape) for shape in shapes for layer in layers)


def _layer_seconds(fit: av.LayerTimes, kind: str, d: int, n: int, trains: bool, b: int, s: int) -> float:
    t = float(fit.layer_seconds(kind, d, n, b, s))
    if kind in ("embedding", "lstm"):  # upstream's minimal head is inside these times
        t -= float(fit.layer_seconds("output", n, av.HEAD_UNITS, b, s))
    return t if trains else t / 3


def modelled_energy(params, busy: dict[str, dict[str, float]]) -> pd.DataFrame:
    """Modelled energy and time of each user's busy seconds per variant (`busy[user][variant]`, at
    the profile's top speed) under each of `params.governors`, on `params.device_profile`'s power
    profile, normalised to the user's first variant on the first governor."""
    device, model = profiles.device(params.device_profile), params.governor_model()
    rows = []
    for user, seconds in busy.items():
        for governor in params.governors:
            meter = ModelledMeter(model, governor, device.nominal_voltage, device=device.name)
            for variant, b in seconds.items():
                r = meter.reading_for(b)
                row = dict(user=user, governor=governor, variant=variant, energy_j=r.joules, seconds=r.seconds)
                rows.append(row | dict(label=MODELLED, note=f"{device.name} profile, {r.note}"))
    table = pd.DataFrame(rows)
    first = (table.variant == table.variant.iloc[0]) & (table.governor == params.governors[0])
    base = table[first].set_index("user")
    table["energy_norm"] = table.energy_j / table.user.map(base.energy_j)
    table["time_norm"] = table.seconds / table.user.map(base.seconds)
    return table
