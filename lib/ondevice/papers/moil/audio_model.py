"""YAMNet in MoIL's audio experiment: clip scores and per-class AUC, the pre-trained weights
(imported from the published model, or trained on the stand-in clips) and their agreement with the
published TFLite model, incremental training through the protocol (`Personalizer`), and the
step-time benchmark of the thesis's configurations."""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.special import expit

from ondevice import streams
from ondevice.data import audio_features, manifests
from ondevice.device import tflite, yamnet_tflite
from ondevice.metrics import roc_auc
from ondevice.models import yamnet
from ondevice.papers.moil import protocol, rate_choice
from ondevice.papers.moil.audio_data import (
    AudioData,
    AudioParams,
    Part,
    mixed_training_set,
    scored,
    synthetic_clips,
    synthetic_mapping,
)
from ondevice.papers.moil.techniques import feature_cache, layer_freezing
from ondevice.tasks.classification import ClassificationTask
from ondevice.training import model_cache
from ondevice.training.trainer import Trainer, seed_everything

TRAINING_CODE = ("ondevice.papers.moil.audio_data", "ondevice.training.trainer", "ondevice.tasks.classification")


def tagging_task(input_shape=(yamnet.PATCH_FRAMES, yamnet.MEL_BINS)) -> ClassificationTask:
    """YAMNet's multi-label task on patches (or on a head's cached feature maps of this shape)."""
    return ClassificationTask(tuple(input_shape), yamnet.CLASSES, multi_label=True)


def patch_logits(predict, part: Part, inputs=None) -> np.ndarray:
    """Logits of each of the part's patches (or of their cached feature maps), float64: [patches, classes]."""
    x = part.patches if inputs is None else inputs
    batch = protocol.EVALUATION_BATCH
    return np.concatenate([predict(x[i : i + batch]) for i in range(0, len(x), batch)]).astype(np.float64)


def per_clip(part: Part, values: np.ndarray) -> np.ndarray:
    """The mean over each clip's patches of per-patch values (rows: patches)."""
    sums = np.zeros((len(part), *values.shape[1:]))
    np.add.at(sums, part.clip, values)
    counts = np.bincount(part.clip, minlength=len(part))
    return sums / counts.reshape(-1, *[1] * (values.ndim - 1))


def clip_scores(predict, part: Part, inputs=None) -> np.ndarray:
    """Mean sigmoid score of each clip's patches (or of their cached feature maps): [clips, classes]."""
    return per_clip(part, expit(patch_logits(predict, part, inputs)))


def clip_losses(logits: np.ndarray, part: Part) -> np.ndarray:
    """The training loss per clip: binary cross-entropy of its patches' logits against its labels,
    mean over YAMNet's outputs and the clip's patches."""
    y = part.patch_labels()
    patch = np.maximum(logits, 0) - logits * y + np.log1p(np.exp(-np.abs(logits)))
    return per_clip(part, patch.mean(axis=1))


def class_aucs(part: Part, scores: np.ndarray) -> pd.Series:
    """AUC per AudioSet class present in the part (index: class column)."""
    cols = np.flatnonzero(scored(part.labels))
    return pd.Series([roc_auc(part.labels[:, c], scores[:, c]) for c in cols], index=cols)


@dataclass
class Pretrained:
    """The pre-trained YAMNet's weights and where they come from, its agreement with the published
    TFLite model (real data only) and its per-class AUCs before any personalisation."""

    weights: list[np.ndarray]
    source: str
    agreement: pd.DataFrame | None
    global_auc: pd.Series
    local_auc: pd.Series


def _import_weights(params: AudioParams, log) -> tuple[list[np.ndarray], str]:
    model = yamnet.build()
    if params.yamnet_h5:
        if not Path(params.yamnet_h5).is_file():
            raise manifests.DataError(
                f"yamnet_h5: no file at {params.yamnet_h5} (download "
                "https://storage.googleapis.com/audioset/yamnet.h5, see data_manifests/yamnet_h5.yaml)"
            )
        yamnet.load_h5(model, params.yamnet_h5)
        return model.get_weights(), f"yamnet.h5 ({params.yamnet_h5})"
    path = manifests.resolve("yamnet", "tflite")
    yamnet_tflite.import_tflite(model, path)
    log(f"YAMNet: imported the weights of {path.name} (int8 kernels dequantised, batch norm folded)")
    return model.get_weights(), "yamnet.tflite (imported)"


