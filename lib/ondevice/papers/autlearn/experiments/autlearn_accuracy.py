"""AutLearn A1 and A2 (Fig. 7): accuracy of AutLearn against CloudTrain, CloudCustomize and FedAvg,
for the next-word LSTM (public Sent140 -> Shakespeare users) and MobileNet v1 (ImageNet -> FEMNIST
writers), every method on the same per-user splits.

- AutLearn: the public pre-trained model; on each device the last layer only trains on that
  user's data (`autlearn_common.PersonalTrainer`).
- CloudTrain: one model, all of its layers trained further in the cloud on every user's training
  data pooled; no per-user model.
- CloudCustomize: CloudTrain's model, then AutLearn's on-device step per user.
- FedAvg: from the public pre-trained model, all layers, `fedavg_rounds` rounds of
  `fedavg_clients` users training `fedavg_local_epochs` locally (techniques.autlearn.fedavg).
- and, for reference, the public pre-trained model itself (no user data at all).

Metric: top-1 per user on the user's test part (the LSTM: the next word before any of its letters
is typed; DeepType's top-k-eff beside it), means over users with bootstrap intervals, paired
comparisons between methods through `results.claims` (means over users).

The on-device learning rate of each model (AutLearn's and CloudCustomize's step) is chosen on
validation users drawn apart from the test users (`autlearn_common.choose_rate`).

The notebook calls one stage per section: `load`, `pretrain`, `choose_rates`, `text_methods`,
`image_methods`, `on_device`, `conclude`; `run` calls them all.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ondevice import streams
from ondevice.device import tflite
from ondevice.models import mobilenet_v1
from ondevice.papers.autlearn import common
from ondevice.papers.autlearn.techniques.fedavg import fedavg
from ondevice.papers.deeptype.techniques.bucketing import EqualLength
from ondevice.report import claims, record
from ondevice.tasks.next_word import NextWordTask
from ondevice.training.trainer import Trainer, seed_everything

NAME = "autlearn_accuracy"
PRE, AUT, CLOUD, CUSTOM, FED = "pre-trained (public only)", "AutLearn", "CloudTrain", "CloudCustomize", "FedAvg"
METHODS = (PRE, AUT, CLOUD, CUSTOM, FED)
MODELS = common.MODEL_NAMES


# The paper gives only relative numbers (Sec. 4.2): normalised here to CloudTrain = 1 per model.
# Whether its "%" is absolute or relative is not said; we read it as relative to CloudTrain.
def quantity(kind: str, method: str) -> str:
    return f"{MODELS[kind]}: {method} top-1 / CloudTrain top-1"


PAPER_VALUES = {
    ("text", CLOUD): (1.0, "Fig. 7 (the reference)"),
    ("text", FED): (0.99, "Sec. 4.2: FedAvg about 1% below CloudTrain"),
    ("text", AUT): (0.991, "Sec. 4.2: AutLearn 0.9% below CloudTrain on the LSTM"),
    ("image", CLOUD): (1.0, "Fig. 7 (the reference)"),
    ("image", FED): (0.99, "Sec. 4.2: FedAvg about 1% below CloudTrain"),
    ("image", AUT): (1.008, "Sec. 4.2: AutLearn 0.8% above CloudTrain on MobileNet"),
}
# (claim, kind, better, worse) in the paper's direction
CLAIMS = (
    ("CloudTrain beats FedAvg (LSTM)", "text", CLOUD, FED),
    ("CloudTrain beats AutLearn (LSTM)", "text", CLOUD, AUT),
    ("CloudTrain beats FedAvg (MobileNet)", "image", CLOUD, FED),
    ("AutLearn beats CloudTrain (MobileNet)", "image", AUT, CLOUD),
)
PAPER = claims.Paper(
    citation="Xu et al., AutLearn (Journal of Software, in Chinese), Sec. 4.2 and Fig. 7",
    numbers=tuple(claims.PaperNumber(quantity(k, m), v, src) for (k, m), (v, src) in PAPER_VALUES.items()),
    effects=tuple(claims.Effect(c, quantity(k, b), quantity(k, w)) for c, k, b, w in CLAIMS),
)
# "CloudCustomize gets the highest accuracy on both models": an ordering without numbers.
ORDERINGS = tuple(
    (f"CloudCustomize beats {other} ({model})", kind, CUSTOM, other)
    for kind, model in MODELS.items()
    for other in (AUT, CLOUD, FED)
)


@dataclass(frozen=True)
class Params(common.AutLearnParams):
    # CloudTrain (and the cloud part of CloudCustomize): every layer, pooled users' training data
    cloud_init: str = "public"  # public: from the public pre-trained model | scratch: random weights
    text_cloud_epochs: int = 3
    text_cloud_batch_size: int = 64
    text_cloud_learning_rate: float = 0.001  # Adam
    image_cloud_epochs: int = 3
    image_cloud_batch_size: int = 32
    image_cloud_learning_rate: float = 0.0005  # Adam
    # FedAvg: same optimizer and rate as CloudTrain on each client (fresh state per client and round)
    fedavg_rounds: int = 12
    fedavg_clients: int = 5  # clients per round
    fedavg_local_epochs: int = 1
    image_fedavg_rounds: int = 0  # 0 = fedavg_rounds
    image_fedavg_clients: int = 0  # 0 = fedavg_clients
    seeds: int = 1  # repeats of all training (seed, seed+1, ...); data and users use `seed`
    bootstrap: int = 2000
    tflite_check_steps: int = 3  # AutLearn's LSTM step through the TFLite interpreter (0 = skip)

    # default: 12 of the 137 top-10% Shakespeare roles (CPU budget) and 99 of the 105 FEMNIST writers
    # of the mirror (6 of each are validation users). FedAvg sees about as many examples as
    # CloudTrain: rounds x clients x local epochs / users = cloud epochs (text 6 x 4 / 12 = 2;
    # images 20 x 10 / 99 = 2.0).
    PRESETS = common.presets(
        {
            "smoke": dict(
                text_cloud_epochs=1,
                image_cloud_epochs=2,
                image_cloud_learning_rate=0.002,
                fedavg_rounds=2,
                fedavg_clients=2,
                bootstrap=300,
            ),
            "default": dict(
                text_cloud_epochs=2,
                image_cloud_epochs=2,
                fedavg_rounds=6,
                fedavg_clients=4,
                image_fedavg_rounds=20,
                image_fedavg_clients=10,
            ),
            "paper": dict(
                seeds=3,
                text_cloud_epochs=10,
                image_cloud_epochs=10,
                fedavg_rounds=100,
                fedavg_clients=10,
                image_fedavg_rounds=100,
                image_fedavg_clients=30,
            ),
        }
    )

    def check(self) -> None:
        super().check()
        self.require(self.cloud_init in ("public", "scratch"), "cloud_init", "must be 'public' or 'scratch'")
        for name in (
            "text_cloud_epochs",
            "image_cloud_epochs",
            "text_cloud_batch_size",
            "image_cloud_batch_size",
            "fedavg_rounds",
            "fedavg_clients",
            "fedavg_local_epochs",
            "seeds",
        ):
            self.require(getattr(self, name) >= 1, name, "must be at least 1")
        for name in ("image_fedavg_rounds", "image_fedavg_clients"):
            self.require(getattr(self, name) >= 0, name, "must be >= 0 (0 = the text setting)")
        for name in ("text_cloud_learning_rate", "image_cloud_learning_rate"):
            self.require(getattr(self, name) > 0, name, "must be positive")
        self.require(self.bootstrap >= 100, "bootstrap", "must be at least 100 resamples")
        self.require(self.tflite_check_steps >= 0, "tflite_check_steps", "must be >= 0 (0 = skip)")

    @property
    def seed_list(self) -> list[int]:
        return [self.seed + i for i in range(self.seeds)]

    def fedavg_setting(self, kind: str) -> tuple[int, int]:
        """(rounds, clients per round) of FedAvg for a model kind."""
        if kind == "image":
            return self.image_fedavg_rounds or self.fedavg_rounds, self.image_fedavg_clients or self.fedavg_clients
        return self.fedavg_rounds, self.fedavg_clients


def load(params: Params, log=print) -> tuple[common.TextData, common.ImageData]:
    return common.load_text(params, log), common.load_images(params, log)


def pretrain(
    params: Params, text: common.TextData, images: common.ImageData, log=print
) -> dict[str, dict[int, common.Pretrained]]:
    """The public pre-trained models per kind and seed (LSTM: on Sent140, cached; MobileNet: ImageNet)."""
    seed_everything(params.seed)
    return {
        "text": {s: common.pretrained_text(params, text, log, s) for s in params.seed_list},
        "image": {s: common.pretrained_image(params, images, log, s) for s in params.seed_list},
    }


def choose_rates(
    params: Params, text: common.TextData, images: common.ImageData, pre, log=print
) -> tuple[Params, pd.DataFrame]:
    """Both models' on-device rates chosen on their validation users, from the first seed's public models."""
    return common.choose_rates(params, text, images, {kind: pre[kind][params.seed] for kind in pre}, log)


def on_device(params: Params, text: common.TextData, pre, log=print) -> pd.DataFrame | None:
    """AutLearn's LSTM step (softmax only, the chosen rate) exported as a trainable TFLite model and
    run for the first test user's first steps in TensorFlow and through the interpreter (Flex
    delegate), from the public model; it trains copies and draws from its own stream."""
    if not params.tflite_check_steps:
        return None
    user, task = text.users[0], NextWordTask(params.k)
    batches = list(
        task.batches(text.train[user], params.text_personal_batch_size, streams.rng(params.seed, "diagnostics/tflite"))
    )
    model = pre["text"][params.seed].model
    model.set_weights(pre["text"][params.seed].weights)
    check = tflite.compare_training(
        model,
        task,
        params.text_personal_learning_rate,
        batches[: params.tflite_check_steps],
        params.text_personal_optimizer,
        hooks=[common.last_layer("text")],
    )
    table = pd.DataFrame(
        {
            "step": range(1, len(check["tflite"]) + 1),
            "loss_tensorflow": check["tensorflow"],
            "loss_tflite": check["tflite"],
        }
    )
    table["abs_difference"] = (table.loss_tflite - table.loss_tensorflow).abs()
    table["max_output_difference_after"] = float(np.abs(check["outputs_tflite"] - check["outputs_tensorflow"]).max())
    log(
        f"on-device check ({user}): {len(table)} steps through the TFLite interpreter, max |loss difference| "
        f"{table.abs_difference.max():.2e}, max |output difference| after them "
        f"{table.max_output_difference_after.iloc[0]:.2e}"
    )
    return table


def _setup(params: Params, kind: str):
    """The task, the Trainer hooks and the cloud / FedAvg training settings of a kind."""
    if kind == "text":
        return (
            NextWordTask(params.k),
            [EqualLength()],
            params.text_cloud_learning_rate,
            params.text_cloud_epochs,
            params.text_cloud_batch_size,
        )
    return (
        common.image_task(),
        [],
        params.image_cloud_learning_rate,
        params.image_cloud_epochs,
        params.image_cloud_batch_size,
    )


def _score(params: Params, kind: str, model, test) -> dict:
    if kind == "text":
        return common.score_text(model, test, params.k)
    return common.score_image(model, test)


def methods(
    params: Params, kind: str, data, pre: dict[int, common.Pretrained], log=print
) -> tuple[list[dict], list[dict]]:
    """Every method on every user of one kind, for every seed: one row per (seed, user, method)
    with its scores, and the training history of CloudTrain and FedAvg."""
    rows, history = [], []
    task, hooks, lr, epochs, batch = _setup(params, kind)
    rounds, per_round = params.fedavg_setting(kind)
    per_round = min(per_round, len(data.users))
    for seed in params.seed_list:
        model, start = pre[seed].model, pre[seed].weights
        step = common.PersonalTrainer(params, kind, model)
        cloud = Trainer(model, task, lr, "adam", hooks=hooks)

        def record_(method, user, scores):
            rows.append(
                {
                    "kind": kind,
                    "model": MODELS[kind],
                    "seed": seed,  # noqa: B023 (record_ is called in this iteration only)
                    "user": user,
                    "method": method,
                    "train_examples": task.size(data.train[user]),
                    "test_examples": task.size(data.test[user]),
                    **scores,
                }
            )

        # the public model, and AutLearn on each user
        for user in data.users:
            model.set_weights(start)
            record_(PRE, user, _score(params, kind, model, data.test[user]))
            step.fit(start, data.train[user], streams.rng(seed, f"personal/{kind}/{user}"))
            record_(AUT, user, _score(params, kind, model, data.test[user]))
        log(f"{MODELS[kind]} seed {seed}: pre-trained and AutLearn scored on {len(data.users)} users")
        # CloudTrain: all layers on the pooled training data, then CloudCustomize per user
        cloud_start = start if params.cloud_init == "public" else _scratch(params, kind, data, seed)
        cloud.reset(cloud_start)
        for row in cloud.fit(
            data.pooled_train(), epochs, batch, streams.rng(seed, f"cloud/{kind}"), log, f"CloudTrain {MODELS[kind]}"
        ):
            history.append({"kind": kind, "seed": seed, "method": CLOUD, "step": row["epoch"], "loss": row["loss"]})
        cloud_weights = model.get_weights()
        for user in data.users:
            model.set_weights(cloud_weights)
            record_(CLOUD, user, _score(params, kind, model, data.test[user]))
            step.fit(cloud_weights, data.train[user], streams.rng(seed, f"personal/{kind}/{user}"))
            record_(CUSTOM, user, _score(params, kind, model, data.test[user]))
        # FedAvg: from the public model, the users as clients
        cloud.reset(start)
        _, rounds_log = fedavg(
            cloud,
            start,
            data.train,
            rounds,
            per_round,
            params.fedavg_local_epochs,
            batch,
            seed=streams.tf_seed(seed, f"fedavg/{kind}"),
            log=log,
        )
        history += [
            {"kind": kind, "seed": seed, "method": FED, "step": r["round"], "loss": r["client_loss"]}
            for r in rounds_log
        ]
        for user in data.users:
            record_(FED, user, _score(params, kind, model, data.test[user]))
        log(f"{MODELS[kind]} seed {seed}: CloudTrain, CloudCustomize and FedAvg scored")
    return rows, history


def _scratch(params: Params, kind: str, data, seed: int) -> list[np.ndarray]:
    """Random initial weights of the same model (cloud_init = "scratch")."""
    if kind == "text":
        return common.text_model(params, data, seed).get_weights()
    return mobilenet_v1.build(
        None, params.mobilenet_alpha, params.image_size, 62, seed=streams.tf_seed(seed, "init/autlearn-head")
    ).get_weights()


def text_methods(params: Params, text: common.TextData, pre, log=print):
    return methods(params, "text", text, pre["text"], log)


def image_methods(params: Params, images: common.ImageData, pre, log=print):
    return methods(params, "image", images, pre["image"], log)


def users_table(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(rows)


def _matrix(users: pd.DataFrame, kind: str, method: str, column: str = "top1") -> np.ndarray:
    """(seeds, users) values of one method, users in a fixed order."""
    d = users[(users.kind == kind) & (users.method == method)]
    return d.pivot(index="seed", columns="user", values=column).sort_index(axis=1).to_numpy()


def summary_table(users: pd.DataFrame, params: Params) -> pd.DataFrame:
    """Per model and method: mean top-1 over users (mean over seeds) with a 95% bootstrap interval
    over users, the median, and the text model's top-k-eff."""
    rng, n_boot, out = streams.rng(params.seed, "bootstrap/summary"), params.bootstrap, []
    for kind in MODELS:
        for method in METHODS:
            m = _matrix(users, kind, method)
            if not m.size:
                continue
            per_user = m.mean(axis=0)
            boot = per_user[rng.integers(0, len(per_user), (n_boot, len(per_user)))].mean(axis=1)
            row = {
                "model": MODELS[kind],
                "method": method,
                "users": m.shape[1],
                "seeds": m.shape[0],
                "top1_mean": float(per_user.mean()),
                "top1_ci_low": float(np.quantile(boot, 0.025)),
                "top1_ci_high": float(np.quantile(boot, 0.975)),
                "top1_median": float(np.median(per_user)),
            }
            if kind == "text":
                row["top_k_eff_mean"] = float(_matrix(users, kind, method, "top_k_eff").mean())
            out.append(row)
    return pd.DataFrame(out)


