"""DeepType's method, once: how a personal model is trained on the phone (Sec. 4.1, incremental
training). Every DeepType experiment (accuracy, personal data, on-device optimisations, online,
energy) builds its personal or online trainer here, from the personal fields of its parameters
(`personal_optimizer`, `personal_learning_rate`, `personal_epochs`, `personal_batch_size`), never
from the global model's `optimizer`: changing the global regime must not move a personal result.
A configuration chosen on validation users (`select`) is a labelled deviation from the paper's.
A user's online batches, as the keyboard feeds them and as `export` writes them, are here too.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from ondevice import streams
from ondevice.tasks.next_word import NextWordTask
from ondevice.training import selection
from ondevice.training.inference_reuse import OnlineTrainer
from ondevice.training.many_users import ManyUsers
from ondevice.training.step import Hook
from ondevice.training.trainer import History, Plateau, Trainer

# A personal configuration (as `selection` names it) and the parameter fields that hold it.
FIELDS = {"optimizer": "personal_optimizer", "learning_rate": "personal_learning_rate", "epochs": "personal_epochs"}


def personal_trainer(params, model, task, hooks: Sequence[Hook] = (), warmup_steps: int = 5) -> Trainer:
    """The on-device trainer of a DeepType experiment: the personal optimizer at the personal rate."""
    rate, optimizer, clip = params.personal_learning_rate, params.personal_optimizer, params.personal_clip_norm
    return Trainer(model, task, rate, optimizer, hooks, clip, warmup_steps=warmup_steps)


def online_trainer(params, model, task, reuse: bool = True):
    """The online trainer (Sec. 5.4-5.5): with `reuse`, the softmax alone trains from the features
    the suggestion's inference cached (`training.inference_reuse`); else every layer trains."""
    if not reuse:
        return personal_trainer(params, model, task)
    rate, optimizer, clip = params.personal_learning_rate, params.personal_optimizer, params.personal_clip_norm
    return OnlineTrainer(model, task, rate, optimizer, clip_norm=clip)


def personalize(
    trainer: Trainer,
    global_weights: list[np.ndarray],
    data,
    params,
    rng: np.random.Generator,
    evaluate=None,
    log=None,
    label: str = "",
    held=None,
    schedule=None,
) -> History:
    """Incremental training: start from the global weights with a fresh optimizer state and train
    on the user's data at `personal_batch_size`. With `held` (the last part of the user's training
    lines, `Corpus.personal_parts`), up to `personal_epochs` until its loss has not fallen for
    `personal_patience` epochs; the epoch with the lowest loss is kept, the start (epoch 0, the
    global weights) included. Without, exactly `personal_epochs`. `evaluate` adds its own values to
    every epoch's row. `schedule(epoch)` sets each epoch's rate (`step_size`); None: `personal_learning_rate`."""
    trainer.reset(global_weights)
    args = (params.personal_epochs, params.personal_batch_size, rng, log, label)
    if held is None:
        return trainer.fit(data, *args, evaluate, schedule=schedule)
    task = trainer.task

    def scored(model) -> dict:
        loss = float(np.log(task.evaluate(model, held)["perplexity"]))
        return {"holdout_loss": loss, **(evaluate(model) if evaluate else {})}

    stop, start = Plateau(params.personal_patience, 0.0), scored(trainer.model)
    history = trainer.fit(data, *args, scored, stop, schedule=schedule)
    if _with_start(history, start):
        trainer.model.set_weights(global_weights)
    return history


def _with_start(history: History, start: dict) -> bool:
    """Row 0 (the global model's scores) put first; True when no epoch's hold-out loss beat it, so
    the global model stays (`best_epoch` 0)."""
    kept = history[history.best_epoch - 1]["holdout_loss"] if history else np.inf
    stays = start["holdout_loss"] <= kept
    if stays:
        history.best_epoch = 0
    history.insert(0, {"epoch": 0, "loss": float("nan"), "steps": 0, "seconds": 0.0, **start})
    return stays