def agreement(model, tflite_path: Path, waveforms: list[np.ndarray]) -> pd.DataFrame:
    """Our Keras YAMNet vs the published TFLite model on the first 0.975 s of real clips: scores
    on the TFLite model's own log-mel patch (the network alone) and on our front end's (end to
    end; the TFLite front end multiplies by int8-rounded DFT and mel matrices)."""
    interp = tflite.interpreter(Path(tflite_path).read_bytes())
    inp = interp.get_input_details()[0]["index"]
    out = {o["name"]: o["index"] for o in interp.get_output_details()}
    predict = protocol.forward(model)
    rows = []
    for i, w in enumerate(waveforms):
        x = np.pad(w, (0, max(0, audio_features.PATCH_SAMPLES - len(w))))[: audio_features.PATCH_SAMPLES]
        interp.set_tensor(inp, x[None].astype(np.float32))
        interp.invoke()
        ref, ref_mel = interp.get_tensor(out["Identity"])[0], interp.get_tensor(out["Identity_1"])
        ours_net = expit(predict(ref_mel[None])[0])
        ours = expit(predict(audio_features.patches(x)[:1])[0])
        rows.append(
            {
                "clip": i,
                "network: max |score difference|": float(np.abs(ours_net - ref).max()),
                "network: same top class": bool(ours_net.argmax() == ref.argmax()),
                "end to end: max |score difference|": float(np.abs(ours - ref).max()),
                "end to end: same top class": bool(ours.argmax() == ref.argmax()),
                "end to end: top-5 overlap": len(set(np.argsort(-ours)[:5]) & set(np.argsort(-ref)[:5])),
            }
        )
    return pd.DataFrame(rows)


def _synthetic_pretraining(params: AudioParams, log) -> list[np.ndarray]:
    """A YAMNet trained on fresh synthetic clips of every stand-in class (the stand-in's AudioSet)."""
    n = params.local_classes + params.global_classes
    fields = {"classes": n, "clips_per_class": 6, "epochs": 4, "batch_size": 32, "learning_rate": 1e-3}

    def train():
        seed_everything(params.seed)
        meta, waves = synthetic_clips(n, fields["clips_per_class"], params.seed + 1000)
        cols = synthetic_mapping(n)
        labels = np.zeros((len(meta), yamnet.CLASSES), np.float32)
        for row, t in enumerate(meta.target):
            labels[row, cols[t]] = 1
        part = Part.of(waves, labels, meta.target, meta.filename)
        model = yamnet.build(seed=params.seed, train_batchnorm=True)
        trainer = Trainer(model, tagging_task(), fields["learning_rate"])
        history = trainer.fit(
            (part.patches, part.patch_labels()),
            fields["epochs"],
            fields["batch_size"],
            streams.rng(params.seed, "moil-audio/synthetic-pretraining"),
            log=log,
            label="stand-in pre-training",
        )
        return model.get_weights(), {"history": history}

    fields = {**fields, "seed": params.seed}
    name = "moil_audio_synthetic_yamnet"
    return model_cache.cached_train(name, fields, [], TRAINING_CODE, train, log, (_synthetic_pretraining,)).weights


def pretrained(params: AudioParams, data: AudioData, log=print) -> Pretrained:
    """The pre-trained YAMNet's weights (imported, or the stand-in's), its agreement with the
    published TFLite model on real clips, and its AUCs before any personalisation."""
    table = None
    if data.stand_in:
        weights, source = _synthetic_pretraining(params, log), "YAMNet pre-trained on synthetic stand-in clips"
    else:
        weights, source = _import_weights(params, log)
    model = yamnet.build()
    model.set_weights(weights)
    if not data.stand_in and not params.yamnet_h5:
        table = agreement(model, manifests.resolve("yamnet", "tflite"), data.samples)
    predict = protocol.forward(model)
    return Pretrained(
        weights,
        source,
        table,
        class_aucs(data.global_eval, clip_scores(predict, data.global_eval)),
        class_aucs(data.local_val, clip_scores(predict, data.local_val)),
    )


class Personalizer(protocol.Personalizer):
    """YAMNet from the pre-trained weights on the patches of D_M's clips, each with its clip's
    labels; scored by the AUC of each AudioSet class on the global evaluation clips and the
    user's validation clips. One seed: the parameters' own."""

    metric, streams, separator = "auc", "moil-audio", " + "

    def __init__(self, params: AudioParams, data: AudioData, pre: Pretrained):
        super().__init__(params, pre.weights, yamnet.units)
        self.data = data
        self.parts = {"global": data.global_eval, "local": data.local_val}
        self.maps = tempfile.TemporaryDirectory(prefix="moil-audio-eval-")  # `evaluator`'s, removed with self
        self.heads: dict = {}  # LF(n)'s heads by n: a compiled predictor holds its model weakly

    def build(self):
        return yamnet.build()

    def task(self, input_shape):
        return tagging_task(input_shape)

    def mixed(self, alpha: float, seed: int) -> protocol.TrainingSet:
        part = mixed_training_set(self.data, alpha, seed)
        return protocol.TrainingSet(part.patches, part.patch_labels(), len(part))

    def evaluation(self) -> dict:
        return {k: part.patches for k, part in self.parts.items()}

    def evaluator(self, model, n):
        """With LF(n) the frozen part keeps the pre-trained weights (its batch norm the moving
        statistics), so its feature maps of the evaluation patches are the same after every epoch
        of every run: computed once (on disk, as FMC's), each evaluation runs only the head on them,
        with the whole model's logits. Every layer training (n None): the whole model, every time."""
        if n is None:
            return super().evaluator(model, n)
        frozen, self.heads[n] = layer_freezing.split(model, n, self.units)
        folder, batch = Path(self.maps.name), protocol.EVALUATION_BATCH
        inputs = {
            k: feature_cache.build(frozen, x, folder / f"{k}-lf{n}.npy", batch) for k, x in self.evaluation().items()
        }
        return self.predictor(self.heads[n]), inputs

    def score(self, predict, inputs: dict) -> dict:
        return {k: class_aucs(part, clip_scores(predict, part, inputs[k])) for k, part in self.parts.items()}


