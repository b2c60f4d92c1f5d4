"""AutLearn A5 (Fig. 8) and A6 (Fig. 9): what on-device training costs, and what AutLearn's
optimisations save: compression, a compiler, the inference cache, and energy under governors.

Every cost is a ratio measured in one run, baseline and technique side by side, per personal
epoch of AutLearn's on-device step (the last layer trains; every step runs the whole forward
pass, as on the paper's phones), batch 16 for the LSTM and 1 and 16 for MobileNet:

- Compression (cloud side, `techniques/autlearn/pruning.py`): the paper's structured pruning
  searched to `max_accuracy_drop` of validation accuracy; DeepType's SVD of the softmax at the
  smallest rank within the same drop; tensorflow-model-optimization's weight magnitude pruning at
  the highest sparsity within it. Parameters, FLOPs, size and epoch time per user.
- Compiler: the TensorFlow step (`tf.function`), the same step compiled by XLA (`jit_compile`)
  and the trainable TFLite file's `train` signature. The paper extended TVM with gradient
  operators and tuned it per phone; XLA and TFLite stand in for it here.
- Online learning with and without DeepType's inference cache (`inference_reuse`).
- Phones: the LSTM's epoch extrapolated to the Redmi Note 8 and the Nexus 6 from FLASH's
  measured per-layer training times (`device/availability.py`), labelled extrapolated.
- Energy (A6): the modelled meter of `device/energy` (the Nexus 6 power profile x busy time),
  un-optimised vs optimised (pruned, and XLA-compiled when times are measured) under the
  `performance` and `powersave` governors, normalised to un-optimised on `performance`.

Time is measured (steady-state step time after warm-up x steps, `time_source = "measured"`) or,
where a run must reproduce bit for bit (smoke: the suite diffs a run against its re-run),
counted: FLOPs from the layer shapes (`time_source = "counted"`); the compiler can only be
measured, so its table and verdicts always carry "time" in their column names.

Stages, one per notebook section: `load`, `compress`, `time_epochs`, `compiler`, `online`,
`phones`, `energy`, `conclude`; `run` calls them all.
"""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass

import numpy as np
import pandas as pd
import tf_keras as keras

from ondevice import streams
from ondevice.data import femnist
from ondevice.device import availability
from ondevice.device.energy import profiles
from ondevice.device.energy.base import MODELLED
from ondevice.device.energy.modelled import GovernorModel, ModelledMeter
from ondevice.models import mobilenet_v1
from ondevice.papers.autlearn import common
from ondevice.papers.autlearn.techniques import compiler as compiled_step
from ondevice.papers.autlearn.techniques import magnitude_pruning, pruning
from ondevice.papers.deeptype.techniques import inference_reuse, svd_compression
from ondevice.papers.deeptype.techniques.bucketing import EqualLength
from ondevice.papers.deeptype.techniques.fine_tune import FineTune
from ondevice.report import claims, record
from ondevice.tasks.classification import ClassificationTask
from ondevice.tasks.next_word import NextWordTask
from ondevice.training.trainer import Trainer, seed_everything

NAME = "autlearn_cost"
MODELS = common.MODEL_NAMES
PATHS = compiled_step.PATHS
BASELINE_GOVERNOR = "performance"

PAPER = claims.Paper(
    citation="Xu et al., AutLearn (JoS), Sec. 4.3, Fig. 8 (Samsung Note 8 / Redmi Note 8; LSTM batch 16, MobileNet "
    "batch 1) and Fig. 9 (Nexus 6, interactive vs powersave); the text gives relative numbers only",
    numbers=(
        claims.PaperNumber("epoch time, LSTM, uncompressed", 1.0, "Fig. 8: the baseline"),
        claims.PaperNumber(
            "epoch time, LSTM, structured pruning", 0.2, "Sec. 4.3: compression saves over 80% (1% accuracy loss)"
        ),
        claims.PaperNumber("epoch time, LSTM, SVD", 0.2, "Sec. 3.2 calls the compression SVD-based; same -80%"),
        claims.PaperNumber(
            "epoch time, LSTM, magnitude pruning", 0.2, "the same -80% (the paper names one compression)"
        ),
        claims.PaperNumber("epoch time, MobileNet batch 1, uncompressed", 1.0, "Fig. 8: the baseline"),
        claims.PaperNumber(
            "epoch time, MobileNet batch 1, structured pruning", 0.75, "Sec. 4.3: only 20%-30% less (midpoint)"
        ),
        claims.PaperNumber("epoch time, MobileNet batch 16, uncompressed", 1.0, "the paper's phones used batch 1"),
        claims.PaperNumber("epoch time, MobileNet batch 16, structured pruning", 0.75, "20%-30% at batch 1 (midpoint)"),
        claims.PaperNumber("online update time, LSTM, without cache", 1.0, "Fig. 8: the baseline"),
        claims.PaperNumber(
            "online update time, LSTM, with cache", 0.65, "Sec. 4.3: the cache saves 30%-40% (midpoint)"
        ),
        claims.PaperNumber("online update time, MobileNet, without cache", 1.0, "Fig. 8: the baseline"),
        claims.PaperNumber("online update time, MobileNet, with cache", 0.65, "Sec. 4.3: 30%-40% (midpoint)"),
        claims.PaperNumber("energy, LSTM, un-optimised, performance", 1.0, "Fig. 9: the normalisation baseline"),
        claims.PaperNumber("energy, LSTM, optimised, performance", 0.2, "Sec. 4.3: optimisations save over 80% (LSTM)"),
    ),
    effects=(
        claims.Effect(
            "structured pruning shortens the LSTM's epoch",
            "epoch time, LSTM, uncompressed",
            "epoch time, LSTM, structured pruning",
        ),
        claims.Effect("SVD shortens the LSTM's epoch", "epoch time, LSTM, uncompressed", "epoch time, LSTM, SVD"),
        claims.Effect(
            "magnitude pruning shortens the LSTM's epoch",
            "epoch time, LSTM, uncompressed",
            "epoch time, LSTM, magnitude pruning",
        ),
        claims.Effect(
            "structured pruning shortens MobileNet's epoch (batch 1)",
            "epoch time, MobileNet batch 1, uncompressed",
            "epoch time, MobileNet batch 1, structured pruning",
        ),
        claims.Effect(
            "structured pruning shortens MobileNet's epoch (batch 16)",
            "epoch time, MobileNet batch 16, uncompressed",
            "epoch time, MobileNet batch 16, structured pruning",
        ),
        claims.Effect(
            "the inference cache shortens online updates (LSTM)",
            "online update time, LSTM, without cache",
            "online update time, LSTM, with cache",
        ),
        claims.Effect(
            "the inference cache shortens online updates (MobileNet)",
            "online update time, MobileNet, without cache",
            "online update time, MobileNet, with cache",
        ),
        claims.Effect(
            "optimisations lower the LSTM's training energy (performance governor)",
            "energy, LSTM, un-optimised, performance",
            "energy, LSTM, optimised, performance",
        ),
    ),
)
PAPER_COMPILER_RATIO = 0.6  # Sec. 4.3: the compiler saves nearly 40%, both models
STAND_IN = (
    "the paper's full data sets and phones: LEAF Sent140's 8,692-tweet test split for the public text, 105 "
    "LEAF FEMNIST writers (a 5% sample; a few of them as the cloud's data in place of ImageNet), the suite's "
    "reading of LEAF's Shakespeare users, and this machine's CPU for the phones (energy modelled from the "
    "Nexus 6 power profile, phone times extrapolated from FLASH's measurements)"
)


