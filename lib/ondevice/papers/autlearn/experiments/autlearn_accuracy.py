"""AutLearn A1 and A2 (Fig. 7): accuracy of AutLearn against CloudTrain, CloudCustomize and FedAvg,
for the next-word LSTM (public Sent140 -> Shakespeare users) and MobileNet v1 (ImageNet -> FEMNIST
writers), every method on the same per-user splits.

- AutLearn: the public pre-trained model; on each device the last layer only trains on that user's
  data (`protocol.PersonalTrainer`), its rate and epochs chosen on the validation users.
- CloudTrain: one model, all of its layers trained further in the cloud on every user's training
  data pooled, to convergence (`cloud_baselines.converge_cloud`), its optimizer (Adam or SGD) and
  rate chosen on the validation users (`cloud_choice`); no per-user model.
- CloudCustomize: CloudTrain's model, then an on-device step per user (optimizer and rate: `customize_choice`).
- FedAvg: from the public model, all layers, rounds of `fedavg_clients` users training locally by
  SGD (`fedavg_baseline`: McMahan et al.'s FedAvg, its local epochs and client rate chosen on the
  validation users, and its known-answer control on IID clients); and the public model itself.
The baselines are compared at convergence (Sec. 4.2): at a plateau of the validation users' loss (`holdout_loss`).

Metric: top-1 per user on the user's test part (the LSTM: the next word before any letter is typed;
top-k-eff beside it), means over users with bootstrap intervals and paired comparisons; the paper's
relative numbers (Sec. 4.2) are normalised to CloudTrain = 1 per model.

Stages (`run` calls them all, long ones resume): `load`, `pretrain`, `choose_rates`, the choices (`fedavg_baseline`,
`cloud_choice`, `customize_choice`), `text_methods`, `image_methods`, `resolution.curve`, `on_device`, `conclude`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ondevice import streams
from ondevice.engine.stage import resumable
from ondevice.papers.autlearn import cloud_choice, common, fedavg_ablation, fedavg_baseline, protocol, report
from ondevice.papers.autlearn import resolution as feature_resolution
from ondevice.papers.autlearn import smoke_presets as smoke
from ondevice.papers.autlearn.cloud_baselines import holdout_loss
from ondevice.papers.autlearn.customize_choice import check as customize_check
from ondevice.papers.autlearn.customize_choice import choose_all as choose_customize
from ondevice.papers.autlearn.feature_gap import diagnoses as gap_diagnoses
from ondevice.report import facts, record
from ondevice.report.conclusion import Conclusion, effect_row, wide
from ondevice.training.trainer import Plateau, seed_everything

NAME = "autlearn_accuracy"
PRE, AUT, CLOUD, CUSTOM, FED = "pre-trained (public only)", "AutLearn", "CloudTrain", "CloudCustomize", "FedAvg"
METHODS = (PRE, AUT, CLOUD, CUSTOM, FED)
MODELS = common.MODEL_NAMES
KIND_OF = {model: kind for kind, model in MODELS.items()}
PAPER = facts.paper(NAME)  # quantities "<model>: <method> top-1 / CloudTrain top-1"; CloudCustomize best: no number
ORDERINGS = [(f"CloudCustomize beats {o} ({m})", k, CUSTOM, o) for k, m in MODELS.items() for o in (AUT, CLOUD, FED)]


def kind_method(quantity: str) -> tuple[str, str]:
    """The (kind, method) a paper quantity names."""
    model, rest = quantity.split(": ", 1)
    return KIND_OF[model], rest.split(" top-1")[0]


@dataclass(frozen=True)
class Params(common.AutLearnParams):
    # CloudTrain (and the cloud part of CloudCustomize): every layer, pooled users' training data
    cloud_init: str = "public"  # public: from the public pre-trained model | scratch: random weights
    text_cloud_epochs: int = 10  # at most: training ends at the plateau below
    text_cloud_batch_size: int = 64
    text_cloud_learning_rate: float = 0.001  # Adam, a candidate beside SGD at the FedAvg grid (`cloud_choice`)
    image_cloud_epochs: int = 15  # at most
    image_cloud_batch_size: int = 32
    image_cloud_learning_rate: float = 0.0005
    text_cloud_screen_epochs: int = 0  # every candidate this many epochs, the best on to its plateau (0: none)
    image_cloud_screen_epochs: int = 0
    image_sgd_rate_candidates: tuple[float, ...] = (0.01, 0.03, 0.1, 0.3, 1.0)  # CloudCustomize's SGD, beside Adam
    # FedAvg (`fedavg_baseline`): client SGD at CloudTrain's batch and at a rate of the grid x clients a round, the
    # local epochs and the rate chosen on validation users
    fedavg_rounds: int = 120  # at most
    fedavg_clients: int = 5  # clients per round
    image_fedavg_rounds: int = 0  # 0 = fedavg_rounds
    image_fedavg_clients: int = 0  # 0 = fedavg_clients
    fedavg_epoch_candidates: tuple[int, ...] = (1, 3)
    text_fedavg_rate_candidates: tuple[float, ...] = (0.1, 0.3, 1.0, 3.0)
    image_fedavg_rate_candidates: tuple[float, ...] = (0.01, 0.03, 0.1)
    text_rate_cuts: int = 0  # CloudTrain and FedAvg: on from each plateau at a fifth of the rate
    image_rate_cuts: int = 0
    text_fedavg_screen_rounds: int = 0  # every pair this many rounds, the best on to its plateau (0: none)
    image_fedavg_screen_rounds: int = 0
    fedavg_control_tolerance: float = 0.02  # relative, IID FedAvg's kept held-out loss over CloudTrain's
    fedavg_warmup_epochs: float = 1.0  # clients' rate from the grid's up to clients-a-round x it (fedavg_baseline)
    fedavg_together: bool = False  # a round's LSTM clients at once: slower (fedavg_baseline.clients_together)
    # One stopping rule for both (fixed before any run, never tuned on test users): the loss on all data of the
    # validation users after every epoch of examples (FedAvg: `cloud_baselines.converge_fedavg`), ending after
    # `*_cloud_patience` evaluations in a row none `stop_min_delta` (relative) below the lowest, which is kept.
    stop_min_delta: float = 0.005
    cloud_patience: int = 2
    image_cloud_patience: int = 0  # 0 = cloud_patience
    fedavg_evaluate_every: int = 0  # rounds between FedAvg's evaluations; 0 = an epoch of examples
    seeds: int = 1  # repeats of all training (seed, seed+1, ...); data and users use `seed`; 3 at default
    bootstrap: int = 2000
    tflite_check_steps: int = 3  # AutLearn's LSTM step through the TFLite interpreter (0 = skip)

    # default: 12 of 137 top-10% Shakespeare roles, 99 of 105 FEMNIST writers (6 of each validate). Caps: CloudTrain
    # 10 / 30 epochs; FedAvg the same in examples at one local epoch (LSTM 10 x 12 / 4 rounds, MobileNet 30 x 99 / 3).
    # MobileNet: its SGD grid in `cloud_choice`; its constant-rate curves swing +-10% between evaluations, hence its
    # patience; both models' rate cuts: `cloud_baselines`. Its FedAvg takes 3 clients a round, not 10: a round costs its
    # clients' epochs, and at 10 they step at 10x the grid's rate.
    PRESETS = common.presets(
        {
            "smoke": smoke.AUTLEARN_ACCURACY,
            "default": dict(seeds=3, text_cloud_epochs=10, image_cloud_epochs=30, fedavg_rounds=30, fedavg_clients=4)
            | dict(image_fedavg_rounds=990, image_fedavg_clients=3, image_cloud_patience=6)
            | dict(text_rate_cuts=2, image_rate_cuts=2)
            | dict(text_fedavg_screen_rounds=6, image_fedavg_screen_rounds=297)
            | dict(text_cloud_screen_epochs=2, image_cloud_screen_epochs=9),
            "paper": dict(seeds=3, text_cloud_epochs=30, image_cloud_epochs=30, fedavg_rounds=400, fedavg_clients=10)
            | dict(image_fedavg_rounds=360, image_fedavg_clients=30, text_rate_cuts=2, image_rate_cuts=2),  # ~30 epochs
        }
    )

    def check(self) -> None:
        super().check()
        self.at_least(1, "fedavg_rounds", "fedavg_clients", "seeds")
        fedavg_baseline.check(self)
        customize_check(self)
        cloud_choice.check(self)
        self.at_least(0, "image_fedavg_rounds", "image_fedavg_clients", "image_cloud_patience")
        self.at_least(0, "fedavg_evaluate_every", "tflite_check_steps", "text_rate_cuts", "image_rate_cuts")
        self.at_least(1, "cloud_patience", "validation_users")  # the rule needs held-out users
        self.between("[0, 1)", "stop_min_delta")
        self.at_least(100, "bootstrap")

    def cloud(self, kind: str) -> tuple[float, int, int]:
        """CloudTrain's Adam rate (`cloud_choice`), epochs (at most) and batch size for a model kind."""
        return tuple(getattr(self, f"{kind}_cloud_{f}") for f in ("learning_rate", "epochs", "batch_size"))

    def plateau(self, kind: str = "text") -> Plateau:
        """The stopping rule of CloudTrain and FedAvg for a model kind (patience in evaluations)."""
        patience = (kind == "image" and self.image_cloud_patience) or self.cloud_patience
        return Plateau(patience, self.stop_min_delta, keep_lowest=True)


