"""A complete, small experiment to copy: per-user models of handwritten digits (scikit-learn's
bundled set, split into toy "users" at random: a stand-in for a paper's users) trained by the
paper's protocol (`protocol.train_user`), beside the simplest baseline (each user's most frequent
class), judged against the paper's claim with a paired interval over users.

Stages, one per notebook section: `load`, `train_users`, `conclude`; `run` calls them all."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
import tf_keras as keras

from ondevice import streams
from ondevice.data import digits
from ondevice.papers._template import protocol
from ondevice.params import Params as BaseParams
from ondevice.params import presets
from ondevice.report import facts, record
from ondevice.report.conclusion import Conclusion
from ondevice.tasks.classification import ClassificationTask
from ondevice.training.trainer import Trainer, seed_everything

NAME = "template_example"
PAPER = facts.paper(NAME, in_paper=__name__.split(".")[2])  # this paper's paper.toml
STAND_IN = "the paper's users: scikit-learn's digits split into random toy users"
PERSONAL, BASELINE = "accuracy, personal model", "accuracy, most frequent class"


@dataclass(frozen=True)
class Params(BaseParams):
    users: int = 20  # toy users, each a random disjoint share of the digits
    test_fraction: float = 0.3  # of each user's samples, for the test
    holdout_fraction: float = 0.2  # of each user's training samples, deciding when training stops
    hidden_units: int = 32
    epochs: int = 50  # at most: training stops at a plateau of the held-out loss
    patience: int = 3
    batch_size: int = 16
    learning_rate: float = 0.01
    bootstrap: int = 2000

    PRESETS = presets({"smoke": dict(users=4, epochs=5, bootstrap=200), "default": {}, "paper": {}})

    def check(self) -> None:
        for name in ("users", "hidden_units", "epochs", "patience", "batch_size"):
            self.require(getattr(self, name) >= 1, name, "must be at least 1")
        self.require(self.users >= 2, "users", "must be at least 2 (an effect is paired over users)")
        for name in ("test_fraction", "holdout_fraction"):
            self.require(0 < getattr(self, name) < 1, name, "must be in (0, 1)")
        self.require(self.learning_rate > 0, "learning_rate", "must be positive")


def load(params: Params) -> dict[str, dict]:
    """Each toy user's (train, held-out, test) arrays; the shares depend on the seed only."""
    x, y = digits.load()
    x = x.reshape(len(x), -1)
    order = streams.rng(params.seed, "users").permutation(len(x))
    users = {}
    for u, idx in enumerate(np.array_split(order, params.users)):
        n_test = max(1, int(params.test_fraction * len(idx)))
        train, test = idx[:-n_test], idx[-n_test:]
        n_held = max(1, int(params.holdout_fraction * len(train)))
        parts = {"train": train[:-n_held], "held": train[-n_held:], "test": test}
        users[f"user{u:02d}"] = {k: (x[i], y[i].astype(np.int32)) for k, i in parts.items()}
    return users


def train_users(params: Params, users: dict[str, dict], log=print) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per user: the personal model (from one shared initialisation) and the baseline, scored on
    the user's test part; and each personal model's training curve."""
    seed_everything(params.seed)
    task = ClassificationTask((64,), 10)
    model = keras.Sequential([keras.layers.Dense(params.hidden_units, activation="relu"), keras.layers.Dense(10)])
    model.build((None, 64))
    trainer, start = Trainer(model, task, params.learning_rate, "adam"), model.get_weights()
    rows, curves = [], []
    for user, d in users.items():
        history = protocol.train_user(trainer, start, d["train"], d["held"], params, streams.rng(params.seed, user))
        frequent = np.bincount(d["train"][1], minlength=10).argmax()
        rows.append(
            {
                "user": user,
                "train_samples": len(d["train"][1]),
                "test_samples": len(d["test"][1]),
                "best_epoch": history.best_epoch,
                PERSONAL: task.evaluate(model, d["test"])["accuracy"],
                BASELINE: float(np.mean(d["test"][1] == frequent)),
            }
        )
        curves += [
            {"user": user, "epoch": h["epoch"], "loss": h["loss"], "holdout_loss": h["holdout_loss"]} for h in history
        ]
        log(f"{user}: best epoch {history.best_epoch}, accuracy {rows[-1][PERSONAL]:.3f}")
    return pd.DataFrame(rows), pd.DataFrame(curves)


def conclude(params: Params, per_user: pd.DataFrame, curves: pd.DataFrame, wall_time_s: float) -> record.Result:
    """Headline numbers, the paper's beside ours, and the claimed effect with its interval."""
    wide = {q: per_user[q].to_numpy(float)[None, :] for q in (PERSONAL, BASELINE)}  # (seeds, users)
    c = Conclusion(NAME, params, PAPER)
    c.headlines({q: [np.mean(v)] for q, v in wide.items()})
    measured = {e.claim: (wide[e.better], wide[e.worse]) for e in PAPER.effects}
    c.effects(measured, streams.rng(params.seed, "bootstrap"), n_boot=params.bootstrap, statistic="mean")
    c.paper_vs_ours()
    return c.result({"users": per_user, "curves": curves}, [digits.summary(STAND_IN)], STAND_IN, wall_time_s)


def run(params: Params, log=print) -> record.Result:
    """All stages in order, as the notebook runs them."""
    start = time.perf_counter()
    per_user, curves = train_users(params, load(params), log)
    return conclude(params, per_user, curves, time.perf_counter() - start)