@dataclass(frozen=True)
class Params(common.AutLearnParams):
    cost_text_users: int = 4  # personal users timed (drawn from the text users)
    cost_image_users: int = 4  # writers timed (drawn from those not kept as the cloud's data)
    cloud_writers: int = 6  # FEMNIST writers the cloud prunes MobileNet with (ImageNet is not here)
    max_accuracy_drop: float = 0.01  # compress until validation top-1 falls this much (absolute; the paper's 1%)
    prune_step: float = 0.25  # K = this share of the chosen layer's units, each round
    prune_rounds: int = 8  # at most
    prune_candidates: int = 0  # MobileNet layers tried per round, those with the most FLOPs (0: all)
    retrain_samples: int = 20000  # public samples per re-training epoch of a pruned LSTM (0: all)
    retrain_epochs: int = 1
    validation_samples: int = 5000  # public held-out samples the LSTM's accuracy is measured on (0: all)
    cloud_head_epochs: int = 15  # MobileNet: the head fitted on the cloud writers to score a backbone
    svd_fractions: tuple[float, ...] = (0.5, 0.25, 0.125, 0.0625)  # softmax ranks tried, x hidden units
    sparsities: tuple[float, ...] = (0.5, 0.75, 0.9)  # magnitude pruning tried
    image_batch_sizes: tuple[int, ...] = (1, 16)
    compiler_paths: tuple[str, ...] = PATHS  # tensorflow (the baseline) first; xla, tflite
    timing_steps: int = 30  # steps timed per user and variant (epoch time = mean step x steps)
    warmup_steps: int = 3
    time_source: str = "measured"  # measured | counted (FLOPs; reproduces bit for bit)
    online_samples: int = 256  # stream samples per user in the online comparison
    online_batch_size: int = 16  # the paper's default update size
    phones: tuple[str, ...] = ("redmi_note8", "nexus6")
    governors: tuple[str, ...] = ("performance", "powersave")
    device_profile: str = "nexus6"
    compute_bound: float = 1.0
    flops_per_cycle: float = 1.0  # counted time: FLOPs per cycle of the modelled CPU
    bootstrap: int = 2000

    PRESETS = common.presets(
        {
            "smoke": dict(
                text_users=3,
                cost_text_users=3,
                cost_image_users=3,
                cloud_writers=3,
                image_users=6,
                prune_rounds=1,
                prune_candidates=2,
                retrain_samples=500,
                validation_samples=500,
                cloud_head_epochs=3,
                svd_fractions=(0.25,),
                sparsities=(0.5,),
                timing_steps=3,
                warmup_steps=1,
                compiler_paths=("tensorflow", "xla"),
                time_source="counted",
                online_samples=64,
                bootstrap=300,
            ),
            # default: sized for the 10-minute budget on 2 cores: 4 users of each kind, shorter pruning
            # (each LSTM round scores 3 layers on 3,000 held-out tweets' samples and re-trains on 10,000)
            "default": dict(
                text_users=4,
                image_users=10,
                prune_candidates=3,
                prune_rounds=6,
                validation_samples=3000,
                retrain_samples=10000,
                cloud_head_epochs=8,
                svd_fractions=(0.25, 0.125, 0.0625),
                sparsities=(0.5, 0.8),
            ),
            "paper": dict(
                cost_text_users=20,
                cost_image_users=20,
                cloud_writers=20,
                prune_step=0.1,
                prune_rounds=30,
                retrain_samples=0,
                validation_samples=0,
                timing_steps=100,
            ),
        }
    )

    def check(self) -> None:
        super().check()
        for name in ("cost_text_users", "cost_image_users"):
            self.require(getattr(self, name) >= 2, name, "must be at least 2 (effects are paired over users)")
        for name in (
            "cloud_writers",
            "timing_steps",
            "retrain_epochs",
            "cloud_head_epochs",
            "online_batch_size",
            "online_samples",
        ):
            self.require(getattr(self, name) >= 1, name, "must be at least 1")
        for name in ("prune_rounds", "prune_candidates", "retrain_samples", "validation_samples", "warmup_steps"):
            self.require(getattr(self, name) >= 0, name, "must be >= 0")
        self.require(
            self.cost_text_users <= (self.text_users or 10**9), "cost_text_users", "must be at most text_users"
        )
        self.require(0 <= self.max_accuracy_drop < 1, "max_accuracy_drop", "must be in [0, 1)")
        self.require(0 < self.prune_step < 1, "prune_step", "must be in (0, 1)")
        self.require(all(0 < f < 1 for f in self.svd_fractions), "svd_fractions", "must be in (0, 1)")
        self.require(all(0 < s < 1 for s in self.sparsities), "sparsities", "must be in (0, 1)")
        self.require(
            bool(self.image_batch_sizes) and all(b >= 1 for b in self.image_batch_sizes),
            "image_batch_sizes",
            "must be positive batch sizes",
        )
        self.require(
            self.compiler_paths[:1] == ("tensorflow",)
            and set(self.compiler_paths) <= set(PATHS)
            and len(set(self.compiler_paths)) == len(self.compiler_paths) > 1,
            "compiler_paths",
            f"must start with 'tensorflow' and add some of {PATHS[1:]}, each once",
        )
        self.require(self.time_source in ("measured", "counted"), "time_source", "must be 'measured' or 'counted'")
        self.require(
            set(self.phones) <= set(availability.PHONES), "phones", f"must be among {sorted(availability.PHONES)}"
        )
        self.require(
            self.governors[:1] == (BASELINE_GOVERNOR,) and len(set(self.governors)) == len(self.governors),
            "governors",
            "must start with 'performance' (the baseline) and not repeat",
        )
        self.require(
            self.device_profile in profiles.DEVICES, "device_profile", f"must be one of {sorted(profiles.DEVICES)}"
        )
        self.require(0 <= self.compute_bound <= 1, "compute_bound", "must be in [0, 1]")
        self.require(self.flops_per_cycle > 0, "flops_per_cycle", "must be positive")
        self.require(self.bootstrap >= 100, "bootstrap", "must be at least 100 resamples")

    def governor_model(self) -> GovernorModel:
        return GovernorModel(profiles.device(self.device_profile).profile(), compute_bound=self.compute_bound)


