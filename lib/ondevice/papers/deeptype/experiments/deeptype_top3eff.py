"""DeepType D3 (Table 1) and D5 (Fig. 8): global models from near and far corpora, with and
without on-device personalization, and the gain per group of users.

Stand-in data: Shakespeare's plays, users = (play, role) (or any per-user text file, `corpus`).
Global models: (a) the same-corpus crowd (every role that is neither a validation nor a test
user; DeepType's "private corpora" row), (b) a far public corpus, the King James Bible (its BBC
row), (c) none (personal data only). Each test user personalises a copy on the earlier 70% of
their lines and is tested on the later 30%. The main rows follow the paper's personal training
(SGD, batch 16, 5 epochs, the global configuration otherwise); a tuned variant, chosen on
validation users only, is a labelled deviation. The control continues the global model's
training on crowd text for as many steps as each user's personal training.

The notebook calls one stage per section: `load_corpora`, `train_globals`, `select_personal`,
`personalize`, `control`, `on_device`, `conclude`; `run` calls them all.
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ondevice import engine, streams
from ondevice.device import tflite
from ondevice.metrics import top_k_eff
from ondevice.models import lstm_lm
from ondevice.report import claims, record
from ondevice.tasks.next_word import NextWordTask
from ondevice.training import selection
from ondevice.training.trainer import Trainer
from ondevice.papers.deeptype import common
from ondevice.papers.deeptype.common import Corpus, GlobalModels, load_corpus, train_global  # noqa: F401  (used by stages)

NAME = "deeptype_top3eff"

# Conditions: (global text or None, personal training: None / "paper" / "tuned" / "control")
G_CROWD, P_CROWD, CONTROL = "crowd global", "crowd global + personal", "crowd global + more crowd training"
G_FAR, P_FAR, P_ONLY = "far global", "far global + personal", "no global + personal"
P_TUNED = "crowd global + personal, tuned (deviation)"
CONDITIONS = (G_CROWD, P_CROWD, CONTROL, G_FAR, P_FAR, P_ONLY, P_TUNED)

# Our crowd is other users of the same corpus: DeepType's "private corpora" row (Kika users), not
# its Twitter row. The Bible is far from plays, as BBC news is far from keyboard text.
PAPER = claims.Paper(
    citation="Xu et al., DeepType, IMWUT 2018, Table 1 and Sec. 6.1.2 (medians over 100 users)",
    numbers=(
        claims.PaperNumber(f"top-k-eff, {G_CROWD}", 0.568, "Table 1, private corpora, no personalization"),
        claims.PaperNumber(f"top-k-eff, {P_CROWD}", 0.624, "Table 1, private corpora, personalized"),
        claims.PaperNumber(f"top-k-eff, {CONTROL}", 0.571, "Sec. 6.1.2: global model on 20M instead of 10M words"),
        claims.PaperNumber(f"top-k-eff, {G_FAR}", 0.325, "Table 1, BBC News corpora, no personalization"),
        claims.PaperNumber(f"top-k-eff, {P_FAR}", 0.508, "Table 1, BBC News corpora, personalized"),
        claims.PaperNumber(f"top-k-eff, {P_ONLY}", 0.331, "Table 1, no global model"),
    ),
    effects=(
        claims.Effect("personalization raises top-k-eff (same-corpus crowd global model)", f"top-k-eff, {P_CROWD}", f"top-k-eff, {G_CROWD}"),
        claims.Effect("personalization raises top-k-eff (far-corpus global model)", f"top-k-eff, {P_FAR}", f"top-k-eff, {G_FAR}"),
        claims.Effect("personalization beats more global training for the same steps", f"top-k-eff, {P_CROWD}", f"top-k-eff, {CONTROL}"),
        claims.Effect("personalized far-corpus model beats the un-personalized near-corpus model", f"top-k-eff, {P_FAR}", f"top-k-eff, {G_CROWD}"),
        claims.Effect("a global model beats personal data only", f"top-k-eff, {P_CROWD}", f"top-k-eff, {P_ONLY}"),
    ),
)
# D5 (Fig. 8): users grouped by their amount of text; the crowd ("private") global model.
GROUPS = ("light", "normal", "heavy")
PAPER_GROUPS = claims.Paper(
    citation="Xu et al., DeepType, IMWUT 2018, Fig. 8 and Sec. 6.1.2 (private-corpora global model)",
    numbers=(
        claims.PaperNumber("top-k-eff, light users, global", 0.515, "Fig. 8 / Sec. 6.1.2"),
        claims.PaperNumber("top-k-eff, light users, personalized", 0.572, "Fig. 8 / Sec. 6.1.2: +11.1%"),
        claims.PaperNumber("top-k-eff, heavy users, global", 0.512, "Fig. 8 / Sec. 6.1.2"),
        claims.PaperNumber("top-k-eff, heavy users, personalized", 0.627, "Fig. 8 / Sec. 6.1.2: +22.5%"),
    ),
    effects=(
        claims.Effect("personalization raises top-k-eff for light users", "top-k-eff, light users, personalized", "top-k-eff, light users, global"),
        claims.Effect("personalization raises top-k-eff for heavy users", "top-k-eff, heavy users, personalized", "top-k-eff, heavy users, global"),
    ),
)


@dataclass(frozen=True)
class Params(common.DeepTypeParams):
    sgd_lr_grid: tuple[float, ...] = (0.3, 1.0, 3.0)     # candidates tried on the validation users
    adam_lr_grid: tuple[float, ...] = (1e-4, 3e-4, 1e-3)  # (each with 1..personal_epochs epochs)
    tuned_row: bool = True           # also run the validation users' choice on the test users
    tflite_check_steps: int = 5      # personal steps run both in TF and in the exported TFLite model
    bootstrap: int = 2000            # resamples of users for the effects' intervals

    # default: the paper's personal training (SGD at 1.0, batch 16, 5 epochs) on the 20 heaviest
    # roles, one training seed. Measured on the 2-core CPU (shared with other work, so an upper
    # bound): about 65 personal steps/s, i.e. about 6.5 minutes per personalised condition for
    # the 20 users; the paper's three personalised rows plus the control and the validation grid
    # make about 25 minutes with both global models cached (plus up to about 15 minutes per
    # global model cold). The tuned row runs at paper scale only (it adds about 6.5 minutes).
    PRESETS = common.presets({
        "smoke": dict(personal_epochs=1, sgd_lr_grid=(1.0,), adam_lr_grid=(1e-3,), seeds=2,
                      tflite_check_steps=3, bootstrap=500),
        "default": dict(seeds=1, sgd_lr_grid=(0.3, 1.0), adam_lr_grid=(3e-4, 1e-3), tuned_row=False),
        "paper": dict(seeds=3),
    })

    def check(self) -> None:
        super().check()
        self.require(self.tflite_check_steps >= 0, "tflite_check_steps", "must be >= 0 (0 = skip)")
        self.require(self.bootstrap >= 100, "bootstrap", "must be at least 100 resamples")
        for name in ("sgd_lr_grid", "adam_lr_grid"):
            self.require(all(lr > 0 for lr in getattr(self, name)), name, "must hold positive rates")
        self.require(bool(self.sgd_lr_grid or self.adam_lr_grid) or not self.tuned_row, "tuned_row",
                     "needs a candidate in sgd_lr_grid or adam_lr_grid")
        self.require(self.validation_users >= 1 or not (self.sgd_lr_grid or self.adam_lr_grid), "validation_users",
                     "must be at least 1 when a learning-rate grid is given")
        self.require(self.personal_epochs >= 1, "personal_epochs", "must be at least 1 in this experiment")

    @property
    def paper_config(self) -> dict:
        return {"optimizer": self.personal_optimizer, "learning_rate": self.personal_learning_rate,
                "epochs": self.personal_epochs}


def load_corpora(params: Params, speeches=None, log=print) -> dict[str, Corpus]:
    """The users with the crowd as global text, and the same users with the Bible as global text."""
    return {"crowd": load_corpus(params, speeches, log), "far": load_corpus(params, speeches, log, global_text="bible")}


def train_globals(params: Params, corpora: dict[str, Corpus], log=print) -> dict[str, GlobalModels]:
    return {name: train_global(params, corpus, log) for name, corpus in corpora.items()}


def _softmax_index(model) -> int:
    return next(i for i, w in enumerate(model.weights) if w.name.startswith("softmax") and "kernel" in w.name)


class _Personal:
    """Personal training on one model (a global model's architecture), one trainer per optimizer
    and learning rate (each reset to the start weights with a fresh optimizer state per user)."""

    def __init__(self, params: Params, model):
        self.params, self.model = params, model
        self.task = NextWordTask(params.k)
        self._trainers: dict[tuple, Trainer] = {}
        self._softmax = _softmax_index(model)

    def trainer(self, optimizer: str, lr: float) -> Trainer:
        if (optimizer, lr) not in self._trainers:
            self._trainers[optimizer, lr] = Trainer(self.model, self.task, lr, optimizer)
        return self._trainers[optimizer, lr]

    def score(self, model, test) -> dict:
        r = self.task.evaluate(model, test)
        return {"top_k_eff": r["top_k_eff"], "perplexity": r["perplexity"], "_chars": r["chars_needed"]}

    def score_weights(self, weights: list[np.ndarray], test) -> dict:
        self.model.set_weights(weights)
        return self.score(self.model, test)

    def train(self, data, start: list[np.ndarray], optimizer: str, lr: float, epochs: int, rng,
              score_each_epoch: bool = False) -> list[dict]:
        """Train from `start` on a user's (train, test) samples; the scores after the last epoch
        (or after each), with the steps taken and how far the softmax rows moved."""
        p = self.params
        train, test = data
        trainer = self.trainer(optimizer, lr)
        trainer.reset(start)
        seen = np.setdiff1d(np.unique(train.labels), [0, 1])
        w0 = start[self._softmax]
        unseen = np.setdiff1d(np.arange(2, w0.shape[1]), seen)
        out, steps, begin = [], 0, time.perf_counter()
        for epoch in range(1, epochs + 1):
            steps += trainer.fit(train, 1, p.personal_batch_size, rng)[0]["steps"]
            if score_each_epoch or epoch == epochs:
                seconds = time.perf_counter() - begin
                shift = np.linalg.norm(trainer.model.get_weights()[self._softmax] - w0, axis=0) / np.linalg.norm(w0, axis=0)
                out.append({"epochs": epoch, "steps": steps, **self.score(trainer.model, test),
                            "seen_row_shift": float(shift[seen].mean()) if len(seen) else float("nan"),
                            "unseen_row_shift": float(shift[unseen].mean()) if len(unseen) else float("nan"),
                            "personal_train_seconds": seconds})
        return out


def select_personal(params: Params, corpora: dict[str, Corpus], models: dict[str, GlobalModels], log=print):
    """The personal optimizer, learning rate and epochs with the best median gain over the
    validation users (crowd global model of the first seed), from SGD and fresh-state Adam
    candidates; the table also holds how far the softmax rows of words a user never typed moved."""
    candidates = [("sgd", lr) for lr in params.sgd_lr_grid] + [("adam", lr) for lr in params.adam_lr_grid]
    if not candidates:
        return None, pd.DataFrame()
    personal, crowd = _Personal(params, models["crowd"].model), corpora["crowd"]
    start = models["crowd"].weights[params.seed]
    data = {u: crowd.personal(u, params.personal_train_fraction) for u in crowd.split.validation}
    base = {u: personal.score_weights(start, data[u][1])["top_k_eff"] for u in crowd.split.validation}
    runs = {}
    for opt, lr in candidates:
        runs[opt, lr] = {u: personal.train(data[u], start, opt, lr, params.personal_epochs,
                                           streams.rng(params.seed, f"selection/{u}"), score_each_epoch=True)
                         for u in crowd.split.validation}
    rows = {}
    for (opt, lr), per_user in runs.items():
        for e in range(params.personal_epochs):
            rows[opt, lr, e + 1] = {
                "median_gain_on_validation_users": float(np.median([r[e]["top_k_eff"] / base[u] - 1 for u, r in per_user.items()])),
                "unseen_row_shift": float(np.median([r[e]["unseen_row_shift"] for r in per_user.values()])),
                "seen_row_shift": float(np.median([r[e]["seen_row_shift"] for r in per_user.values()]))}
    best, table = selection.select([{"optimizer": o, "learning_rate": lr, "epochs": e} for o, lr, e in rows],
                                   lambda c: rows[c["optimizer"], c["learning_rate"], c["epochs"]]["median_gain_on_validation_users"], log)
    extra = pd.DataFrame([rows[o, lr, e] for o, lr, e in rows]).drop(columns="median_gain_on_validation_users")
    table = pd.concat([table.rename(columns={"score": "median_gain_on_validation_users"}), extra], axis=1)
    table["paper_config"] = [(o, lr, e) == (params.personal_optimizer, params.personal_learning_rate, params.personal_epochs)
                             for o, lr, e in zip(table.optimizer, table.learning_rate, table.epochs)]
    return best, table


def _row(seed, user, condition, train, test, score: dict, **extra) -> dict:
    play, _, role = user.partition("/")
    return {"seed": seed, "user": user, "play": play, "role": role, "condition": condition,
            "train_words": len(train), "test_words": len(test), "test_oov_rate": float(np.mean(test.target == 1)),
            "top_k_eff": score["top_k_eff"], "perplexity": score["perplexity"], "steps": 0,
            "seen_row_shift": float("nan"), "unseen_row_shift": float("nan"), "personal_train_seconds": 0.0,
            **{k: v for k, v in extra.items()}, "_chars": (test.word_len, score["_chars"])}


_personals: dict = {}  # per process: one model and its trainers per (params, architecture)


def _personal_for(params: Params, config: lstm_lm.LSTMConfig) -> _Personal:
    if (params, config) not in _personals:
        _personals[params, config] = _Personal(params, lstm_lm.build(config))
    return _personals[params, config]


def user_job(shared: dict, seed: int, user: str, data: dict) -> list[dict]:
    """One (seed, test user) of the personalization stage, as an engine job: each global model
    as it is and personalised with the paper's configuration (and the tuned one), and a model
    trained on the user's data alone. `data`: the user's (train, test) samples per global text;
    `shared`: the parameters, architectures, global and from-scratch weights. Every random draw
    comes from the user's own stream, so the rows do not depend on where the job runs."""
    p, tuned, rows = shared["params"], shared["tuned"], []
    paper = p.paper_config
    for name, g_name, p_name in (("crowd", G_CROWD, P_CROWD), ("far", G_FAR, P_FAR)):
        personal, (train, test) = _personal_for(p, shared["configs"][name]), data[name]
        start = shared["weights"][name][seed]
        rows.append(_row(seed, user, g_name, train, test, personal.score_weights(start, test)))
        trained = personal.train(data[name], start, paper["optimizer"], paper["learning_rate"], paper["epochs"],
                                 streams.rng(seed, f"personal/{user}"))[-1]
        rows.append(_row(seed, user, p_name, train, test, trained, **_training(trained)))
    crowd, (train, test) = _personal_for(p, shared["configs"]["crowd"]), data["crowd"]
    alone = crowd.train(data["crowd"], shared["scratch"][seed], paper["optimizer"], paper["learning_rate"],
                        paper["epochs"], streams.rng(seed, f"personal-only/{user}"))[-1]
    rows.append(_row(seed, user, P_ONLY, train, test, alone, **_training(alone)))
    if tuned is not None:
        t = crowd.train(data["crowd"], shared["weights"]["crowd"][seed], tuned["optimizer"], tuned["learning_rate"],
                        tuned["epochs"], streams.rng(seed, f"personal/{user}"))[-1]
        rows.append(_row(seed, user, P_TUNED, train, test, t, **_training(t)))
    return rows


def personalize(params: Params, corpora: dict[str, Corpus], models: dict[str, GlobalModels], tuned: dict | None,
                log=print) -> list[dict]:
    """Every seed and test user as one job on the engine (`ondevice.engine`: in this process by
    default, Dask workers with ONDEVICE_ENGINE=dask); finished users survive an interrupted run."""
    p = params
    config = common.model_config(p, corpora["crowd"])
    run_tuned = p.tuned_row and tuned is not None and tuned != p.paper_config
    shared = {"params": p, "tuned": tuned if run_tuned else None,
              "configs": {name: common.model_config(p, c) for name, c in corpora.items()},
              "weights": {name: m.weights for name, m in models.items()},
              "scratch": {seed: lstm_lm.build(config, seed=streams.tf_seed(seed, "init/personal-only")).get_weights()
                          for seed in p.seed_list}}
    test_users = corpora["crowd"].split.test
    jobs = [engine.Job(f"seed={seed}/user={user}", user_job,
                       {"seed": seed, "user": user,
                        "data": {name: c.personal(user, p.personal_train_fraction) for name, c in corpora.items()}})
            for seed in p.seed_list for user in test_users]
    results = engine.run_jobs(jobs, shared, run_dir=engine.jobs_dir(f"{NAME}-personalize"), log=log)
    for job, got in zip(jobs, results):
        log(f"{job.key} ({got[0]['train_words']} personal words): "
            + ", ".join(f"{r['condition']} {r['top_k_eff']:.3f}" for r in got))
    return [r for got in results for r in got]


def _training(trained: dict) -> dict:
    return {k: trained[k] for k in ("steps", "seen_row_shift", "unseen_row_shift", "personal_train_seconds")}


def control(params: Params, corpora: dict[str, Corpus], models: dict[str, GlobalModels], rows: list[dict], log=print) -> list[dict]:
    """The paper's control: the crowd global model trained on for as many more steps (same
    optimizer, rate and batch as personal training) on crowd text, not the user's, scored on each
    user's test part. One continuous run per seed, scored at each user's step count."""
    p, out = params, []
    personal = _Personal(p, models["crowd"].model)
    steps = {(r["seed"], r["user"]): r["steps"] for r in rows if r["condition"] == P_CROWD}
    for seed in p.seed_list:
        trainer = personal.trainer(p.personal_optimizer, p.personal_learning_rate)
        trainer.reset(models["crowd"].weights[seed])
        rng = streams.rng(seed, "control")
        batches, done = iter(()), 0
        for user in sorted(corpora["crowd"].split.test, key=lambda u: steps[seed, u]):
            while done < steps[seed, user]:
                try:
                    trainer.step(*next(batches))
                    done += 1
                except StopIteration:
                    batches = personal.task.batches(corpora["crowd"].crowd_samples, p.personal_batch_size, rng)
            train, test = corpora["crowd"].personal(user, p.personal_train_fraction)
            out.append(_row(seed, user, CONTROL, train, test, personal.score(trainer.model, test), steps=done))
        log(f"control, seed {seed}: up to {done} more steps of crowd training")
    return out


def on_device(params: Params, corpora: dict[str, Corpus], models: dict[str, GlobalModels], log=print):
    """Export the crowd global model as a trainable TFLite file and run the first test user's first
    personal steps (the paper's configuration) both in TensorFlow and through the interpreter
    (Flex delegate). It draws from its own random stream and trains copies: it changes no result."""
    if not params.tflite_check_steps:
        return None, None
    corpus = corpora["crowd"]
    train, _ = corpus.personal(corpus.split.test[0], params.personal_train_fraction)
    task = NextWordTask(params.k)
    batches = list(task.batches(train, params.personal_batch_size, streams.rng(params.seed, "diagnostics/tflite")))
    model = models["crowd"].model
    model.set_weights(models["crowd"].weights[params.seed])
    check = tflite.compare_training(model, task, params.personal_learning_rate, batches[: params.tflite_check_steps],
                                    params.personal_optimizer)
    table = pd.DataFrame({"step": range(1, len(check["tflite"]) + 1),
                          "loss_tensorflow": check["tensorflow"], "loss_tflite": check["tflite"]})
    table["abs_difference"] = (table.loss_tflite - table.loss_tensorflow).abs()
    table.attrs["max_output_difference"] = float(np.abs(check["outputs_tflite"] - check["outputs_tensorflow"]).max())
    log(f"on-device check: {len(table)} personal steps through the TFLite interpreter, max |loss difference| "
        f"{table.abs_difference.max():.2e}, max |output difference| after them {table.attrs['max_output_difference']:.2e}")
    return table, check["flatbuffer"]


def users_table(rows: list[dict]) -> pd.DataFrame:
    """One row per (seed, test user, condition)."""
    return pd.DataFrame([{k: v for k, v in r.items() if not k.startswith("_")} for r in rows])


def user_groups(users: pd.DataFrame) -> pd.Series:
    """D5's groups by personal training words: the lightest 25% of test users, the heaviest 25%
    (at least one each), the rest normal."""
    words = users.drop_duplicates("user").set_index("user").train_words.sort_values(kind="stable")
    n = len(words)
    edge = max(1, round(0.25 * n))
    group = pd.Series("normal", index=words.index)
    group.iloc[:edge] = "light"
    group.iloc[n - edge:] = "heavy"
    return group


def _matrix(users: pd.DataFrame, condition: str, only=None) -> np.ndarray:
    """(seeds, users) top-k-eff of one condition, users in a fixed order."""
    d = users[users.condition == condition]
    if only is not None:
        d = d[d.user.isin(only)]
    return d.pivot(index="seed", columns="user", values="top_k_eff").sort_index(axis=1).to_numpy()


def summary_table(rows: list[dict]) -> pd.DataFrame:
    """Per seed and condition: median top-k-eff over test users, pooled top-k-eff, data used."""
    users, out = users_table(rows), []
    for (seed, cond), g in users.groupby(["seed", "condition"]):
        chars = [r["_chars"] for r in rows if r["seed"] == seed and r["condition"] == cond]
        out.append({"seed": seed, "condition": cond, "users": len(g), "top_k_eff_median": g.top_k_eff.median(),
                    "top_k_eff_pooled": top_k_eff(np.concatenate([c[0] for c in chars]), np.concatenate([c[1] for c in chars])),
                    "perplexity_median": g.perplexity.median(), "test_words": int(g.test_words.sum()),
                    "train_words": int(g.train_words.sum()), "unseen_row_shift_median": g.unseen_row_shift.median()})
    return pd.DataFrame(out)


def group_table(users: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, float]]:
    """D5: per group, the median top-k-eff (mean over seeds) of the crowd model and of the
    personalized one, and those values under the paper's quantity names."""
    groups = user_groups(users)
    rows, values = [], {}
    for name in GROUPS:
        members = groups.index[groups == name]
        words = users[users.user.isin(members)].train_words
        for cond, label in ((G_CROWD, "global"), (P_CROWD, "personalized")):
            m = _matrix(users, cond, members)
            value = float(np.median(m, axis=1).mean()) if m.size else float("nan")
            values[f"top-k-eff, {name} users, {label}"] = value
            rows.append({"group": name, "model": label, "users": len(members), "top_k_eff_median": value,
                         "train_words_min": int(words.min()) if len(words) else 0,
                         "train_words_max": int(words.max()) if len(words) else 0})
    return pd.DataFrame(rows), values