class HeldOut(Personalizer):
    """The rate choice's runs (`rate_choice.select`): trained on D_M of `data` (the user's training
    clips without the held-out ones) and scored on the held-out training clips alone, by per-class
    AUC and per-clip training loss."""

    def __init__(self, params: AudioParams, data: AudioData, pre: Pretrained, held: Part):
        super().__init__(params, data, pre)
        self.parts = {rate_choice.HELD_OUT: held}

    def score(self, predict, inputs: dict) -> dict:
        held = self.parts[rate_choice.HELD_OUT]
        logits = patch_logits(predict, held, inputs[rate_choice.HELD_OUT])
        return {
            rate_choice.HELD_OUT: class_aucs(held, per_clip(held, expit(logits))),
            f"{rate_choice.HELD_OUT}_loss": clip_losses(logits, held),
        }


def benchmark(params: AudioParams, data: AudioData, pre: Pretrained, log=print) -> pd.DataFrame:
    """Steady-state step time (median after warm-up, `timing_steps` steps of `batch_size` patches
    of D_M) of full training, head-only (LF(1)) and LF(n) with the forward pass and from the
    cache, back to back in this process on the same batches, and each cache's caching pass per
    patch (FMC's one-off cost)."""
    personal = Personalizer(params, data, pre)
    mixed = personal.mixed(params.alpha, params.seed)
    bs, steps = params.batch_size, params.warmup_steps + params.timing_steps
    order = streams.rng(params.seed, "moil-audio/benchmark").permutation(len(mixed.labels))
    picked = np.resize(order, steps * bs)  # the timed batches' patches, in order
    labels = [mixed.labels[picked[i : i + bs]] for i in range(0, len(picked), bs)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="moil-audio-benchmark-") as folder:
        for n in dict.fromkeys((None, 1, params.n)):  # LF(1) is head-only training; LF(n) the combined runs
            for cached in (False,) if n is None else (False, True):
                per_patch = 0.0
                if cached:
                    model = personal.build()
                    model.set_weights(pre.weights)
                    cache = protocol.cache_features(
                        model, n, personal.units, mixed.inputs[picked], {}, Path(folder), f"lf{n}", bs
                    )
                    trainer = Trainer(cache.head, tagging_task(cache.head.input_shape[1:]), params.learning_rate)
                    inputs, per_patch = cache.train, cache.seconds / len(picked)
                else:
                    trainer, inputs = personal.trainer(n)[0], mixed.inputs[picked]
                batches = [(inputs[i * bs : (i + 1) * bs], y) for i, y in enumerate(labels)]
                durations = protocol.time_steps(trainer, batches, params.warmup_steps)
                name = (
                    "full training"
                    if n is None
                    else f"LF({n}) " + ("from the cache (FMC)" if cached else "with forward pass")
                )
                rows.append(
                    {
                        "configuration": name,
                        "n": n or 0,
                        "cached": cached,
                        "steady_step_seconds": float(np.median(durations)),
                        "step_seconds": list(durations),
                        "cache_build_seconds_per_patch": per_patch,
                    }
                )
                log(f"timing {name}: {len(durations)} steps after the warm-up ({durations.sum():.1f}s)")
    table = pd.DataFrame(rows)
    table["time ratio to full training"] = table.steady_step_seconds / table.steady_step_seconds.iloc[0]
    # FMC adds its one-off pass of the frozen part over the training set (Algorithm 2)
    steps_per_epoch, patches = math.ceil(len(mixed.labels) / bs), len(mixed.labels)
    table["training_time_seconds (epochs x steps x step)"] = (
        params.epochs * steps_per_epoch * table.steady_step_seconds + table.cache_build_seconds_per_patch * patches
    )
    return table


def units_table(model=None) -> pd.DataFrame:
    """YAMNet's layers as MoIL counts them: LF(n) trains the last n rows."""
    model = model or yamnet.build()
    found = yamnet.units(model)
    return pd.DataFrame(
        [
            {
                "layer": i,
                "LF(n) trains it for n >=": len(found) - i + 1,
                "Keras layers": ", ".join(l.name for l in unit),
                "parameters": int(sum(np.prod(w.shape) for l in unit for w in l.weights)),
                "output": "x".join(str(d) for d in unit[-1].output_shape[1:]),
            }
            for i, unit in enumerate(found, 1)
        ]
    )