# ---- data and models ----------------------------------------------------------------------------


@dataclass
class Data:
    text: common.TextData
    images: common.ImageData
    text_users: tuple[str, ...]  # timed
    image_users: tuple[str, ...]  # timed
    cloud_writers: tuple[str, ...]  # the cloud's labelled images for pruning MobileNet
    models: dict[str, common.Pretrained]

    def table(self) -> pd.DataFrame:
        rows = [
            {
                "model": "LSTM",
                "role": "timed users (Shakespeare)",
                "users": len(self.text_users),
                "samples": sum(len(self.text.train[u]) for u in self.text_users),
            },
            {
                "model": "LSTM",
                "role": "cloud: Sent140 held out (pruning's validation)",
                "users": "",
                "samples": len(self.text.public_holdout),
            },
            {
                "model": "MobileNet",
                "role": "timed writers (FEMNIST)",
                "users": len(self.image_users),
                "samples": sum(len(self.images.train[u][1]) for u in self.image_users),
            },
            {
                "model": "MobileNet",
                "role": "cloud: writers kept apart (pruning's data)",
                "users": len(self.cloud_writers),
                "samples": sum(len(self.images.train[u][1]) + len(self.images.test[u][1]) for u in self.cloud_writers),
            },
        ]
        return pd.DataFrame(rows)


def load(params: Params, log=print) -> Data:
    """The shared AutLearn data and public pre-trained models; the timed users and the cloud's
    writers are drawn from their own streams (the cloud's writers are never timed)."""
    seed_everything(params.seed)
    text, images = common.load_text(params, log), common.load_images(params, log)
    pick = streams.rng(params.seed, "autlearn-cost/text-users").choice(
        len(text.users), params.cost_text_users, replace=False
    )
    order = streams.rng(params.seed, "autlearn-cost/writers").permutation(len(images.users))
    if len(order) < params.cloud_writers + params.cost_image_users:
        raise ValueError(
            f"parameters 'cloud_writers' + 'cost_image_users' need {params.cloud_writers + params.cost_image_users} "
            f"writers; the data has {len(order)}"
        )
    cloud = tuple(sorted(images.users[i] for i in order[: params.cloud_writers]))
    timed = tuple(
        sorted(images.users[i] for i in order[params.cloud_writers : params.cloud_writers + params.cost_image_users])
    )
    models = {"text": common.pretrained_text(params, text, log), "image": common.pretrained_image(params, images, log)}
    return Data(text, images, tuple(sorted(text.users[i] for i in pick)), timed, cloud, models)


def _subset(samples, n: int, rng):
    from ondevice.data.typing_samples import Samples

    if not n or n >= len(samples):
        return samples
    idx = np.sort(rng.choice(len(samples), n, replace=False))
    parts = [samples.inputs[samples.offsets[j] : samples.offsets[j + 1]] for j in idx]
    labels = [samples.labels[samples.offsets[j] : samples.offsets[j + 1]] for j in idx]
    offsets = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(samples.offsets.dtype)
    return Samples(
        np.concatenate(parts),
        np.concatenate(labels),
        offsets,
        samples.n_context[idx],
        samples.word_len[idx],
        samples.target[idx],
    )


def copy_model(model: keras.Model) -> keras.Model:
    twin = keras.models.clone_model(model)
    twin.set_weights(model.get_weights())
    return twin


# ---- compression ----------------------------------------------------------------------------


@dataclass
class Compressed:
    kind: str
    method: str  # uncompressed | structured pruning | SVD | magnitude pruning
    model: keras.Model
    detail: str
    val_top1: float
    head: str


def _text_cloud(params: Params, data: Data):
    """Evaluate (public held-out top-1) and re-train (public samples, the pre-training's optimizer)."""
    rng = streams.rng(params.seed, "autlearn-cost/cloud-text")
    holdout = _subset(data.text.public_holdout, params.validation_samples, rng)
    public = data.text.public_train

    def evaluate(model):
        return common.score_text(model, holdout, params.k)["top1"]

    def retrain(model):
        trainer = Trainer(model, NextWordTask(params.k), params.pretrain_learning_rate, "adam", hooks=[EqualLength()])
        sub = _subset(public, params.retrain_samples, streams.rng(params.seed, "autlearn-cost/retrain-sample"))
        trainer.fit(
            sub, params.retrain_epochs, params.pretrain_batch_size, streams.rng(params.seed, "autlearn-cost/retrain")
        )

    return evaluate, retrain