def conclude(params: Params, corpora: dict[str, Corpus], models: dict[str, GlobalModels], tuned, selection_table,
             rows: list[dict], on_device_table, flatbuffer, wall_time_s: float) -> record.Result:
    """Tables (one row per user and condition), medians per condition, the paper's numbers beside
    ours, and each claimed effect's paired interval and three-way verdict; D5's groups likewise."""
    users = users_table(rows)
    conditions = [c for c in CONDITIONS if c in set(users.condition)]
    summary = summary_table(rows)
    medians = summary.pivot(index="seed", columns="condition", values="top_k_eff_median")
    headline = {f"top-k-eff, {c}": claims.headline(medians[c].tolist()) for c in conditions}
    rng = streams.rng(params.seed, "bootstrap")
    measured = {e.claim: (_matrix(users, e.better.removeprefix("top-k-eff, ")), _matrix(users, e.worse.removeprefix("top-k-eff, ")))
                for e in PAPER.effects}
    effects = claims.effects_table(PAPER, measured, rng, n_boot=params.bootstrap)
    numbers = claims.paper_vs_ours(PAPER, {q: h["value"] for q, h in headline.items() if q in {n.quantity for n in PAPER.numbers}})
    # D5: groups by personal data, crowd global vs personalized
    groups = user_groups(users)
    users["group"] = users.user.map(groups)
    group_rows, group_values = group_table(users)
    numbers = pd.concat([numbers, claims.paper_vs_ours(PAPER_GROUPS, group_values)], ignore_index=True)
    members = {e.claim: groups.index[groups == e.claim.split()[-2]] for e in PAPER_GROUPS.effects}
    judged = tuple(e for e in PAPER_GROUPS.effects if len(members[e.claim]) >= 2)
    if judged:
        group_effects = claims.effects_table(dataclasses.replace(PAPER_GROUPS, effects=judged),
                                             {e.claim: (_matrix(users, P_CROWD, members[e.claim]), _matrix(users, G_CROWD, members[e.claim]))
                                              for e in judged}, rng, n_boot=params.bootstrap)
        effects = pd.concat([effects, group_effects], ignore_index=True)
    training = pd.concat([m.history().assign(global_text=c.global_text) for m, c in ((models[k], corpora[k]) for k in corpora)])
    cache = pd.concat([models[k].cache().assign(global_text=corpora[k].global_text) for k in corpora], ignore_index=True)
    data = pd.concat([corpora[k].table() for k in corpora]).drop_duplicates("role", ignore_index=True)
    tables = {"data": data, "users": users, "summary": summary, "groups": group_rows, "training": training,
              "selection": selection_table, "global_model_cache": cache, "headline": claims.headline_table(headline),
              "paper_vs_ours": numbers, "effects": effects}
    if on_device_table is not None:
        tables["on_device"] = on_device_table
    card = common.model_card(models["crowd"].model)
    crowd = corpora["crowd"]
    return record.Result(
        experiment=NAME, params=params.to_dict(), tables=tables, headline=headline,
        models={"deeptype_lstm_trainable.tflite": flatbuffer} if flatbuffer else {},
        artifacts={"split.json": crowd.split.to_dict()},
        data=[m.summary() for m in corpora["far"].manifests], stand_in_data=crowd.manifest.stand_in_for, wall_time_s=wall_time_s,
        notes={"vocabulary_size": crowd.vocab.size, "crowd_words": int(sum(map(len, crowd.crowd))),
               "far_words": int(sum(map(len, corpora["far"].crowd))), "split_digest": crowd.split.digest,
               "test_users": list(crowd.split.test), "validation_users": list(crowd.split.validation),
               "seeds": params.seed_list, "paper_config": params.paper_config, "tuned_config": tuned,
               "model_parameters": card["parameters"], "model_size_mb": card["size_mb"],
               "global_models_from_cache": {k: models[k].from_cache for k in models}},
    )