def load(params: Params, log=print) -> tuple[common.TextData, common.ImageData]:
    return common.load_text(params, log), common.load_images(params, log)


def pretrain(params: Params, text, images, log=print) -> dict[str, dict[int, common.Pretrained]]:
    """The public pre-trained models per kind and seed (LSTM: on Sent140, cached; MobileNet: ImageNet)."""
    seed_everything(params.seed)
    return common.pretrained_models(params, text, images, log)


@resumable("choose_rates")
def choose_rates(params: Params, text, images, pre, log=print) -> tuple[Params, pd.DataFrame]:
    """Both models' on-device rates and epochs chosen on their validation users, from the first seed's public models."""
    return protocol.choose_steps(params, text, images, {kind: pre[kind][params.seed] for kind in pre}, log)


def on_device(params: Params, text: common.TextData, pre, log=print) -> pd.DataFrame | None:
    """AutLearn's LSTM step through TensorFlow and TFLite for the first test user (`protocol.tflite_check`)."""
    if not params.tflite_check_steps:
        return None
    return protocol.tflite_check(params, text.users[0], text.train[text.users[0]], pre["text"][params.seed], log)


def methods(params: Params, kind: str, data, pre: dict[int, common.Pretrained], fedavg, cloud, custom, log=print):
    """Every method on every user of one kind, for every seed: one row per (seed, user, method) with its scores,
    and the convergence curves of CloudTrain and FedAvg (a row per epoch/round); `fedavg`, `cloud`, `custom`: the
    kind's `fedavg_baseline.Choice` (the users'), `cloud_choice.CloudChoice` and CloudCustomize's step."""
    runs = [_one_seed(params, kind, data, pre[seed], seed, fedavg, cloud, custom, log) for seed in params.seed_list]
    return [r for rows, _ in runs for r in rows], [h for _, history in runs for h in history]