def _image_cloud(params: Params, data: Data):
    """A backbone's score: the head fitted on the cloud writers' training images (features once),
    top-1 on their test images. No ImageNet here, so a pruned backbone is not re-trained."""
    imgs = data.images
    train = (
        np.concatenate([imgs.train[u][0] for u in data.cloud_writers]),
        np.concatenate([imgs.train[u][1] for u in data.cloud_writers]),
    )
    test = (
        np.concatenate([imgs.test[u][0] for u in data.cloud_writers]),
        np.concatenate([imgs.test[u][1] for u in data.cloud_writers]),
    )

    def evaluate(model):
        feats = keras.Model(model.input, model.get_layer(common.LAST_LAYER["image"]).input)
        head = mobilenet_v1.head_model(model)
        head.get_layer(common.LAST_LAYER["image"]).set_weights(
            data.models["image"].model.get_layer(common.LAST_LAYER["image"]).get_weights()
        )
        f = lambda x: np.concatenate([feats(x[i : i + 256], training=False).numpy() for i in range(0, len(x), 256)])
        trainer = Trainer(
            head,
            ClassificationTask((head.input_shape[-1],), femnist.CLASSES),
            params.image_personal_learning_rate,
            params.image_personal_optimizer,
        )
        trainer.fit(
            (f(train[0]), train[1]),
            params.cloud_head_epochs,
            params.image_personal_batch_size,
            streams.rng(params.seed, "autlearn-cost/cloud-head"),
        )
        pred = head(f(test[0]), training=False).numpy().argmax(-1)
        return float((pred == test[1]).mean())

    return evaluate, lambda model: None


def compress(params: Params, data: Data, log=print) -> tuple[dict[str, list[Compressed]], pd.DataFrame]:
    """Per model: the uncompressed model and each compression within the accuracy budget, and
    the structured search's rounds. MobileNet gets structured pruning only: its FC head (256 x 62)
    is too small for SVD or sparsity to matter, and its backbone cannot be re-trained here."""
    out, rounds = {}, []
    for kind in ("text", "image"):
        pre = data.models[kind]
        pre.model.set_weights(pre.weights)
        evaluate, retrain = (_text_cloud if kind == "text" else _image_cloud)(params, data)
        base = pruning.flatten(pre.model) if kind == "image" else copy_model(pre.model)
        layers = pruning.candidates(base)
        if kind == "image" and params.prune_candidates:
            layers = sorted(layers, key=lambda n: -pruning.layer_flops(base.get_layer(n)))[: params.prune_candidates]
        head = common.LAST_LAYER[kind]
        best, rs, base_acc = pruning.search(
            base,
            evaluate,
            retrain,
            step=params.prune_step,
            max_drop=params.max_accuracy_drop,
            max_rounds=params.prune_rounds,
            layers=layers,
            log=lambda m, k=kind: log(f"{MODELS[k]}: {m}"),
        )
        rounds += [{"model": MODELS[kind], **r.__dict__} for r in rs]
        widths = ", ".join(
            f"{n} {pruning.width(base.get_layer(n))}->{pruning.width(best.get_layer(n))}"
            for n in layers
            if pruning.width(base.get_layer(n)) != pruning.width(best.get_layer(n))
        )
        variants = [
            Compressed(kind, "uncompressed", base, "the public pre-trained model", base_acc, head),
            Compressed(
                kind,
                "structured pruning",
                best,
                widths or "no round within the budget",
                evaluate(best) if best is not base else base_acc,
                head,
            ),
        ]
        if kind == "text":
            variants += [
                _svd(params, base, evaluate, retrain, base_acc, log),
                _sparse(params, base, evaluate, base_acc, log),
            ]
        out[kind] = variants
    return out, pd.DataFrame(rounds)


def _svd(params, base, evaluate, retrain, base_acc, log) -> Compressed:
    """DeepType's SVD of the softmax at the smallest tried rank whose re-trained model stays within
    the budget (the largest rank when none does: it is reported, with its accuracy)."""
    hidden = int(base.get_layer(svd_compression.SOFTMAX).input_shape[-1])
    chosen = None
    for fraction in sorted(params.svd_fractions, reverse=True):
        rank = svd_compression.rank_for(hidden, fraction)
        model = svd_compression.compress(base, rank)
        retrain(model)
        acc = evaluate(model)
        log(f"LSTM: SVD rank {rank}: accuracy {acc:.4f} (uncompressed {base_acc:.4f})")
        if chosen is None or acc >= base_acc - params.max_accuracy_drop:
            chosen = Compressed("text", "SVD", model, f"softmax rank {rank} of {hidden}", acc, svd_compression.SOFTMAX)
        if acc < base_acc - params.max_accuracy_drop:
            break
    return chosen


def _sparse(params, base, evaluate, base_acc, log) -> Compressed:
    """Magnitude pruning at the highest tried sparsity within the budget (the lowest when none is)."""
    chosen = None
    for sparsity in sorted(params.sparsities):
        model = magnitude_pruning.prune(base, sparsity)
        acc = evaluate(model)
        log(f"LSTM: magnitude pruning {sparsity:.0%}: accuracy {acc:.4f} (uncompressed {base_acc:.4f})")
        if chosen is None or acc >= base_acc - params.max_accuracy_drop:
            chosen = Compressed("text", "magnitude pruning", model, f"{sparsity:.0%} of weights zero", acc, "softmax")
        if acc < base_acc - params.max_accuracy_drop:
            break
    return chosen


def compression_table(variants: dict[str, list[Compressed]]) -> pd.DataFrame:
    rows = []
    for kind, vs in variants.items():
        base = vs[0]
        for v in vs:
            blob = b"".join(np.asarray(w, np.float32).tobytes() for w in v.model.get_weights())
            rows.append(
                {
                    "model": MODELS[kind],
                    "method": v.method,
                    "detail": v.detail,
                    "parameters": pruning.parameters(v.model),
                    "nonzero_parameters": magnitude_pruning.nonzero_parameters(v.model),
                    "forward_mflops": pruning.forward_flops(v.model) / 1e6,
                    "size_mb_float32": len(blob) / 1e6,
                    "size_mb_zlib": len(zlib.compress(blob, 6)) / 1e6,
                    "val_top1": v.val_top1,
                    "accuracy_drop": base.val_top1 - v.val_top1,
                }
            )
    table = pd.DataFrame(rows)
    first = table.groupby("model").transform("first")
    for col in ("parameters", "forward_mflops", "size_mb_zlib"):
        table[f"{col}_ratio"] = table[col] / first[col]
    return table