def run(params: Params, speeches=None, log=print) -> record.Result:
    """All stages in order, as the notebook runs them."""
    start = time.perf_counter()
    corpora = load_corpora(params, speeches, log)
    models = train_globals(params, corpora, log)
    tuned, sel = select_personal(params, corpora, models, log)
    rows = personalize(params, corpora, models, tuned, log)
    rows += control(params, corpora, models, rows, log)
    table, flatbuffer = on_device(params, corpora, models, log)
    return conclude(params, corpora, models, tuned, sel, rows, table, flatbuffer, time.perf_counter() - start)


def plot_conditions(users: pd.DataFrame, k: int):
    """Table 1 as a figure: each test user's top-k-eff per condition (mean over seeds), medians marked."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    order = [c for c in CONDITIONS if c in set(users.condition)]
    per_user = users.groupby(["condition", "user"], as_index=False).top_k_eff.mean()
    fig, ax = plt.subplots(figsize=(7.5, 0.55 * len(order) + 1.5))
    sns.stripplot(data=per_user, x="top_k_eff", y="condition", order=order, color="0.55", size=5, jitter=0.15, ax=ax)
    medians = per_user.groupby("condition").top_k_eff.median().reindex(order)
    ax.scatter(medians.values, range(len(order)), marker="|", s=600, color="#d1495b", zorder=3, label="median")
    ax.set(xlabel=f"top-{k}-eff on the user's later lines", ylabel="", title="Global model x personalization (Table 1)")
    ax.legend(frameon=False, loc="lower right")
    sns.despine(fig)
    fig.tight_layout()
    return fig


def plot_groups(groups: pd.DataFrame, k: int):
    """D5 (Fig. 8): median top-k-eff of global and personalized models per user group, paper beside ours."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5), sharey=True)
    sns.barplot(data=groups, x="group", y="top_k_eff_median", hue="model", order=list(GROUPS),
                palette=["#8c8c8c", "#d1495b"], ax=axes[0])
    axes[0].set(title="ours (Shakespeare roles)", xlabel="users", ylabel=f"median top-{k}-eff")
    paper = pd.DataFrame([{"paper": n.value, "group": n.quantity.split(", ")[1].split()[0], "model": n.quantity.split(", ")[2]}
                          for n in PAPER_GROUPS.numbers])
    sns.barplot(data=paper, x="group", y="paper", hue="model", order=list(GROUPS), palette=["#8c8c8c", "#d1495b"], ax=axes[1])
    axes[1].set(title="paper (Kika users; no normal-user numbers)", xlabel="users", ylabel="")
    for ax in axes:
        ax.legend(title="", frameon=False)
    sns.despine(fig)
    fig.tight_layout()
    return fig


