"""Parity of the one training step in its three forms: TensorFlow (`training.step.Step`), the Flex
export (`device.tflite`, the Step converted as it is) and the builtin-op export
(`device.builtin_export`, the Step written out by hand), trained from the same weights on the same
batches. `parity_table` is the table every notebook shows; `python -m ondevice.device.parity --out
DIR` exports a small instance of every model family in both modes, writes `manifest.json` and
compares their size, step time and parity.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
import tensorflow as tf
import tf_keras as keras

from ..data.places import FEATURES
from ..models import mrnn
from ..models.svd_compression import compress
from ..tasks import Task
from ..tasks.classification import ClassificationTask
from ..tasks.next_word import NextWordTask
from ..training.fine_tune import FineTune
from ..training.step import Hook, Step
from ..training.trainer import Trainer
from . import builtin_export, litert, tflite
from .builtin_export import TRAIN_ALL, TRAIN_HEAD, BuiltinTrainable


def _copy(model: keras.Model) -> keras.Model:
    twin = keras.models.clone_model(model)
    twin.set_weights(model.get_weights())
    return twin


def compare_flex(model: keras.Model, task: Task, learning_rate: float, batches, *args, **kwargs) -> dict:
    """Train one copy in TensorFlow and one through the TFLite interpreter from the same weights on
    the same batches (`args`, `kwargs`: the rest of `Step`'s: optimizer, hooks, clip_norm). Returns
    both loss curves, both models' outputs on the first batch after training, the flatbuffer
    (trainable from the starting weights) and the Step it converts (on `model`, not trained). `model`
    is not changed."""
    converted = Step(model, task, learning_rate, *args, **kwargs)
    flatbuffer = tflite.convert(converted)
    step = Step(_copy(model), task, learning_rate, *args, **kwargs)
    tf_losses = [float(step.train(tf.constant(x), tf.constant(y))["loss"]) for x, y in batches]
    interp = tflite.interpreter(flatbuffer)
    probe = batches[0][0]
    return {
        "tensorflow": tf_losses,
        "tflite": tflite.train_on_device(interp, task, batches),
        "flatbuffer": flatbuffer,
        "step": converted,
        "outputs_tensorflow": step.model(probe, training=False).numpy(),
        "outputs_tflite": tflite.infer_on_device(interp, task, probe),
    }


def reference_trainer(step: Step, module: BuiltinTrainable) -> Trainer:
    """TensorFlow's `Trainer` on a copy of the step's model, training what `module` trains (the layers
    that do not train are frozen, so their batch norm runs on its moving statistics, as in the file)."""
    hooks = [FineTune(module.trained_layers, freeze=True)] if module.train_mode == TRAIN_HEAD else []
    settings = (step.learning_rate, step.optimizer_name, hooks, step.clip_norm)
    return Trainer(_copy(step.model), module.task, *settings)


def compare_builtin(step: Step, batches, sequence_length: int | None = None, **signatures) -> dict:
    """The same batches through TensorFlow's Trainer (on a copy of the step's model) and through the
    builtin export's `train` signature in LiteRT, from the same weights. Returns both loss curves,
    both sets of kept weights after the steps (by key), the flatbuffer and the module. `signatures`:
    the optional ones of BuiltinTrainable (distill=, reuse=), exported beside `train`."""
    module = BuiltinTrainable(step, sequence_length, **signatures)
    flatbuffer = builtin_export.convert(module)
    trainer = reference_trainer(step, module)
    as_sig = (step.task.signature.inputs.dtype.as_numpy_dtype, step.task.signature.labels.dtype.as_numpy_dtype)
    tf_losses = [trainer.step(np.asarray(x, as_sig[0]), np.asarray(y, as_sig[1])) for x, y in batches]
    interp = litert.interpreter(flatbuffer)
    lite_losses = builtin_export.train_on_device(interp, module, batches)
    return {
        "tensorflow": tf_losses,
        "litert": lite_losses,
        "weights_tensorflow": module.keras_weights(trainer.model),
        "weights_litert": interp.get_signature_runner("get_weights")(),
        "flatbuffer": flatbuffer,
        "module": module,
    }


def parity_table(
    model: keras.Model,
    task: Task,
    learning_rate: float,
    batches,
    optimizer: str = "adam",
    hooks: Sequence[Hook] = (),
    log=None,
    label: str = "",
    clip_norm: float = 0.0,
) -> tuple[pd.DataFrame, bytes]:
    """The one on-device parity table: the same steps in TensorFlow, through the Flex export
    (`compare_flex`) and through the builtin export, one row per step with the losses and their
    differences, and the largest output difference after the steps. Returns it and the Flex file."""
    check = compare_flex(model, task, learning_rate, batches, optimizer, hooks, clip_norm)
    table = pd.DataFrame(
        {
            "step": range(1, len(check["tflite"]) + 1),
            "loss_tensorflow": check["tensorflow"],
            "loss_tflite": check["tflite"],
        }
    )
    table["abs_difference"] = (table.loss_tflite - table.loss_tensorflow).abs()
    table["max_output_difference_after"] = float(np.abs(check["outputs_tflite"] - check["outputs_tensorflow"]).max())
    table, builtin = _builtin_columns(table, check["step"], batches)  # from the untrained Step the file holds
    if log:
        log(
            f"on-device check{f' ({label})' if label else ''}: {len(table)} steps through the TFLite interpreter, "
            f"max |loss difference| {table.abs_difference.max():.2e}, max |output difference| after them "
            f"{table.max_output_difference_after.iloc[0]:.2e}; {builtin}"
        )
    return table, check["flatbuffer"]


def _builtin_columns(table: pd.DataFrame, step: Step, batches):
    """The same steps through the builtin export in LiteRT, from the same weights: its losses, their
    difference from TensorFlow's, the largest weight difference after the steps, and what trained
    (`builtin`: all / head), or why the step has no builtin form."""
    try:
        length = max(np.shape(x)[1] for x, _ in batches) if isinstance(step.task, NextWordTask) else None
        check = compare_builtin(step, batches, length)
    except builtin_export.NotExportable as why:
        return table.assign(
            loss_builtin=np.nan,
            abs_difference_builtin=np.nan,
            max_weight_difference_builtin=np.nan,
            builtin=f"no builtin form: {why}",
        ), f"builtin: {why}"
    w_tf, w_lite = check["weights_tensorflow"], check["weights_litert"]
    table = table.assign(loss_builtin=check["litert"])
    table["abs_difference_builtin"] = (table.loss_builtin - table.loss_tensorflow).abs()
    table["max_weight_difference_builtin"] = max(float(np.abs(w_lite[k] - w_tf[k]).max()) for k in w_tf)
    mode = check["module"].train_mode
    table["builtin"] = mode
    return table, (f"builtin export ({mode}) in LiteRT: max |loss difference| {table.abs_difference_builtin.max():.2e}")


def parity_row(name: str, check: dict) -> dict:
    """One table row from `compare`: largest loss and weight differences, file size, op list."""
    w_tf, w_lite = check["weights_tensorflow"], check["weights_litert"]
    return {
        "model": name,
        "mode": "builtin",
        "steps": len(check["litert"]),
        "max_loss_diff": float(np.max(np.abs(np.subtract(check["litert"], check["tensorflow"])))),
        "max_weight_diff": max(float(np.max(np.abs(w_lite[k] - w_tf[k]))) for k in w_tf),
        "size_bytes": len(check["flatbuffer"]),
        "ops": " ".join(litert.operators(check["flatbuffer"])),
    }


# --- the CLI: one small instance per family, both modes -------------------------------------------


def _spec(name, model, task, lr, optimizer, train, batches, sequence_length=None, **signatures) -> dict:
    keys = ("name", "model", "task", "lr", "optimizer", "train", "batches", "sequence_length", "signatures")
    return dict(zip(keys, (name, model, task, lr, optimizer, train, batches, sequence_length, signatures)))


def _instances(rng: np.random.Generator) -> list[dict]:
    """A small instance of every family: name, model, task, training set-up and 8 batches."""
    from ..models import lstm_lm, mobilenet_v1, mobilenet_v2, yamnet

    lm = lstm_lm.LSTMConfig(input_vocab=60, output_vocab=40, embedding_dim=16, hidden_units=32)
    text = []
    for _ in range(8):  # right-padded batches of 8 samples of 3 to 10 words, as Samples.padded makes them
        real = np.arange(10)[None, :] < rng.integers(3, 11, size=(8, 1))
        text.append((rng.integers(2, lm.input_vocab, (8, 10)) * real, rng.integers(2, lm.output_vocab, (8, 10)) * real))
    colla = mrnn.MRNNConfig(locations=30, outputs=16, embedding_dim=8, hidden_units=16, history=6, slots=True)
    device = mrnn.build(colla, seed=0)
    device.get_layer("slots").set_weights([(np.arange(16) < 10).astype(np.float32)])  # 10 of 16 slots on
    places = [
        (np.stack([rng.integers(0, n, (8, colla.history)) for n in colla.id_counts()], axis=-1), rng.integers(0, 10, 8))
        for _ in range(8)
    ]

    def images(shape, classes):
        return [(rng.random((8, *shape), np.float32), rng.integers(0, classes, 8)) for _ in range(8)]

    patches = [
        (rng.normal(size=(4, yamnet.PATCH_FRAMES, yamnet.MEL_BINS)), rng.random((4, 10)) < 0.2) for _ in range(8)
    ]
    audio = ClassificationTask((yamnet.PATCH_FRAMES, yamnet.MEL_BINS), 10, multi_label=True)
    places_task = ClassificationTask((colla.history, len(FEATURES)), 16, input_dtype=tf.int32)
    words = NextWordTask()
    return [
        _spec("deeptype_lstm_full", lstm_lm.build(lm, seed=0), words, 1e-3, "adam", TRAIN_ALL, text, 10),
        _spec(
            "deeptype_lstm_svd", compress(lstm_lm.build(lm, seed=0), rank=8), words, 1e-3, "adam", TRAIN_ALL, text, 10
        ),
        # DeepType's online path beside train: infer_and_cache, train_from_cache
        _spec(
            "deeptype_lstm_fine_tune", lstm_lm.build(lm, seed=0), words, 1e-3, "adam", TRAIN_HEAD, text, 10, reuse=True
        ),
        _spec("autlearn_lstm_last_layer", lstm_lm.build(lm, seed=0), words, 0.1, "sgd", TRAIN_HEAD, text, 10),
        _spec(
            "moil_mobilenet_v2_head",
            mobilenet_v2.build(32, 1, 5, 0.35),
            ClassificationTask((32, 32, 1), 5),
            1e-3,
            "adam",
            TRAIN_HEAD,
            images((32, 32, 1), 5),
        ),
        _spec("moil_yamnet_head", yamnet.build(10, seed=0), audio, 5e-4, "adam", TRAIN_HEAD, patches),
        _spec(
            "autlearn_mobilenet_v1_head",
            mobilenet_v1.build(None, 0.25, 32, 62, seed=0),
            ClassificationTask((28, 28, 1), 62),
            3e-3,
            "adam",
            TRAIN_HEAD,
            images((28, 28, 1), 62),
        ),
        # Colla's client update: train_distill with the teacher's q
        _spec("colla_mrnn_device", device, places_task, 1e-2, "adam", TRAIN_ALL, places, distill=0.5),
    ]


def flex_export(model: keras.Model, module: BuiltinTrainable, learning_rate: float, optimizer: str) -> bytes:
    """The Flex export (`device.tflite`) of the same set-up as `module`, for comparison."""
    hooks = [FineTune(module.trained_layers, freeze=True)] if module.train_mode == TRAIN_HEAD else []
    return tflite.convert(Step(_copy(model), module.task, learning_rate, optimizer, hooks))


def export_both(spec: dict, out: Path) -> tuple[dict, dict]:
    """Write `spec`'s model in both modes to `out`: manifest entries by file, and a comparison row.
    Builtin runs in LiteRT, Flex in TensorFlow's interpreter (the only one with the Flex delegate);
    step time: median over 14 steps after 2 of warm-up, the same batches for both."""
    name, model = spec["name"], spec["model"]
    hooks = [FineTune(model.layers[-1].name)] if spec["train"] == TRAIN_HEAD else []
    step = Step(model, spec["task"], spec["lr"], spec["optimizer"], hooks)
    check = compare_builtin(step, spec["batches"], spec["sequence_length"], **spec["signatures"])
    module, row = check["module"], parity_row(name, check)
    flex = flex_export(spec["model"], module, spec["lr"], spec["optimizer"])
    feeds = [builtin_export.feed(module, x, y) for x, y in spec["batches"]] * 2
    entries, seconds = {}, {}
    for mode, flatbuffer, interp, runtime in (
        ("builtin", check["flatbuffer"], litert.interpreter(check["flatbuffer"]), f"ai-edge-litert {litert.version()}"),
        ("flex", flex, tflite.interpreter(flex), f"tensorflow {tf.__version__} tf.lite.Interpreter + Flex delegate"),
    ):
        seconds[mode] = litert.median_step_seconds(interp.get_signature_runner("train"), feeds)
        file = f"{name}.{mode}.tflite"
        (out / file).write_bytes(flatbuffer)
        entries[file] = {
            "model": name,
            "mode": mode,
            "size_bytes": len(flatbuffer),
            "ops": litert.operators(flatbuffer),
            "custom_ops": litert.custom_operators(flatbuffer),
            "signatures": litert.signature_details(interp),
            "trains": module.trained_keys,
            "optimizer": spec["optimizer"],
            "learning_rate": spec["lr"],
            "runtime": {"converter": f"tensorflow {tf.__version__}", "interpreter": runtime},
            "median_step_seconds": seconds[mode],
        }
    entries[f"{name}.builtin.tflite"]["parity"] = {k: row[k] for k in ("steps", "max_loss_diff", "max_weight_diff")}
    return entries, {
        "model": name,
        "trains": spec["train"],
        "builtin_kb": len(check["flatbuffer"]) / 1024,
        "flex_kb": len(flex) / 1024,
        "builtin_step_ms": seconds["builtin"] * 1e3,
        "flex_step_ms": seconds["flex"] * 1e3,
        "max_loss_diff": row["max_loss_diff"],
        "max_weight_diff": row["max_weight_diff"],
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Export a small instance of every model family in builtin and "
        "flex mode; write manifest.json; compare step time and size."
    )
    parser.add_argument("--out", required=True, type=Path, help="directory for the .tflite files and manifest.json")
    parser.add_argument("--only", nargs="*", help="export only these instances (by name)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    manifest = {"runtime": {"tensorflow": tf.__version__, "ai-edge-litert": litert.version()}, "files": {}}
    table = []
    for spec in _instances(np.random.default_rng(0)):
        if not args.only or spec["name"] in args.only:
            entries, row = export_both(spec, args.out)
            manifest["files"].update(entries)
            table.append(row)
            print(f"{spec['name']}: exported both modes", flush=True)
    staged = args.out / ".manifest.json.part"  # written whole, then renamed: never a half manifest
    staged.write_text(json.dumps(manifest, indent=1))
    staged.replace(args.out / "manifest.json")
    cpu = (
        next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            platform.processor(),
        )
        if Path("/proc/cpuinfo").exists()
        else ""
    )
    print(
        f"machine: {platform.machine()} {cpu}, {os.cpu_count()} cores; "
        f"step time: median of 14 train steps after 2 warm-up, same batches in both modes"
    )
    with pd.option_context("display.width", 200, "display.float_format", "{:.3g}".format):
        print(pd.DataFrame(table).to_string(index=False))


if __name__ == "__main__":
    main()