# ---- the training step on each path -----------------------------------------------------------


def _batches(kind: str, params: Params, data_part, batch: int, rng):
    """One personal epoch's batches: equal-length buckets for the LSTM (the paper's bucketing)."""
    if kind == "text":
        return EqualLength().batches(NextWordTask(params.k), data_part, batch, rng)
    return list(common.image_task().batches(data_part, batch, rng))


def _task(kind: str, params: Params):
    return NextWordTask(params.k) if kind == "text" else common.image_task()


def _optimizer(kind: str, params: Params) -> tuple[str, float]:
    return (
        (params.text_personal_optimizer, params.text_personal_learning_rate)
        if kind == "text"
        else (params.image_personal_optimizer, params.image_personal_learning_rate)
    )


def step_function(path: str, model: keras.Model, kind: str, params: Params, head: str):
    """One last-layer training step on `path` at this kind's personal optimizer (`techniques/compiler.py`)."""
    return compiled_step.step_function(path, model, _task(kind, params), *_optimizer(kind, params), [FineTune(head)])


def time_steps(step, batches, params: Params) -> tuple[float, int]:
    """Mean steady-state seconds per step and the steps timed: the first `timing_steps` batches of
    the epoch, in order, after every distinct batch shape among them ran `warmup_steps` times
    untimed (tracing; XLA compiles once per shape)."""
    seen = {}
    for x, y in batches[: params.timing_steps]:
        if np.shape(x) not in seen:
            seen[np.shape(x)] = (x, y)
    for x, y in seen.values():
        for _ in range(params.warmup_steps):
            step(x, y)
    times = []
    for x, y in batches[: params.timing_steps]:
        t0 = time.perf_counter()
        step(x, y)
        times.append(time.perf_counter() - t0)
    return float(np.mean(times)), len(times)


def counted_seconds(flops: float, params: Params) -> float:
    """Busy seconds of counted work on the modelled CPU at its reference (top) speed."""
    return flops / (params.flops_per_cycle * params.governor_model().ref_khz * 1e3)


def _epoch_flops(model, head, batches) -> float:
    return float(
        sum(
            pruning.last_layer_train_flops(model, head, int(np.asarray(x).size if np.ndim(x) == 2 else len(x)))
            for x, _ in batches
        )
    )


def _user_data(data: Data, kind: str):
    users = data.text_users if kind == "text" else data.image_users
    part = data.text.train if kind == "text" else data.images.train
    return users, part


def time_epochs(params: Params, data: Data, variants: dict[str, list[Compressed]], log=print) -> pd.DataFrame:
    """Per model, batch size, timed user and compression: one personal epoch of last-layer training
    on the TensorFlow path, in seconds (measured: mean steady step x steps; counted: FLOPs on the
    modelled CPU), with its counted GFLOPs beside it."""
    with compiled_step.quiet_tracing():
        return pd.DataFrame(_time_epochs(params, data, variants, log))


def _time_epochs(params: Params, data: Data, variants: dict[str, list[Compressed]], log) -> list[dict]:
    rows = []
    for kind, vs in variants.items():
        users, part = _user_data(data, kind)
        sizes = (params.text_personal_batch_size,) if kind == "text" else params.image_batch_sizes
        for v in vs:
            step = (
                step_function("tensorflow", v.model, kind, params, v.head) if params.time_source == "measured" else None
            )
            for batch in sizes:
                for user in users:
                    batches = list(
                        _batches(
                            kind, params, part[user], batch, streams.rng(params.seed, f"autlearn-cost/epoch/{user}")
                        )
                    )
                    flops = _epoch_flops(v.model, v.head, batches)
                    if step is not None:
                        per_step, timed = time_steps(step, batches, params)
                        seconds = per_step * len(batches)
                    else:
                        seconds, timed = counted_seconds(flops, params), 0
                    rows.append(
                        {
                            "model": MODELS[kind],
                            "batch": batch,
                            "user": user,
                            "method": v.method,
                            "steps": len(batches),
                            "gflops": flops / 1e9,
                            "steps_timed": timed,
                            "epoch_seconds": seconds,
                        }
                    )
            log(f"{MODELS[kind]} {v.method}: {len(users)} users timed at batch {', '.join(map(str, sizes))}")
    return rows


def compiler(params: Params, data: Data, variants: dict[str, list[Compressed]], log=print) -> pd.DataFrame:
    """Per model, batch size and timed user: the uncompressed model's epoch on each path, always
    measured (compilers change time, not FLOPs). The losses of each path's first step on the
    same batch from the same weights are kept: they must agree."""
    with compiled_step.quiet_tracing():
        return pd.DataFrame(_compiler(params, data, variants, log))


def _compiler(params: Params, data: Data, variants: dict[str, list[Compressed]], log) -> list[dict]:
    rows = []
    for kind, vs in variants.items():
        base = vs[0]
        users, part = _user_data(data, kind)
        sizes = (params.text_personal_batch_size,) if kind == "text" else params.image_batch_sizes
        start = base.model.get_weights()
        for path in params.compiler_paths:
            base.model.set_weights(start)
            step = step_function(path, base.model, kind, params, base.head)
            for batch in sizes:
                for user in users:
                    batches = list(
                        _batches(
                            kind, params, part[user], batch, streams.rng(params.seed, f"autlearn-cost/epoch/{user}")
                        )
                    )
                    per_step, timed = time_steps(step, batches, params)
                    rows.append(
                        {
                            "model": MODELS[kind],
                            "batch": batch,
                            "user": user,
                            "path": path,
                            "steps": len(batches),
                            "epoch_time_seconds": per_step * len(batches),
                            "steps_timed_time": timed,
                        }
                    )
            log(f"{MODELS[kind]} on {path}: timed")
        base.model.set_weights(start)
    return rows