def personalize_together(
    many: ManyUsers, global_weights, data: list, params, rngs: list, held: list, schedule=None
) -> list[History]:
    """`personalize` (with a hold-out) of K users at once on `many` (`training.many_users`): user k
    trains on `data[k]` with `rngs[k]` and stops on `held[k]`; each user's rows and kept weights are
    those `personalize` gives it alone, to float32 rounding (`tests/test_many_users.py`)."""
    many.reset(global_weights)
    model = many.model

    def scored(k, m) -> dict:
        return {"holdout_loss": float(np.log(many.task.evaluate(m, held[k])["perplexity"]))}

    model.set_weights(global_weights)
    starts = [scored(k, model) for k in range(len(data))]
    stop, args = Plateau(params.personal_patience, 0.0), (params.personal_epochs, params.personal_batch_size)
    histories = many.fit(data, *args, rngs, scored, stop, schedule=schedule)
    for k, (history, start) in enumerate(zip(histories, starts)):
        if _with_start(history, start):
            many.set_user_weights(k, global_weights)
    return histories


def group_jobs(seeds, users: list, n: int, fn, data: Callable) -> list:
    """`engine` jobs of `fn(seed, users, data)` for every seed and group of `n` users (in order); a
    one-user job keeps the key it has always had (`seed=S/user=U`), so earlier runs resume."""
    from ondevice import engine

    groups = [(s, list(users[i : i + n])) for s in seeds for i in range(0, len(users), n)]
    key = lambda s, g: f"seed={s}/user{'s' * (n > 1)}={'+'.join(g)}"  # noqa: E731
    return [engine.Job(key(s, g), fn, dict(seed=s, users=g, data=[data(u) for u in g])) for s, g in groups]


def log_users(rows: list[dict], log) -> None:
    """One line per seed and user of `rows` (in order): its personal words and each condition's top-k-eff."""
    for (seed, user, words), got in itertools.groupby(rows, lambda r: (r["seed"], r["user"], r["train_words"])):
        log(
            f"seed={seed}/user={user} ({words} personal words): "
            + ", ".join(f"{r['condition']} {r['top_k_eff']:.3f}" for r in got)
        )


def config(params) -> dict:
    """The personal configuration of `params`: optimizer, learning rate and epochs."""
    return {k: getattr(params, field) for k, field in FIELDS.items()}


def validation_choice(params):
    """`params` with the personal optimizer and rate of its `also_*` fields: the validation users'
    choice, which the online and personal-data notebooks run beside the paper's configuration. Their
    Adam 3e-4 is the top-3-eff selection (tables/selection.csv) on an earlier training of the crowd
    model (one epoch, +0.4% on validation users); on a retrained one (same code, another machine) it
    chose Adam 3e-5 for 4 epochs (+0.3%), with every Adam setting up to 3e-4 within 0.7% of the
    global model there: small steps tie, and the step size, not the exact choice, sets the sign."""
    change = {"personal_optimizer": params.also_optimizer, "personal_learning_rate": params.also_learning_rate}
    return dataclasses.replace(params, **change)


def with_config(params, chosen: dict):
    """`params` with another personal configuration (e.g. one chosen on validation users)."""
    return dataclasses.replace(params, **{field: chosen[k] for k, field in FIELDS.items()})