@resumable("methods", part=lambda params, kind, data, pre, seed, *args: f"{kind}-seed{seed}")
def _one_seed(params: Params, kind: str, data, pre: common.Pretrained, seed: int, fedavg, cloud, custom, log):
    rows, history, (model, start) = [], [], (pre.model, pre.weights)
    task, step = protocol.task(params, kind), protocol.PersonalTrainer(params, kind, model)
    holdout = holdout_loss(kind, data.validation)

    def record_(method, users, weights=None, on_device=None):
        for user in users:
            if weights is not None:
                model.set_weights(weights)
            row = dict(kind=kind, model=MODELS[kind], seed=seed, user=user, method=method)
            row |= dict(train_examples=task.size(data.train[user]), test_examples=task.size(data.test[user]))
            if on_device is not None:  # the on-device step from `weights` (AutLearn, CloudCustomize)
                on_device.fit(weights, data.train[user], streams.rng(seed, f"personal/{kind}/{user}"))
                row |= dict(on_device_rate=on_device.setting.learning_rate, on_device_epochs=on_device.setting.epochs)
            rows.append(row | protocol.score(params, kind, model, data.test[user]))

    # the public model, and AutLearn on each user
    for user in data.users:
        record_(PRE, [user], start)
        record_(AUT, [user], start, step)
    log(f"{MODELS[kind]} seed {seed}: pre-trained and AutLearn scored on {len(data.users)} users")

    def curve(method, points):
        kept = next(p for p in points if p["kept"])
        history.extend(dict(kind=kind, model=MODELS[kind], seed=seed, method=method) | p for p in points)
        unit, ran, end = kept["unit"], len(points) - 1, kept["ended_by"]
        log(f"{MODELS[kind]} seed {seed}: {method} keeps {unit} {kept['step']} of {ran}, ended by the {end}")

    # CloudTrain, all layers, with the chosen optimizer and rate (the first seed's: the chosen run), then CloudCustomize
    curve(CLOUD, cloud_choice.train(params, kind, data, pre, holdout, seed, cloud, log))
    cloud_weights, custom_step = model.get_weights(), protocol.PersonalTrainer(custom, kind, model)
    for user in data.users:
        record_(CLOUD, [user], cloud_weights)
        record_(CUSTOM, [user], cloud_weights, custom_step)
    # FedAvg: from the public model, the users as clients, to the plateau, with the chosen setting (the
    # first seed's is the chosen run itself); the first seed also on shuffled clients with the same setting (the
    # IID control, whose known answer is the CloudTrain above)
    for method, client_data in fedavg_ablation.client_sets(FED, kind, data, seed, ablate=seed == params.seed).items():
        reuse = seed == params.seed and method == FED
        points = fedavg_baseline.federate(params, kind, model, start, client_data, holdout, seed, fedavg, reuse, log)
        curve(method, points)
        record_(method, data.users)
    log(f"{MODELS[kind]} seed {seed}: CloudTrain, CloudCustomize and FedAvg scored")
    return rows, history