def first_step_losses(params: Params, data: Data, variants: dict[str, list[Compressed]]) -> pd.DataFrame:
    """The loss of one step on each path from the same weights on the same batch (a parity check)."""
    rows = []
    for kind, vs in variants.items():
        base = vs[0]
        users, part = _user_data(data, kind)
        batch = next(iter(_batches(kind, params, part[users[0]], 16, streams.rng(params.seed, "autlearn-cost/parity"))))
        start = base.model.get_weights()
        losses = {}
        for path in params.compiler_paths:
            base.model.set_weights(start)
            with compiled_step.quiet_tracing():
                losses[path] = step_function(path, base.model, kind, params, base.head)(*batch)
        base.model.set_weights(start)
        rows += [
            {"model": MODELS[kind], "path": p, "first_step_loss": l, "abs_difference": abs(l - losses["tensorflow"])}
            for p, l in losses.items()
        ]
    return pd.DataFrame(rows)


# ---- online learning with and without the inference cache --------------------------------------


def online(params: Params, data: Data, variants: dict[str, list[Compressed]], log=print) -> pd.DataFrame:
    """Per model and timed user: the updates of an online stream (every `online_batch_size`
    samples, in order) with and without the cache. Without: the fine-tune step (a forward pass
    through every layer, then the head's gradient). With: the head's update from the features the
    prediction already computed. Inference itself is the same on both sides and not counted."""
    with compiled_step.quiet_tracing():
        return pd.DataFrame(_online(params, data, variants, log))


def _online(params: Params, data: Data, variants: dict[str, list[Compressed]], log) -> list[dict]:
    rows = []
    for kind, vs in variants.items():
        base = vs[0]
        users, part = _user_data(data, kind)
        start = base.model.get_weights()
        optimizer, lr = _optimizer(kind, params)
        trainer = (
            inference_reuse.OnlineTrainer(base.model, _task(kind, params), lr, optimizer, head=base.head)
            if params.time_source == "measured"
            else None
        )
        for user in users:
            batches = _stream(kind, part[user], params)
            without = _epoch_flops(base.model, base.head, batches)
            head = base.model.get_layer(base.head)
            trained = sum(int(np.prod(w.shape)) for w in head.trainable_weights)
            with_ = float(sum(_positions(x) * 2 * pruning.layer_flops(head) + 12.0 * trained for x, _ in batches))
            if trainer is not None:
                trainer.reset(start)
                t_without, _ = time_steps(
                    lambda x, y, step=trainer.step_without_reuse: float(step(x, y)), batches, params
                )
                trainer.reset(start)
                feats = [trainer.infer_and_cache(x)["features"] for x, _ in batches]
                cached = dict(zip([id(x) for x, _ in batches], feats))
                t_with, _ = time_steps(
                    lambda x, y, step=trainer.train_from_cache, c=cached: float(step(c[id(x)], y)), batches, params
                )
                seconds = {"without cache": t_without * len(batches), "with cache": t_with * len(batches)}
            else:
                seconds = {
                    "without cache": counted_seconds(without, params),
                    "with cache": counted_seconds(with_, params),
                }
            for cond, flops in (("without cache", without), ("with cache", with_)):
                rows.append(
                    {
                        "model": MODELS[kind],
                        "user": user,
                        "condition": cond,
                        "updates": len(batches),
                        "gflops": flops / 1e9,
                        "update_seconds": seconds[cond],
                    }
                )
        base.model.set_weights(start)
        log(f"{MODELS[kind]}: online updates timed for {len(users)} users")
    return rows


def _positions(x) -> int:
    return int(np.asarray(x).size if np.ndim(x) == 2 else len(x))


def _stream(kind: str, part, params: Params) -> list:
    """The user's first `online_samples` samples in order, in batches of `online_batch_size`."""
    n = min(params.online_samples, len(part) if kind == "text" else len(part[1]))
    b = params.online_batch_size
    if kind == "text":
        return [part.padded(np.arange(i, min(i + b, n))) for i in range(0, n, b)]
    return [(part[0][i : i + b], part[1][i : i + b]) for i in range(0, n, b)]


# ---- phones ---------------------------------------------------------------------------------------