class Personal:
    """Personal training of one model under any personal configuration: a protocol trainer per
    optimizer and rate (compiled once, reset per user), scored on a user's later lines after the
    last epoch (or each), with how far the softmax rows of typed and of untyped words moved."""

    def __init__(self, params, model):
        self.model, self.task, self._trainers = model, NextWordTask(params.k, loss_per=params.personal_loss_per), {}
        self._together: dict[tuple, ManyUsers] = {}
        self._softmax = [i for i, w in enumerate(model.weights) if w.name.startswith("softmax") and "kernel" in w.name][
            0
        ]

    def trainer(self, params) -> Trainer:
        key = (params.personal_optimizer, params.personal_learning_rate, params.personal_clip_norm)
        if key not in self._trainers:
            self._trainers[key] = personal_trainer(params, self.model, self.task)
        return self._trainers[key]

    def score(self, model, test) -> dict:
        r = self.task.evaluate(model, test)
        return {"top_k_eff": r["top_k_eff"], "perplexity": r["perplexity"], "_chars": r["chars_needed"]}

    def score_weights(self, weights: list[np.ndarray], test) -> dict:
        self.model.set_weights(weights)
        return self.score(self.model, test)

    def together(self, params, users: int) -> ManyUsers:
        """`users` users trained at once under the personal configuration (`training.many_users`)."""
        key = (params.personal_optimizer, params.personal_learning_rate, params.personal_clip_norm, users)
        if key not in self._together:
            self._together[key] = ManyUsers(self.model, self.task, users, key[1], key[0], key[2])
        return self._together[key]

    def shifts(self, train, start) -> Callable:
        """model -> the mean relative shift of the softmax rows of words typed in `train` and of the others."""
        w0 = start[self._softmax]
        seen = np.setdiff1d(np.unique(train.labels), [0, 1])
        rows = {"seen": seen, "unseen": np.setdiff1d(np.arange(2, w0.shape[1]), seen)}

        def shifts(model) -> dict:
            shift = np.linalg.norm(model.get_weights()[self._softmax] - w0, axis=0) / np.linalg.norm(w0, axis=0)
            return {f"{k}_row_shift": float(shift[i].mean()) if len(i) else math.nan for k, i in rows.items()}

        return shifts

    def train(self, data, start, params, rng, each_epoch: bool = False, held=None, schedule=None) -> list[dict]:
        """`personalize` from `start` on a user's (train, test), with `held` stopping it: the
        scores on the test lines, the steps to the epoch kept (`kept_epoch`) and all steps run
        (`steps_run`), the seconds, the mean relative shift of the softmax rows (typed or not) and
        the hold-out loss per epoch (`_curve`). With `each_epoch` (no `held`), one such row per epoch.
        `schedule`: each epoch's learning rate (`step_size`), else the constant personal rate."""
        (train, test), shifts = data, self.shifts(data[0], start)
        each = (lambda model: {**self.score(model, test), **shifts(model)}) if each_epoch else None
        history = personalize(self.trainer(params), start, train, params, rng, each, held=held, schedule=schedule)
        if each_epoch:
            return [h for h in _cumulative(history) if h["epoch"] > 0]
        return [self.result(history, self.trainer(params).model, test, shifts, held is not None)]

    def train_together(self, data: list, start, params, rngs: list, held: list, schedule=None) -> list[dict]:
        """`train` (with a hold-out) of several users at once: user k on `data[k]` (train, test) with
        `rngs[k]` and `held[k]`; one result per user, as `train` gives it to float32 rounding."""
        many = self.together(params, len(data))
        fits = [train for train, _ in data]
        histories = personalize_together(many, start, fits, params, rngs, held, schedule)
        results = []
        for k, (history, (train, test)) in enumerate(zip(histories, data)):
            self.model.set_weights(many.user_weights(k))
            results.append([self.result(history, self.model, test, self.shifts(train, start), True)])
        return results

    def train_users(self, data: list, start, params, rngs: list, schedule=None) -> list[dict]:
        """One `train` row per user of `data` ((train, held, test) each, from `start`): trained
        together when there are several and each has a hold-out, else one at a time."""
        if len(data) > 1 and all(held is not None for _, held, _ in data):
            fits, held = [(train, test) for train, _, test in data], [held for _, held, _ in data]
            return [r[0] for r in self.train_together(fits, start, params, rngs, held, schedule)]
        return [self.train((f, t), start, params, r, held=h, schedule=schedule)[0] for (f, h, t), r in zip(data, rngs)]

    def result(self, history: History, model, test, shifts, held: bool) -> dict:
        """A personalized model's row: test scores, shifts, steps to the epoch kept and run, seconds."""
        done = _cumulative(history)
        kept = history.best_epoch if held else done[-1]["epoch"]
        curve = [h["holdout_loss"] for h in done] if held else []
        last, at_kept = done[-1], next(h for h in done if h["epoch"] == kept)
        return {
            **self.score(model, test),
            **shifts(model),
            "steps": at_kept["steps"],
            "steps_run": last["steps"],
            "kept_epoch": kept,
            "personal_train_seconds": last["personal_train_seconds"],
            "_curve": curve,
        }


