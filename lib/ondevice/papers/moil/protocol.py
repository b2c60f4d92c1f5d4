"""MoIL's method, once, for images (MobileNetV2) and audio (YAMNet): incremental training of the
pre-trained model on GDM(alpha)'s mixed set D_M, every layer or LF(n) or LF(n)+FMC (Algorithm 2,
through `techniques.feature_cache`), scored after every epoch; the alpha, n and FMC sweeps; timed
training steps; and the personal model's first training steps through TensorFlow Lite.

A modality subclasses `Personalizer` with its model, task, D_M and scores; both experiments then
train every configuration with the same code.
"""

from __future__ import annotations

import itertools
import logging
import math
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import numpy as np
import pandas as pd
import tf_keras as keras

from ondevice import streams
from ondevice.device import parity
from ondevice.papers.moil.techniques import feature_cache, layer_freezing
from ondevice.params import Params
from ondevice.tasks import inference
from ondevice.training.trainer import History, StepTimer, Trainer, seed_everything

EVALUATION_BATCH = 256  # samples per compiled inference call (scoring, caching the evaluation sets)
SHARED_PRESETS = {  # the protocol's smoke-scale values, the same for images and audio
    "smoke": dict(epochs=2, ns=(1, 2), warmup_steps=2, timing_steps=5, tflite_check_steps=2, bootstrap=300),
    "default": {},
    "paper": {},
}


class _NoRetracingWarning(logging.Filter):
    """TensorFlow warns when one Python function is traced often; here every model (pre-trained,
    every LF(n), every frozen part and head) gets its own compiled forward pass by design."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "triggered tf.function retracing" not in record.getMessage()


logging.getLogger("tensorflow").addFilter(_NoRetracingWarning())


@dataclass(frozen=True)
class MoilParams(Params):
    """Fields both MoIL experiments have; each states its own values of the first six."""

    alpha: float  # GDM's ratio in the combined runs
    alphas: tuple[float, ...]  # the alpha sweep (Fig. 5.5, 5.6)
    n: int  # LF(n) of the combined runs
    ns: tuple[int, ...]  # the n sweep (Fig. 5.7, 5.8)
    epochs: int  # incremental training of every configuration
    learning_rate: float  # Adam (the thesis gives none for incremental training)
    batch_size: int = 32
    warmup_steps: int = 5  # excluded from the steady-state step time
    timing_steps: int = 30  # steps timed for a configuration outside its training run (the thesis's 30)
    tflite_check_steps: int = 3  # training steps compared through the TFLite interpreter (0: skip)
    bootstrap: int = 2000  # resamples of every interval
    seeds: int = 1  # training repeats: seed, seed + 1, ... (the data, classes and splits follow `seed`)

    UNITS: ClassVar[int] = 0  # the model's units, "layers" as the thesis counts them

    def check(self) -> None:
        self.require(self.seeds >= 1, "seeds", "must be >= 1")
        self.require(0 < self.alpha <= 1, "alpha", "must lie in (0, 1] (GDM(alpha) is judged against GDM(0))")
        self.require(
            all(0 <= a <= 1 for a in self.alphas) and 0.0 in self.alphas and self.alpha in self.alphas,
            "alphas",
            "must lie in [0, 1] and include 0 and alpha",
        )
        last = self.UNITS - 1
        self.require(1 <= self.n <= last, "n", f"must lie in [1, {last}] (the model has {self.UNITS} units)")
        self.require(
            all(1 <= n <= last for n in self.ns) and self.n in self.ns, "ns", f"must lie in [1, {last}], with n"
        )
        for name in ("epochs", "batch_size"):
            self.require(getattr(self, name) >= 1, name, "must be at least 1")
        self.require(self.learning_rate > 0, "learning_rate", "must be positive")
        self.require(
            self.warmup_steps >= 0 and self.timing_steps >= 2, "timing_steps", "must be >= 2 (warmup_steps >= 0)"
        )
        self.require(self.tflite_check_steps >= 0, "tflite_check_steps", "must be >= 0 (0 = skip)")
        self.require(self.bootstrap >= 100, "bootstrap", "must be at least 100 resamples")


def label(alpha: float, n: int | None = None, fmc: bool = False, separator: str = "+") -> str:
    """A configuration's name as the thesis writes it: GDM(alpha), then +LF(n), then +FMC."""
    return separator.join([f"GDM({alpha:g})", *([f"LF({n})"] if n else []), *(["FMC"] if fmc else [])])