def phones(
    params: Params, data: Data, variants: dict[str, list[Compressed]], log=print
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The LSTM's personal epoch extrapolated to phones from FLASH's per-layer DL4J training times:
    the head's training time, plus a third of each lower layer's (its forward pass only: backward
    costs about twice the forward), summed over the epoch's batches at their lengths. Every number
    is an extrapolation, and lengths beyond FLASH's 2-10 rest on the fit's linearity."""
    fits = availability.load_layer_times(params.phones)
    rows = []
    for v in variants["text"]:
        layers = _lstm_layers(v.model)
        for user in data.text_users:
            batches = list(
                _batches(
                    "text",
                    params,
                    data.text.train[user],
                    params.text_personal_batch_size,
                    streams.rng(params.seed, f"autlearn-cost/epoch/{user}"),
                )
            )
            for phone, fit in fits.items():
                seconds = 0.0
                for x, _ in batches:
                    b, s = np.shape(x)
                    for kind_, d, n, trains in layers:
                        t = float(fit.layer_seconds(kind_, d, n, b, s))
                        if kind_ in ("embedding", "lstm"):  # upstream's minimal head is inside these times
                            t -= float(fit.layer_seconds("output", n, availability.HEAD_UNITS, b, s))
                        seconds += t if trains else t / 3
                rows.append(
                    {
                        "phone": availability.PHONES[phone],
                        "method": v.method,
                        "user": user,
                        "steps": len(batches),
                        "epoch_seconds_extrapolated": seconds,
                        "label": "extrapolated",
                    }
                )
    table = pd.DataFrame(rows)
    base = table[table.method == "uncompressed"].set_index(["phone", "user"]).epoch_seconds_extrapolated
    table["time_ratio_to_uncompressed"] = table.epoch_seconds_extrapolated / table.set_index(
        ["phone", "user"]
    ).index.map(base)
    fit_table = pd.DataFrame([r for f in fits.values() for r in f.fit])
    log(f"phones: {', '.join(availability.PHONES[p] for p in fits)} (extrapolated from FLASH's measurements)")
    return table, fit_table


def _lstm_layers(model) -> list[tuple[str, int, int, bool]]:
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


# ---- energy -------------------------------------------------------------------------------------


def energy(params: Params, epochs: pd.DataFrame, compiled: pd.DataFrame | None) -> pd.DataFrame:
    """Modelled energy of each timed user's LSTM epoch, un-optimised (uncompressed, TensorFlow)
    and optimised (structured pruning; with measured time also the XLA/TensorFlow time ratio of
    the user's uncompressed epoch, the compiler's saving), under each governor, normalised to the
    user's un-optimised epoch on `performance`."""
    device = profiles.device(params.device_profile)
    model = params.governor_model()
    lstm = epochs[epochs.model == "LSTM"].set_index(["user", "method"]).epoch_seconds
    rows = []
    for user in sorted(set(epochs[epochs.model == "LSTM"].user)):
        busy = {"un-optimised": lstm[(user, "uncompressed")], "optimised": lstm[(user, "structured pruning")]}
        if params.time_source == "measured" and compiled is not None and "xla" in params.compiler_paths:
            c = compiled[(compiled.model == "LSTM") & (compiled.user == user)].set_index("path").epoch_time_seconds
            busy["optimised"] *= min(1.0, c["xla"] / c["tensorflow"])
        for governor in params.governors:
            meter = ModelledMeter(model, governor, device.nominal_voltage, device=device.name)
            for variant, b in busy.items():
                r = meter.reading_for(b)
                rows.append(
                    {
                        "user": user,
                        "governor": governor,
                        "variant": variant,
                        "energy_j": r.joules,
                        "seconds": r.seconds,
                        "label": MODELLED,
                        "note": f"{device.name} profile, {r.note}",
                    }
                )
    table = pd.DataFrame(rows)
    base = table[(table.variant == "un-optimised") & (table.governor == BASELINE_GOVERNOR)].set_index("user")
    table["energy_norm"] = table.energy_j / table.user.map(base.energy_j)
    table["time_norm"] = table.seconds / table.user.map(base.seconds)
    return table


# ---- conclusions --------------------------------------------------------------------------------


def _wide(table: pd.DataFrame, value: str, **where) -> np.ndarray:
    sel = table
    for k, v in where.items():
        sel = sel[sel[k] == v]
    return sel.sort_values("user")[value].to_numpy(float)


def _measured(epochs, online_table, energy_table) -> dict[str, np.ndarray]:
    """Per-user values of every quantity the paper names, keyed by its name."""
    out = {}
    lstm = {
        "uncompressed": "uncompressed",
        "structured pruning": "structured pruning",
        "SVD": "SVD",
        "magnitude pruning": "magnitude pruning",
    }
    for method, label in lstm.items():
        out[f"epoch time, LSTM, {label}"] = _wide(epochs, "epoch_seconds", model="LSTM", method=method)
    for batch in sorted(set(epochs[epochs.model == "MobileNet"].batch)):
        for method in ("uncompressed", "structured pruning"):
            out[f"epoch time, MobileNet batch {batch}, {method}"] = _wide(
                epochs, "epoch_seconds", model="MobileNet", method=method, batch=batch
            )
    for model in ("LSTM", "MobileNet"):
        for cond in ("without cache", "with cache"):
            out[f"online update time, {model}, {cond}"] = _wide(
                online_table, "update_seconds", model=model, condition=cond
            )
    for variant in ("un-optimised", "optimised"):
        out[f"energy, LSTM, {variant}, performance"] = _wide(
            energy_table, "energy_j", variant=variant, governor=BASELINE_GOVERNOR
        )
    return out


def compiler_effects(params: Params, compiled: pd.DataFrame) -> pd.DataFrame:
    """TensorFlow's epoch time over each compiled path's, per model and batch, judged like the
    effects (paired bootstrap over users); every column names time (timings differ per run)."""
    rows = []
    for (model, batch), sub in compiled.groupby(["model", "batch"]):
        tf_time = _wide(sub, "epoch_time_seconds", path="tensorflow")
        for path in params.compiler_paths[1:]:
            r = claims.paired_effect(
                tf_time,
                _wide(sub, "epoch_time_seconds", path=path),
                streams.rng(params.seed, f"bootstrap/compiler/{model}/{batch}/{path}"),
                n_boot=params.bootstrap,
            )
            rows.append(
                {
                    "time effect": f"{path} shortens {model}'s epoch (batch {batch})",
                    "paper time change": 1 / PAPER_COMPILER_RATIO - 1,
                    "our time change": r["change"],
                    "ci low (time)": r["ci_low"],
                    "ci high (time)": r["ci_high"],
                    "users (time)": r["users"],
                    "verdict (time)": r["verdict"],
                }
            )
    return pd.DataFrame(rows)


def governor_claims(params: Params, energy_table: pd.DataFrame) -> pd.DataFrame:
    """Fig. 9's directions without numbers: powersave takes longer and uses less energy."""
    rows = []
    for g in params.governors[1:]:
        for variant in ("un-optimised", "optimised"):
            checks = (
                (
                    f"{g} lowers the energy of {variant} training",
                    "less energy (Fig. 9)",
                    ("energy_j", BASELINE_GOVERNOR),
                    ("energy_j", g),
                ),
                (
                    f"{g} makes {variant} training take longer",
                    "more time (Fig. 9)",
                    ("seconds", g),
                    ("seconds", BASELINE_GOVERNOR),
                ),
            )
            for claim, paper, (col_b, g_b), (col_w, g_w) in checks:
                r = claims.paired_effect(
                    _wide(energy_table, col_b, variant=variant, governor=g_b),
                    _wide(energy_table, col_w, variant=variant, governor=g_w),
                    streams.rng(params.seed, f"bootstrap/{claim}"),
                    n_boot=params.bootstrap,
                )
                rows.append(
                    {
                        "effect": claim,
                        "label": MODELLED,
                        "paper": paper,
                        "our change": r["change"],
                        "ci low": r["ci_low"],
                        "ci high": r["ci_high"],
                        "users": r["users"],
                        "verdict": r["verdict"],
                    }
                )
    return pd.DataFrame(rows)


def conclude(
    params: Params,
    data: Data,
    variants,
    rounds: pd.DataFrame,
    epochs: pd.DataFrame,
    compiled: pd.DataFrame,
    parity: pd.DataFrame,
    online_table: pd.DataFrame,
    phone_table: pd.DataFrame,
    fit_table: pd.DataFrame,
    energy_table: pd.DataFrame,
    wall_time_s: float,
) -> record.Result:
    measured = _measured(epochs, online_table, energy_table)
    ratios = {}
    for n in PAPER.numbers:  # medians over users, relative to the quantity's baseline
        baseline = next((e.better for e in PAPER.effects if e.worse == n.quantity), n.quantity)
        ratios[n.quantity] = float(np.median(measured[n.quantity]) / np.median(measured[baseline]))
    numbers = claims.paper_vs_ours(PAPER, ratios)
    numbers["ours from"] = [
        ("modelled energy: " if q.startswith("energy") else "")
        + ("counted FLOPs" if params.time_source == "counted" else "measured time on this machine")
        for q in numbers.quantity
    ]
    effects = claims.effects_table(
        PAPER,
        {e.claim: (measured[e.better], measured[e.worse]) for e in PAPER.effects},
        streams.rng(params.seed, "bootstrap"),
        n_boot=params.bootstrap,
    )
    headline = {f"{e.claim}: change": claims.headline([c]) for e, c in zip(PAPER.effects, effects["our change"])}
    tables = {
        "compression": compression_table(variants),
        "pruning_rounds": rounds,
        "epochs": epochs,
        "compiler_time": compiled,
        "compiler_time_effects": compiler_effects(params, compiled),
        "compiler_parity": parity,
        "online": online_table,
        "phone_times": phone_table,
        "layer_time_fit": fit_table,
        "energy": energy_table,
        "governor_claims": governor_claims(params, energy_table),
        "paper_vs_ours": numbers,
        "effects": effects,
        "headline": claims.headline_table(headline),
    }
    texts = data.text.manifests
    return record.Result(
        experiment=NAME,
        params=params.to_dict(),
        tables=tables,
        headline=headline,
        data=[m.summary() for m in (*texts, data.images.manifest)],
        stand_in_data=STAND_IN,
        wall_time_s=wall_time_s,
        notes={
            "time_source": params.time_source,
            "energy_label": MODELLED,
            "timed_text_users": list(data.text_users),
            "timed_writers": list(data.image_users),
            "cloud_writers": list(data.cloud_writers),
            "compiler_stand_in": "XLA (jit_compile) and the TFLite train signature stand in for the "
            "paper's extended TVM",
            "phone_times": "extrapolated from FLASH's per-layer DL4J measurements",
        },
    )


def run(params: Params, log=print) -> record.Result:
    start = time.perf_counter()
    data = load(params, log)
    variants, rounds = compress(params, data, log)
    epochs = time_epochs(params, data, variants, log)
    compiled = compiler(params, data, variants, log)
    parity = first_step_losses(params, data, variants)
    online_table = online(params, data, variants, log)
    phone_table, fit_table = phones(params, data, variants, log)
    energy_table = energy(params, epochs, compiled)
    return conclude(
        params,
        data,
        variants,
        rounds,
        epochs,
        compiled,
        parity,
        online_table,
        phone_table,
        fit_table,
        energy_table,
        time.perf_counter() - start,
    )


# ---- figures --------------------------------------------------------------------------------------


def plot_times(epochs: pd.DataFrame, compiled: pd.DataFrame, online_table: pd.DataFrame):
    """Fig. 8 as ratios: each technique's median epoch (or update) time over its baseline's, per
    model; dots are single users."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    rows = []
    for (model, batch), sub in epochs.groupby(["model", "batch"]):
        base = sub[sub.method == "uncompressed"].set_index("user").epoch_seconds
        for r in sub[sub.method != "uncompressed"].itertuples():
            rows.append(
                {"setting": f"{model} b{batch}", "technique": r.method, "ratio": r.epoch_seconds / base[r.user]}
            )
    for (model, batch), sub in compiled.groupby(["model", "batch"]):
        base = sub[sub.path == "tensorflow"].set_index("user").epoch_time_seconds
        for r in sub[sub.path != "tensorflow"].itertuples():
            rows.append(
                {
                    "setting": f"{model} b{batch}",
                    "technique": f"compiler: {r.path}",
                    "ratio": r.epoch_time_seconds / base[r.user],
                }
            )
    for model, sub in online_table.groupby("model"):
        base = sub[sub.condition == "without cache"].set_index("user").update_seconds
        for r in sub[sub.condition == "with cache"].itertuples():
            rows.append(
                {"setting": f"{model} online", "technique": "inference cache", "ratio": r.update_seconds / base[r.user]}
            )
    data = pd.DataFrame(rows)
    fig, ax = plt.subplots(figsize=(9, 4))
    sns.barplot(data=data, x="setting", y="ratio", hue="technique", estimator=np.median, errorbar=None, ax=ax)
    sns.stripplot(
        data=data, x="setting", y="ratio", hue="technique", dodge=True, size=3, color="0.2", legend=False, ax=ax
    )
    ax.axhline(1, color="0.5", lw=0.8, ls="--")
    ax.set(
        ylabel="time / baseline's (median over users)",
        xlabel="",
        title="Training time of each technique relative to its baseline",
    )
    sns.move_legend(ax, "upper left", bbox_to_anchor=(1, 1), frameon=False, fontsize=8)
    sns.despine(fig)
    fig.tight_layout()
    return fig


def plot_energy(energy_table: pd.DataFrame):
    """Fig. 9: modelled energy and time, normalised to un-optimised training on `performance`."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for ax, (col, what) in zip(axes, (("energy_norm", "energy"), ("time_norm", "training time"))):
        sns.barplot(
            data=energy_table,
            x="governor",
            y=col,
            hue="variant",
            estimator=np.median,
            errorbar=None,
            ax=ax,
            legend=ax is axes[0],
        )
        ax.axhline(1, color="0.5", lw=0.8, ls="--")
        ax.set(ylabel=f"normalised {what}", title=f"LSTM {what} (modelled, {energy_table.note.iloc[0].split(',')[0]})")
        ax.title.set_fontsize(9)
    sns.despine(fig)
    fig.tight_layout()
    return fig
