"""MobileNetV2 in MoIL's image experiment: the global model and the baseline, each trained once per
machine through the model cache; incremental training through the protocol (`Personalizer`); the
baseline's step time; and the size of a cached feature map (M6)."""

from __future__ import annotations

import hashlib
import itertools
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import tensorflow as tf

from ondevice import streams
from ondevice.data import image_folders, manifests
from ondevice.models import mobilenet_v2
from ondevice.papers.moil import image_data, protocol
from ondevice.papers.moil.image_data import Data, ImageParams, build, concat, correct, predictor, stream_epoch, task
from ondevice.papers.moil.protocol import Run
from ondevice.papers.moil.report import final_row
from ondevice.papers.moil.techniques import feature_cache, gdm, layer_freezing
from ondevice.training import model_cache
from ondevice.training.trainer import Plateau, Trainer, seed_everything

HISTORY_COLUMNS = ["epoch", "loss", "holdout_loss", "global_accuracy", "local_accuracy"]
TRAINING_CODE = ("ondevice.models.mobilenet_v2", "ondevice.training.trainer", "ondevice.tasks.classification")


@dataclass
class Pretrained:
    """The global model's and the baseline's weights, their model-cache entries and test predictions."""

    weights: list[np.ndarray]
    baseline: list[np.ndarray]
    entries: dict[str, model_cache.Entry]
    correct: dict[str, dict[str, np.ndarray]]  # "pre-trained" / "baseline" -> test set -> per sample

    @property
    def baseline_epochs(self) -> int:
        """The epochs the baseline took to converge: its kept epoch (lowest held-out loss)."""
        return int(self.entries["baseline"].info["kept_epoch"])

    def history(self) -> pd.DataFrame:
        return pd.concat(
            [
                pd.DataFrame(e.info["history"]).reindex(columns=HISTORY_COLUMNS).assign(run=k)
                for k, e in self.entries.items()
            ]
        )

    def cache(self) -> pd.DataFrame:
        """Per model: from the cache or trained now, its epochs (and for the baseline the kept one
        and whether its held-out loss reached a plateau before the cap), training seconds."""
        rows = []
        for name, e in self.entries.items():
            info = e.info
            epochs = max(h["epoch"] for h in info["history"])
            kept = {"kept_epoch": info.get("kept_epoch", epochs), "plateau": info.get("plateau", False)}
            rows.append({"model": name, "from_cache": e.hit, "key": e.key[:20], "epochs": epochs, **kept})
            rows[-1]["train_seconds"] = info["train_seconds"]
        return pd.DataFrame(rows)