def plot_training(training: pd.DataFrame):
    """Training and hold-out loss per epoch of each global model (the plateau that stops it)."""
    import matplotlib.pyplot as plt
    import seaborn as sns
    from matplotlib.ticker import MaxNLocator

    long = training.melt(id_vars=["global_text", "seed", "epoch"], value_vars=[c for c in ("loss", "holdout_loss") if c in training],
                         var_name="measured on", value_name="cross-entropy")
    long["measured on"] = long["measured on"].map({"loss": "training text", "holdout_loss": "held-out text"})
    fig, ax = plt.subplots(figsize=(6, 3.5))
    sns.lineplot(data=long, x="epoch", y="cross-entropy", hue="global_text", style="measured on", marker="o", ax=ax)
    ax.set(title="global models: loss per epoch", ylabel="masked cross-entropy")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(frameon=False, fontsize=8)
    sns.despine(fig)
    fig.tight_layout()
    return fig


def plot_gain_vs_data(users: pd.DataFrame, k: int):
    """Relative top-k-eff change from personalization (crowd global model) per user against the
    personal training text, coloured by D5 group."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    wide = users[users.condition.isin([G_CROWD, P_CROWD])].pivot_table(
        index=["user", "role", "group", "train_words"], columns="condition", values="top_k_eff").reset_index()
    wide["gain_pct"] = 100 * (wide[P_CROWD] / wide[G_CROWD] - 1)
    fig, ax = plt.subplots(figsize=(6, 3.8))
    ax.axhline(0, color="0.6", lw=1, ls="--")
    sns.scatterplot(data=wide, x="train_words", y="gain_pct", hue="group", hue_order=list(GROUPS), palette="crest", s=50, ax=ax)
    for row in wide.itertuples():
        ax.annotate(row.role.title(), (row.train_words, row.gain_pct), fontsize=7, xytext=(4, 3), textcoords="offset points")
    ax.set(xlabel="personal training words", ylabel=f"top-{k}-eff change (%)", title="Gain from personalization vs personal data")
    ax.legend(title="users", frameon=False)
    sns.despine(fig)
    fig.tight_layout()
    return fig


def paper_table(summary: pd.DataFrame, tuned: dict | None) -> pd.DataFrame:
    """Table 1's layout: global corpus x personalization, median top-k-eff (mean over seeds)."""
    med = summary.groupby("condition").top_k_eff_median.mean()
    layout = [("same-corpus crowd (paper: private corpora)", "no", G_CROWD, 0.568),
              ("same-corpus crowd (paper: private corpora)", "yes (paper's configuration)", P_CROWD, 0.624),
              ("same-corpus crowd (paper: private corpora)", "no, more crowd training instead (control)", CONTROL, 0.571),
              ("King James Bible (paper: BBC News)", "no", G_FAR, 0.325),
              ("King James Bible (paper: BBC News)", "yes (paper's configuration)", P_FAR, 0.508),
              ("none", "yes (personal data only)", P_ONLY, 0.331)]
    if P_TUNED in med.index and tuned:
        layout.append(("same-corpus crowd (paper: private corpora)",
                       f"yes, tuned on validation users: {tuned['optimizer']} lr {tuned['learning_rate']:g}, "
                       f"{tuned['epochs']} epochs (deviation)", P_TUNED, math.nan))
    return pd.DataFrame([{"global model from": g, "personalization": p, "ours": med.get(c, math.nan), "paper": v}
                         for g, p, c, v in layout])