def forward(model: keras.Model):
    """Inference-mode logits of `model` as a NumPy array, one compiled call per batch."""
    fn = inference(model)
    return lambda x: fn(x).numpy()


def fit_epoch(trainer: Trainer, data, batch_size: int, rng) -> float:
    """One epoch through `Trainer.fit`; its mean loss."""
    return trainer.fit(data, 1, batch_size, rng)[0]["loss"]


def track(
    trainer, data, epochs: int, batch_size: int, rng, evaluate, metric: str, log, name: str, epoch=fit_epoch, stop=None
) -> tuple[History, dict]:
    """Train up to `epochs` epochs, scoring before the first and after each: one row per epoch with
    the mean loss, the epoch's seconds and the mean of each per-item score `evaluate()` returns (by
    evaluation set, named `<set>_<metric>`; a per-item loss, returned as `<set>_loss`, keeps its
    name), and the last scores. `epoch(trainer, data,
    batch_size, rng)` trains one epoch and returns its mean loss. With `stop` (a `Plateau`),
    `evaluate` also returns `stop.monitor` (per held-out training item): training ends on its
    plateau, the model keeps the weights of the kept epoch (`History.best_epoch`) and is scored."""
    monitor = stop.monitor if stop is not None else None
    watch = stop.watch() if stop is not None else None

    def means(scores):
        return {
            (k if k == monitor or k.endswith("_loss") else f"{k}_{metric}"): float(np.mean(v))
            for k, v in scores.items()
        }

    scores = evaluate()
    rows = History([{"epoch": 0, "loss": float("nan"), **means(scores)}])
    for e in range(1, epochs + 1):
        start = time.perf_counter()
        loss = epoch(trainer, data, batch_size, rng)
        seconds = time.perf_counter() - start
        scores = evaluate()
        rows.append({"epoch": e, "loss": loss, **means(scores), "epoch_seconds": seconds})
        log(
            f"{name} epoch {e}/{epochs}: loss {loss:.3f}, "
            + ", ".join(f"{k} {v:.3f}" for k, v in means(scores).items())
        )
        if watch is not None and watch.update(rows[-1][monitor], e, trainer.model):
            break
    if watch is not None:
        trainer.model.set_weights(watch.weights)
        rows.best_epoch, rows.plateau, scores = watch.epoch, watch.plateau, evaluate()
    return rows, {k: v for k, v in scores.items() if k != monitor}


class TrainingSet(NamedTuple):
    """D_M as the model trains on it, and how many samples it holds (audio: clips, not patches)."""

    inputs: Any
    labels: np.ndarray
    samples: int


@dataclass
class Run:
    """One configuration trained from the pre-trained weights: its scores per epoch and after the
    last one, and its step times."""

    name: str
    alpha: float
    n: int | None  # None: every layer trains
    fmc: bool
    seed: int
    history: list[dict]  # epoch 0 (the pre-trained model) and every epoch, from `track`
    scores: dict[str, Any]  # per evaluation set: per-item scores after the last epoch
    samples: int
    steps_per_epoch: int
    steady_step_seconds: float
    step_seconds: np.ndarray = field(repr=False)  # every step after warm-up
    cache_seconds: float = 0.0  # FMC: the caching pass over D_M
    cache: dict | None = None  # FMC: one cached feature map's shape and bytes (`feature_cache.describe`)
    weights: list[np.ndarray] = field(default_factory=list, repr=False)  # the whole model's, after training


@dataclass
class Cache:
    """Algorithm 2's feature maps: D_M's and each evaluation set's, and the head that trains on them."""

    head: keras.Model
    train: np.ndarray  # memory-mapped
    evaluation: dict[str, np.ndarray]
    seconds: float  # the caching pass over D_M: steady seconds per batch x batches


def cache_features(model, n: int, units, train, evaluation: dict, folder: Path, tag, batch_size: int) -> Cache:
    """Freeze all but the last n units of `model`, run the frozen part once over D_M (batches of
    `batch_size`) and over the evaluation sets, and store the maps in `folder` as <set>-<tag>.npy."""
    layer_freezing.freeze(model, n, units)
    frozen, head = layer_freezing.split(model, n, units)
    timer = StepTimer(warmup=1)  # the first batch traces the compiled forward pass
    features = feature_cache.build(frozen, train, folder / f"train-{tag}.npy", batch_size, timer)
    seconds = float(np.median(timer.durations[1:] or timer.durations)) * len(timer.durations)
    maps = {
        k: feature_cache.build(frozen, x, folder / f"{k}-{tag}.npy", EVALUATION_BATCH) for k, x in evaluation.items()
    }
    return Cache(head, features, maps, seconds)