def text_methods(params: Params, text: common.TextData, pre, fedavg, cloud, custom, log=print):
    return methods(params, "text", text, pre["text"], fedavg["text"], cloud["text"], custom["text"], log)


def image_methods(params: Params, images: common.ImageData, pre, fedavg, cloud, custom, log=print):
    return methods(params, "image", images, pre["image"], fedavg["image"], cloud["image"], custom["image"], log)


users_table = pd.DataFrame  # one row per (kind, seed, user, method)


def _matrix(users: pd.DataFrame, kind: str, method: str) -> np.ndarray:  # top-1, (seeds, users)
    return wide(users, "top1", kind=kind, method=method)


def summary_table(users: pd.DataFrame, params: Params) -> pd.DataFrame:
    return report.accuracy_summary(users, METHODS, streams.rng(params.seed, "bootstrap/summary"), params.bootstrap)


def conclude(params: Params, text, images, pre, rows, history, rates, tflite_check, wall_time_s, extra=None):
    """Tables, the paper's relative numbers beside ours, and paired three-way verdicts; `extra`: more
    tables by name (the CloudTrain CloudCustomize's step is chosen on, the resolution curve)."""
    users, rng = users_table(rows), streams.rng(params.seed, "bootstrap")
    means = {(MODELS[k], m): _matrix(users, k, m).mean(axis=1) for k in MODELS for m in METHODS}  # per seed
    c = Conclusion(NAME, params, PAPER)
    c.headlines({f"{model}: {method} mean top-1": v for (model, method), v in means.items()})
    ratio = lambda k, m: float(np.mean(means[MODELS[k], m] / means[MODELS[k], CLOUD]))
    matrices = lambda *qs: tuple(_matrix(users, *kind_method(q)) for q in qs)
    measured = {e.claim: matrices(e.better, e.worse) for e in PAPER.effects}
    fed_rng, gap_rng = (streams.rng(params.seed, f"bootstrap/{n}") for n in ("fedavg-ablation", "feature-gap"))
    ablation = fedavg_ablation.table(users, PAPER, CLOUD, FED, params.seed, fed_rng, boots := params.bootstrap)
    control = fedavg_baseline.control_table(history, params.fedavg_control_tolerance, CLOUD, FED)
    why = fedavg_ablation.diagnoses(ablation, control)
    why |= gap_diagnoses(users, CUSTOM, CLOUD, text.table(), gap_rng, boots)
    if (res := (extra or {}).get("resolution")) is not None:
        extra = extra | dict(resolution=(res := feature_resolution.against_cloud(res, users, CLOUD, params.seed)))
        why |= feature_resolution.diagnosis(res, users, CLOUD, params.seed)
    effects = c.effects(measured, rng, n_boot=boots, statistic="mean", diagnoses=why)
    first = lambda effect: {"effect": effect, "paper change": np.nan}
    pairs = [(e, _matrix(users, k, b), _matrix(users, k, w)) for e, k, b, w in ORDERINGS]
    ordering = [effect_row(first(e), better, worse, rng, boots, "mean") for e, better, worse in pairs]
    c.effect_rows(pd.concat([effects, pd.DataFrame(ordering)], ignore_index=True))
    c.paper_vs_ours({n.quantity: ratio(*kind_method(n.quantity)) for n in PAPER.numbers})  # every one a ratio
    data = [text.table().drop(columns="public_words"), images.table().drop(columns="writers_read")]
    tables = {
        "users": users,
        "summary": summary_table(users, params),
        "training": pd.DataFrame(history),  # the convergence curves: a row per epoch (CloudTrain) or round (FedAvg)
        "stopping": report.stopping_table(pd.DataFrame(history)),
        "data": pd.concat(data, ignore_index=True),
        "pretraining": common.pretraining_table(pre),
        "rate_selection": rates,
        "fedavg_ablation": ablation,
        "fedavg_control": control,
    }
    tables |= {"tflite_check": tflite_check} if tflite_check is not None else {}
    tables |= {name: table for name, table in (extra or {}).items() if table is not None}
    # Shakespeare stands in for DeepType's keyboard logs, but is AutLearn's own data set (LEAF): no stand-in here
    data_summaries = [{**m.summary(), "stand_in_for": None} for m in text.manifests + [images.manifest]]
    data_summaries.append(common.mobilenet_weights(params)[0].summary())
    users_json = {"users.json": {"text": list(text.users), "image": list(images.users)}}
    notes = report.accuracy_notes(params, text, images, pre)
    return c.result(tables, data_summaries, None, wall_time_s, artifacts=users_json, **notes)


def run(params: Params, log=print) -> record.Result:
    """All stages in order, as the notebook runs them."""
    start = time.perf_counter()
    text, images = load(params, log)
    pre = pretrain(params, text, images, log)
    params, rates = choose_rates(params, text, images, pre, log)
    fedavg, fedavg_rates = fedavg_baseline.choose_all(params, text, images, pre, log)
    cloud, cloud_rates = cloud_choice.choose_all(params, text, images, pre, log)
    custom, custom_rates, custom_curves = choose_customize(params, text, images, pre, cloud, log)
    rates = pd.concat([rates, fedavg_rates, cloud_rates, custom_rates], ignore_index=True)
    rows, history = text_methods(params, text, pre, fedavg, cloud, custom, log)
    more, more_history = image_methods(params, images, pre, fedavg, cloud, custom, log)
    curve = feature_resolution.curve(params, images, log)
    extra = dict(customize_choice_training=pd.DataFrame(custom_curves), resolution=curve)
    check, wall = on_device(params, text, pre, log), time.perf_counter() - start
    return conclude(params, text, images, pre, rows + more, history + more_history, rates, check, wall, extra)