def _cached_model(
    name: str, params: ImageParams, data: Data, parts: list, epochs: int, log, init: str | None = None, stop=None
) -> model_cache.Entry:
    """A model trained on the concatenation of `parts` (cached by the model cache), from scratch
    or from Keras's ImageNet weights at `init` (new outputs freshly initialised). With `stop` (a
    `Plateau`), `baseline_holdout` of the images are held out and training stops on a plateau of
    their loss, keeping the weights of the epoch with the lowest."""
    x = concat([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    held = None
    if stop is not None:
        order = streams.rng(params.seed, f"moil_image/{name}/holdout").permutation(len(y))
        cut = max(1, round(params.baseline_holdout * len(y)))
        out, fit = np.sort(order[:cut]), np.sort(order[cut:])
        held = (image_data.take(x, out), y[out])
        x, y = image_data.take(x, fit), y[fit]

    def train():
        seed_everything(streams.tf_seed(params.seed, f"moil_image/{name}"))
        model = build(params, data)
        if init:
            mobilenet_v2.load_imagenet(model, init, data.global_classes)
        trainer = Trainer(model, task(data.input_shape, data.classes), params.learning_rate)
        predict = predictor(model)

        def evaluate():
            scores = {"global": correct(predict, data.global_test), "local": correct(predict, data.local_test)}
            return scores | ({stop.monitor: image_data.losses(predict, held)} if held else {})

        rng = streams.rng(params.seed, f"batches/{name}")
        history, _ = protocol.track(
            trainer, (x, y), epochs, params.batch_size, rng, evaluate, "accuracy", log, name, stream_epoch, stop
        )
        info = {"history": list(history), "train_samples": len(y)}
        return model.get_weights(), info | (
            {"kept_epoch": history.best_epoch, "plateau": history.plateau} if held else {}
        )

    fields = {
        k: getattr(params, k) for k in ("image_size", "width", "bn_momentum", "batch_size", "learning_rate", "seed")
    }
    fields["epochs"] = epochs
    if stop is not None:
        fields |= {"holdout": params.baseline_holdout, "stop": repr(stop)}
    data_ids = [
        x.fingerprint() if isinstance(x, image_folders.ImageFiles) else hashlib.sha256(x.tobytes()).hexdigest(),
        hashlib.sha256(y.tobytes()).hexdigest(),
    ] + ([manifests.sha256_of(Path(init))] if init else [])
    sources = (_cached_model, protocol.track, protocol.fit_epoch, stream_epoch)
    return model_cache.cached_train(f"moil_image_{name}", fields, data_ids, TRAINING_CODE, train, log, sources)


def pretrain(params: ImageParams, data: Data, log=print) -> Pretrained:
    """The global model (global data only: the cloud's pre-training, fixed epochs as the thesis's)
    and the baseline (from scratch on global + local data, to a plateau of its held-out loss: the
    thesis trains it "until convergence"), each trained once per machine through the model cache."""
    stop = Plateau(params.baseline_patience, 0.01, keep_lowest=True)
    entries = {
        "pre-trained": _cached_model(
            "pretrained", params, data, [data.global_train], params.pretrain_epochs, log, init=data.init_weights
        ),
        "baseline": _cached_model(
            "baseline", params, data, [data.global_train, data.local_train], params.baseline_epochs, log, stop=stop
        ),
    }
    model = build(params, data)
    predict = predictor(model)
    scores = {}
    for name, entry in entries.items():
        model.set_weights(entry.weights)
        scores[name] = {"global": correct(predict, data.global_test), "local": correct(predict, data.local_test)}
        log(
            f"{name}: global accuracy {scores[name]['global'].mean():.3f}, local accuracy "
            f"{scores[name]['local'].mean():.3f}"
        )
    return Pretrained(entries["pre-trained"].weights, entries["baseline"].weights, entries, scores)


class Personalizer(protocol.Personalizer):
    """MobileNetV2 from the pre-trained weights on the images of D_M; scored by top-1 accuracy on
    both test sets. Streamed image files are mixed as file lists and decoded batch by batch."""

    metric, streams = "accuracy", "moil_image"
    predictor, epoch = staticmethod(image_data.predictor), staticmethod(image_data.stream_epoch)

    def __init__(self, params: ImageParams, data: Data, pre: Pretrained):
        super().__init__(params, pre.weights, mobilenet_v2.units)
        self.data, self.pre = data, pre

    def build(self):
        return image_data.build(self.params, self.data)

    def task(self, input_shape):
        return image_data.task(input_shape, self.data.classes)

    def mixed(self, alpha: float, seed: int) -> protocol.TrainingSet:
        """Streamed sets are mixed as file lists: the per-class sample picks file names, no image is read."""
        rng = streams.rng(seed, f"moil_image/gdm/{alpha}")
        (xl, yl), (xg, yg) = self.data.local_train, self.data.global_train
        if isinstance(xg, image_folders.ImageFiles):
            idx = gdm.sample_global(yg, alpha, rng)
            x, y = image_folders.ImageFiles.concat([xl, xg.take(idx)]), np.concatenate([yl, yg[idx]])
        else:
            x, y = gdm.mix(self.data.local_train, self.data.global_train, alpha, rng)
        return protocol.TrainingSet(x, y, len(x))

    def evaluation(self) -> dict:
        return {"global": self.data.global_test[0], "local": self.data.local_test[0]}

    def score(self, predict, inputs: dict) -> dict:
        labels = {"global": self.data.global_test[1], "local": self.data.local_test[1]}
        return {k: correct(predict, (x, labels[k])) for k, x in inputs.items()}


def baseline_step_seconds(params: ImageParams, data: Data, personal: Personalizer) -> np.ndarray:
    """The baseline's step times, measured in this run like every other configuration: warm-up +
    `timing_steps` steps of full training on global + local batches (the model cache may have
    trained the baseline on another day)."""
    trainer = personal.trainer(None)[0]
    x = concat([data.global_train[0], data.local_train[0]])
    y = np.concatenate([data.global_train[1], data.local_train[1]])
    batches = trainer.task.batches((x, y), params.batch_size, streams.rng(params.seed, "moil_image/timing"))
    return protocol.time_steps(
        trainer, itertools.islice(batches, params.warmup_steps + params.timing_steps), params.warmup_steps
    )


def timing(params: ImageParams, data: Data, personal: Personalizer, runs: list[Run], log=print) -> pd.DataFrame:
    """Training time per configuration (median over seeds): steady step seconds x steps (+ the
    caching pass for FMC), and speed-ups over the baseline; every number from this run. The
    baseline's step durations are kept in `table.attrs["baseline_step_seconds"]`."""
    table = (
        pd.DataFrame([final_row(r, params.epochs) for r in runs])
        .groupby("run", sort=False)
        .agg(
            alpha=("alpha", "first"),
            n=("n", "first"),
            fmc=("fmc", "first"),
            steps=("steps", "first"),
            steady_step_seconds=("steady_step_seconds", "median"),
            cache_build_seconds=("cache_build_seconds", "median"),
            training_time_seconds=("training_time_seconds", "median"),
        )
        .reset_index()
    )
    baseline = personal.pre.entries["baseline"].info  # its epochs to convergence x steps per epoch
    steps = personal.pre.baseline_epochs * math.ceil(baseline["train_samples"] / params.batch_size)
    durations = baseline_step_seconds(params, data, personal)
    step = float(np.median(durations))
    base = {"run": "baseline", "alpha": 1.0, "n": 0, "fmc": False, "steps": steps, "steady_step_seconds": step}
    base.update(cache_build_seconds=0.0, training_time_seconds=step * steps)
    table = pd.concat([pd.DataFrame([base]), table], ignore_index=True)
    table["time_ratio_baseline_over_this"] = table.training_time_seconds.iloc[0] / table.training_time_seconds
    table.attrs["baseline_step_seconds"] = durations
    for r in table.itertuples():
        log(f"{r.run}: {r.steps} steps, training time ({r.training_time_seconds:.1f}s)")
    return table


def cache_size(params: ImageParams, data: Data, pre: Pretrained, log=print) -> pd.DataFrame:
    """M6: bytes per sample of the cached feature map of LF(n) vs the raw input, measured by
    building the cache for a few real images; the raw input counted as the thesis does (3
    channels x 4 bytes per value, footnote 5) and as stored (8-bit greyscale 28x28). With
    `thesis_size_check`, also at the thesis's 224x224x3 MobileNetV2 1.0."""
    sample = data.global_test[0][:8]
    rows = []
    with tempfile.TemporaryDirectory(prefix="moil-image-m6-") as folder:
        configs = [(params.image_size, params.width, data.input_shape[-1])]
        if params.thesis_size_check and configs[0] != (224, 1.0, 3):
            configs.append((224, 1.0, 3))
        for size, width, channels in configs:
            model = mobilenet_v2.build(size, channels, data.classes, width)
            if size == params.image_size and width == params.width:
                model.set_weights(pre.weights)
            frozen, _ = layer_freezing.split(model, params.n, mobilenet_v2.units)
            x = tf.image.resize(sample, (size, size)).numpy()
            x = np.repeat(x, channels, axis=-1) if x.shape[-1] != channels else x
            features = feature_cache.build(frozen, x, Path(folder) / f"m6-{size}.npy", 8)
            report = feature_cache.size_report(features, size * size * 3 * 4)
            stored = data.native_bytes if size == params.image_size else size * size * 3
            rows.append(
                {
                    "input": f"{size}x{size}x{channels}",
                    "MobileNetV2 width": width,
                    "LF(n)": params.n,
                    "cached feature map": report["feature_shape"],
                    "cached bytes per sample": report["cached_bytes_per_sample"],
                    "raw bytes per sample (3 channels x 4 bytes, as the thesis)": report["raw_bytes_per_sample"],
                    "raw / cached": report["raw / cached"],
                    "raw bytes per sample (as stored, 8-bit)": stored,
                    "stored / cached": stored / report["cached_bytes_per_sample"],
                }
            )
    return pd.DataFrame(rows)