def time_steps(trainer: Trainer, batches, warmup: int) -> np.ndarray:
    """Seconds of each training step after `warmup`, the batches run back to back."""
    trainer.timer = StepTimer(warmup)
    for x, y in batches:
        trainer.step(x, y)
    return np.array(trainer.timer.durations[warmup:])


class Personalizer:
    """Incremental training from the pre-trained weights on D_M: every layer, LF(n), or LF(n)+FMC
    (the head from cached feature maps, with the same batches as LF(n)). One compiled trainer per
    LF(n) serves every alpha and seed, each run from the pre-trained weights with a fresh optimizer
    state. A modality supplies the methods that raise NotImplementedError here."""

    metric: str  # the score's name in the history: accuracy, auc
    streams: str  # prefix of the random streams of batch order
    separator: str = "+"  # between the parts of a configuration's name
    predictor = staticmethod(forward)  # model -> function of inputs returning logits
    epoch = staticmethod(fit_epoch)  # trains one epoch (see `track`)

    def __init__(self, params: MoilParams, weights: list[np.ndarray], units: layer_freezing.Units):
        self.params, self.weights, self.units = params, weights, units
        self._trainers: dict = {}

    def build(self) -> keras.Model:
        """A fresh model (its weights are then set)."""
        raise NotImplementedError

    def task(self, input_shape: tuple):
        """The task of a model (or head) taking inputs of this shape."""
        raise NotImplementedError

    def mixed(self, alpha: float, seed: int) -> TrainingSet:
        """D_M for this seed; the same for every run with this alpha (so LF and FMC share it)."""
        raise NotImplementedError

    def evaluation(self) -> dict[str, Any]:
        """The evaluation sets' inputs, by name ("global", "local")."""
        raise NotImplementedError

    def score(self, predict, inputs: dict[str, Any]) -> dict[str, Any]:
        """Per-item scores of each evaluation set from its inputs (raw or cached feature maps)."""
        raise NotImplementedError

    def evaluator(self, model: keras.Model, n: int | None) -> tuple[Any, dict[str, Any]]:
        """What scores LF(n)'s `model` (None: every layer), which holds the pre-trained weights: a
        predictor and the evaluation inputs it takes, here the model itself on the raw inputs."""
        return self.predictor(model), self.evaluation()

    def trainer(self, n: int | None):
        """The compiled trainer of LF(n) (None: every layer), from the pre-trained weights, its
        predictor and the evaluation inputs that takes (`evaluator`)."""
        if n not in self._trainers:
            model = self.build()
            hooks = [layer_freezing.lf_hook(n, self.units)] if n else []
            trainer = Trainer(model, self.task(model.input_shape[1:]), self.params.learning_rate, hooks=hooks)
            trainer.reset(self.weights)
            self._trainers[n] = (trainer, *self.evaluator(model, n))
        trainer, predict, inputs = self._trainers[n]
        trainer.reset(self.weights)
        trainer.timer = StepTimer(self.params.warmup_steps)
        return trainer, predict, inputs

    def run(self, alpha: float, n: int | None, seed: int, log=print) -> Run:
        """GDM(alpha), with LF(n) unless n is None."""
        seed_everything(seed)
        trainer, predict, inputs = self.trainer(n)
        return self._train(alpha, n, seed, self.mixed(alpha, seed), trainer, predict, inputs, log)

    def run_fmc(self, alpha: float, n: int, seed: int, folder: Path, log=print) -> Run:
        """GDM(alpha)+LF(n)+FMC, Algorithm 2: cache the frozen part's feature maps of D_M (and of the
        evaluation sets) in `folder`, then train the head from the cache."""
        seed_everything(seed)
        p, mixed, model = self.params, self.mixed(alpha, seed), self.build()
        model.set_weights(self.weights)
        cache = cache_features(model, n, self.units, mixed.inputs, self.evaluation(), folder, seed, p.batch_size)
        trainer = Trainer(
            cache.head,
            self.task(cache.train.shape[1:]),
            p.learning_rate,
            hooks=[feature_cache.CachedFeatures(cache.train, mixed.labels)],
            warmup_steps=p.warmup_steps,
        )
        predict = self.predictor(cache.head)
        return self._train(alpha, n, seed, mixed, trainer, predict, cache.evaluation, log, cache, model)

    def _train(self, alpha, n, seed, mixed: TrainingSet, trainer, predict, inputs, log, cache=None, model=None) -> Run:
        """Train and score epoch by epoch, `predict` on the evaluation `inputs`; with a cache, the head
        trains on D_M's cached feature maps (its batch source), and `model` is the whole model."""
        p, fmc = self.params, cache is not None
        name = label(alpha, n, fmc, self.separator)
        data = None if fmc else (mixed.inputs, mixed.labels)
        rng = streams.rng(seed, f"{self.streams}/batches")
        evaluate = lambda: self.score(predict, inputs)
        history, scores = track(
            trainer, data, p.epochs, p.batch_size, rng, evaluate, self.metric, log, f"seed {seed} {name}", self.epoch
        )
        return Run(
            name=name,
            alpha=alpha,
            n=n,
            fmc=fmc,
            seed=seed,
            history=history,
            scores=scores,
            samples=mixed.samples,
            steps_per_epoch=math.ceil(len(mixed.labels) / p.batch_size),
            steady_step_seconds=trainer.timer.steady(),
            step_seconds=np.array(trainer.timer.durations[p.warmup_steps :]),
            cache_seconds=cache.seconds if fmc else 0.0,
            cache=feature_cache.describe(cache.train) if fmc else None,
            weights=(model or trainer.model).get_weights(),
        )

    def on_device(self, stream: str, log=print) -> tuple[pd.DataFrame | None, bytes | None]:
        """The personal model, GDM(alpha)+LF(n), exported as a trainable TFLite file (LF's frozen
        variables outside `train`); its first steps in TensorFlow and through the interpreter from
        the pre-trained weights on the same batches of D_M (drawn from the random stream `stream`),
        and both models' outputs after them. A copy of the model: no result changes."""
        p = self.params
        if not p.tflite_check_steps:
            return None, None
        model, mixed = self.build(), self.mixed(p.alpha, p.seed)
        model.set_weights(self.weights)
        task = self.task(model.input_shape[1:])
        batches = task.batches((mixed.inputs, mixed.labels), p.batch_size, streams.rng(p.seed, stream))
        batches = list(itertools.islice(batches, p.tflite_check_steps))
        hooks = [layer_freezing.lf_hook(p.n, self.units)]
        check = parity.compare_flex(model, task, p.learning_rate, batches, hooks=hooks)
        table = pd.DataFrame(
            {
                "step": range(1, len(check["tflite"]) + 1),
                "loss_tensorflow": check["tensorflow"],
                "loss_tflite": check["tflite"],
            }
        )
        table["abs_difference"] = (table.loss_tflite - table.loss_tensorflow).abs()
        table.attrs["max_output_difference"] = float(
            np.abs(check["outputs_tflite"] - check["outputs_tensorflow"]).max()
        )
        log(
            f"on-device check: {len(table)} LF({p.n}) steps through the TFLite interpreter, max |loss difference| "
            f"{table.abs_difference.max():.2e}, max |logit difference| after them "
            f"{table.attrs['max_output_difference']:.2e}"
        )
        return table, check["flatbuffer"]


def gdm_sweep(params: MoilParams, personal: Personalizer, log=print) -> list[Run]:
    """GDM(alpha) for every alpha of the sweep, every layer training (Fig. 5.5, 5.6)."""
    return [personal.run(a, None, s, log) for s in params.seed_list for a in params.alphas]


def lf_sweep(params: MoilParams, personal: Personalizer, log=print) -> list[Run]:
    """GDM(alpha)+LF(n) for every n of the sweep (Fig. 5.7, 5.8)."""
    return [personal.run(params.alpha, n, s, log) for s in params.seed_list for n in params.ns]


def fmc(params: MoilParams, personal: Personalizer, log=print) -> list[Run]:
    """GDM(alpha)+LF(n)+FMC for every seed, the cache in a temporary folder removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="moil-fmc-") as folder:
        return [personal.run_fmc(params.alpha, params.n, s, Path(folder), log) for s in params.seed_list]