def conclude(
    params: Params,
    text: common.TextData,
    images: common.ImageData,
    pre,
    rows: list[dict],
    history: list[dict],
    rates: pd.DataFrame,
    tflite_check: pd.DataFrame | None,
    wall_time_s: float,
) -> record.Result:
    """Tables, the paper's relative numbers beside ours, and paired three-way verdicts."""
    users = users_table(rows)
    rng = streams.rng(params.seed, "bootstrap")
    summary = summary_table(users, params)
    means = {(MODELS[k], m): _matrix(users, k, m).mean(axis=1) for k in MODELS for m in METHODS}  # per seed
    headline = {f"{model}: {method} mean top-1": claims.headline(v.tolist()) for (model, method), v in means.items()}
    ours = {quantity(k, m): float(np.mean(means[MODELS[k], m] / means[MODELS[k], CLOUD])) for k, m in PAPER_VALUES}
    numbers = claims.paper_vs_ours(PAPER, ours)
    measured = {c: (_matrix(users, k, b), _matrix(users, k, w)) for c, k, b, w in CLAIMS}
    effects = claims.effects_table(PAPER, measured, rng, n_boot=params.bootstrap, statistic="mean")
    ordering = []
    for claim, kind, better, worse in ORDERINGS:
        r = claims.paired_effect(
            _matrix(users, kind, better), _matrix(users, kind, worse), rng, n_boot=params.bootstrap, statistic="mean"
        )
        ordering.append(
            {
                "effect": claim,
                "paper change": math.nan,
                "our change": r["change"],
                "ci low": r["ci_low"],
                "ci high": r["ci_high"],
                "users": r["users"],
                "seeds": r["seeds"],
                "users improved": r["users_improved"],
                "users worse": r["users_worse"],
                "sign test p": r["sign_test_p"],
                "verdict": r["verdict"],
                "level": 0.95,
            }
        )
    effects = pd.concat([effects, pd.DataFrame(ordering)], ignore_index=True)
    data = pd.concat(
        [text.table().drop(columns="public_words"), images.table().drop(columns="writers_read")], ignore_index=True
    )
    tables = {
        "users": users,
        "summary": summary,
        "training": pd.DataFrame(history),
        "data": data,
        "pretraining": pd.concat([p.history().assign(seed=s) for s, p in pre["text"].items()], ignore_index=True),
        "headline": claims.headline_table(headline),
        "paper_vs_ours": numbers,
        "effects": effects,
        "rate_selection": rates,
    }
    if tflite_check is not None:
        tables["tflite_check"] = tflite_check
    # Shakespeare's manifest marks it a stand-in for DeepType's private keyboard logs; for AutLearn
    # it is the paper's own data set (LEAF Shakespeare), so nothing here is a stand-in.
    data_summaries = [{**m.summary(), "stand_in_for": None} for m in text.manifests + [images.manifest]]
    data_summaries.append(common.mobilenet_weights(params)[0].summary())
    return record.Result(
        experiment=NAME,
        params=params.to_dict(),
        tables=tables,
        headline=headline,
        data=data_summaries,
        stand_in_data=None,
        wall_time_s=wall_time_s,
        artifacts={"users.json": {"text": list(text.users), "image": list(images.users)}},
        notes={
            "text_users": list(text.users),
            "text_users_in_data_set": text.all_users,
            "image_users": len(images.users),
            "image_writers_read": images.all_users,
            "vocabulary_size": text.vocab.size,
            "seeds": params.seed_list,
            "validation_users": {"text": list(text.validation.users), "image": list(images.validation.users)},
            "on_device_rates_chosen": {
                "text": params.text_personal_learning_rate,
                "image": params.image_personal_learning_rate,
            },
            "pretrained_lstm_from_cache": {s: p.from_cache for s, p in pre["text"].items()},
            "effects_statistic": "mean over users (paired bootstrap)",
        },
    )