def _cumulative(history: History) -> list[dict]:
    """The rows with steps and seconds counted from the start of personal training."""
    steps, seconds = np.cumsum([h["steps"] for h in history]), np.cumsum([h["seconds"] for h in history])
    return [{**h, "steps": int(n), "personal_train_seconds": float(s)} for h, n, s in zip(history, steps, seconds)]


def select(params, personal: Personal, start: list[np.ndarray], data: dict, candidates: list[tuple], log=print):
    """The configuration (optimizer, rate, epochs up to `personal_epochs`) with the best median
    relative gain of top-k-eff over the users of `data` (user -> (train, test)) from `start`; the
    table holds every candidate's gain and how far the softmax rows moved."""
    base = {u: personal.score_weights(start, d[1])["top_k_eff"] for u, d in data.items()}
    rows = {}
    for opt, lr in candidates:
        p = with_config(params, {"optimizer": opt, "learning_rate": lr, "epochs": params.personal_epochs})
        runs = {
            u: personal.train(d, start, p, streams.rng(params.seed, f"selection/{u}"), True) for u, d in data.items()
        }
        for e in range(params.personal_epochs):
            at = {u: r[e] for u, r in runs.items()}
            gain = float(np.median([r["top_k_eff"] / base[u] - 1 for u, r in at.items()]))
            shift = {
                f"{k}_row_shift": float(np.median([r[f"{k}_row_shift"] for r in at.values()]))
                for k in ("unseen", "seen")
            }
            rows[opt, lr, e + 1] = {"median_gain_on_validation_users": gain, **shift}
    configs = [dict(zip(FIELDS, key)) for key in rows]
    best, table = selection.select(configs, lambda c: rows[tuple(c.values())]["median_gain_on_validation_users"], log)
    extra = pd.DataFrame(list(rows.values())).drop(columns="median_gain_on_validation_users")
    table = pd.concat([table.rename(columns={"score": "median_gain_on_validation_users"}), extra], axis=1)
    return best, table.assign(paper_config=[c == config(params) for c in configs])


def user_batches(samples, batch_size: int) -> dict[str, np.ndarray]:
    """A user's samples in typing order, cut into online batches of `batch_size` (the last partial
    batch is dropped, as a keyboard trains only once its buffer is full), padded to one shape."""
    n = len(samples) // batch_size
    if n == 0:
        raise ValueError(f"the user has {len(samples)} samples, fewer than one batch of {batch_size}")
    padded = [samples.padded(np.arange(i * batch_size, (i + 1) * batch_size)) for i in range(n)]
    tokens = np.zeros((n, batch_size, max(x.shape[1] for x, _ in padded)), np.int32)
    labels = np.zeros_like(tokens)
    for i, (x, y) in enumerate(padded):
        tokens[i, :, : x.shape[1]], labels[i, :, : y.shape[1]] = x, y
    return {"tokens": tokens, "labels": labels, "lengths": np.array([x.shape[1] for x, _ in padded], np.int32)}


def online_batches(samples, batch_size: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """`user_batches` as the keyboard feeds them: each batch cut to its own length."""
    data = user_batches(samples, batch_size)
    return [(data["tokens"][i, :, :n], data["labels"][i, :, :n]) for i, n in enumerate(data["lengths"])]