def verdicts(effects: pd.DataFrame) -> str:
    """Markdown: the numbered claims through claims.verdict_text, then the orderings (no paper number)."""
    numeric = effects[effects["paper change"].notna()]
    lines = [claims.verdict_text(numeric, None)]
    for _, row in effects[effects["paper change"].isna()].iterrows():
        lines.append(
            f"- **{row['effect']}**: {row['verdict']} in our measurement: {claims.percent(row['our change'])} "
            f"(95% interval {claims.percent(row['ci low'])} to {claims.percent(row['ci high'])}, "
            f"{row['users']} users x {row['seeds']} seed(s); the paper: CloudCustomize is best, no number)."
        )
    return "\n".join(lines)


def run(params: Params, log=print) -> record.Result:
    """All stages in order, as the notebook runs them."""
    start = time.perf_counter()
    text, images = load(params, log)
    pre = pretrain(params, text, images, log)
    params, rates = choose_rates(params, text, images, pre, log)
    rows, history = text_methods(params, text, pre, log)
    more, more_history = image_methods(params, images, pre, log)
    check = on_device(params, text, pre, log)
    return conclude(
        params, text, images, pre, rows + more, history + more_history, rates, check, time.perf_counter() - start
    )


def plot_methods(users: pd.DataFrame):
    """Fig. 7 as ours: per model, each user's top-1 per method (mean over seeds), means marked."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    per_user = users.groupby(["model", "method", "user"], as_index=False).top1.mean()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, model in zip(axes, MODELS.values()):
        d = per_user[per_user.model == model]
        sns.stripplot(data=d, x="top1", y="method", order=list(METHODS), color="0.6", size=3, jitter=0.2, ax=ax)
        means = d.groupby("method").top1.mean().reindex(METHODS)
        ax.scatter(means.values, range(len(METHODS)), marker="|", s=500, color="#d1495b", zorder=3, label="mean")
        ax.set(title=model, xlabel="top-1 on the user's test part", ylabel="")
        ax.legend(frameon=False, loc="lower right")
    sns.despine(fig)
    fig.tight_layout()
    return fig


def plot_training(training: pd.DataFrame):
    """CloudTrain's loss per epoch and FedAvg's mean client loss per round."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.2))
    for ax, (kind, model) in zip(axes, MODELS.items()):
        d = training[training.kind == kind]
        sns.lineplot(data=d, x="step", y="loss", hue="method", style="seed", marker="o", ax=ax)
        ax.set(
            title=f"{model}: cloud epochs / FedAvg rounds",
            xlabel="epoch (CloudTrain) or round (FedAvg)",
            ylabel="training loss",
        )
        ax.legend(frameon=False, fontsize=8)
    sns.despine(fig)
    fig.tight_layout()
    return fig
