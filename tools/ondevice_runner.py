#!/usr/bin/env python3
"""Personalise an exported trainable .tflite model on a device and log how long it took.

Needs only numpy and a TFLite interpreter that links the Flex delegate (the LSTM's gradients and
checkpoints are Select TF ops): `tensorflow` (2.19: `tf.lite.Interpreter`) on a Linux board or in
Termux, or any build of the interpreter with Flex. It does not import the `ondevice` package.

    python ondevice_runner.py --model fine_tune_reuse.tflite --data user_0.npz --out log.json \
        [--epochs 1] [--reuse] [--warmup 3] [--device "Pixel 7"] [--checkpoint /tmp/personal.ckpt]

The data file is written by `make export` (`results/<scale>/export/user_0.npz`): `tokens` and
`labels`, int32 [batches, batch size, longest], right-padded, and `lengths` [batches]; batch i is
cut to `lengths[i]` positions before it is fed. Each step runs the `train` signature; with
`--reuse` (a file with `infer_and_cache` / `train_from_cache`) each online batch is first run
through `infer_and_cache`, as the keyboard does while the user types, and only
`train_from_cache` counts as the training step (the inference time is logged separately).
After training the runner saves a checkpoint, opens a new interpreter, restores it and checks
that it predicts what the trained one predicts.

The JSON log is also a *device profile*: `ondevice.device.device_profile.load_device_profile` reads it,
and the notebooks extrapolate training time to that device from `steady_step_seconds` (labelled
"extrapolated"). Fields: format, device, machine, variant, model, batch_size, mean_length,
steps, step_seconds (every step), steady_step_seconds (median after warm-up),
inference_seconds (with --reuse), losses, load_seconds, peak_rss_mb, restore_max_abs_diff.

On a phone or a board:

1. `make export SCALE=default` on the workstation.
2. Linux board (Raspberry Pi 4/5, Jetson, ...; aarch64): `pip install numpy tensorflow==2.19.*`,
   copy `tools/ondevice_runner.py`, the .tflite and `user_0.npz`, run the command above.
3. Android phone, simplest: Termux with a Python that has TensorFlow 2.19 (or a proot Debian in
   Termux: `pip install numpy tensorflow`), `adb push` the three files to the phone, run as above,
   `adb pull` the log. Android app: the same loop in Kotlin/Java with
   `org.tensorflow:tensorflow-lite` and `tensorflow-lite-select-tf-ops` (the Flex delegate),
   `Interpreter.runSignature(inputs, outputs, "train")` per batch, timing each call with
   `SystemClock.elapsedRealtimeNanos()` and writing the same JSON fields.
4. Feed the log back: notebooks take it as `device_profile = "path/to/log.json"`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import tempfile
import time

import numpy as np

FORMAT = "ondevice-runner-log/1"


def make_interpreter(path: str):
    try:  # full TensorFlow: its interpreter links the Flex delegate
        import warnings

        import tensorflow as tf

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return tf.lite.Interpreter(model_path=path)
    except ImportError:  # a tflite_runtime built with Flex
        from tflite_runtime.interpreter import Interpreter

        return Interpreter(model_path=path)


def peak_rss_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1e6 if sys.platform == "darwin" else peak / 1024  # bytes on macOS, KiB on Linux


def run(
    model: str,
    data: str,
    epochs: int = 1,
    reuse: bool = False,
    warmup: int = 3,
    device: str = "",
    checkpoint: str = "",
    max_steps: int = 0,
) -> dict:
    start = time.perf_counter()
    interp = make_interpreter(model)
    interp.allocate_tensors()
    load_seconds = time.perf_counter() - start
    signatures = interp.get_signature_list()
    if reuse and not {"infer_and_cache", "train_from_cache"} <= set(signatures):
        raise SystemExit(f"{model} has no infer_and_cache/train_from_cache signatures; run without --reuse")
    batches = np.load(data)
    tokens, labels, lengths = batches["tokens"], batches["labels"], batches["lengths"]
    train = interp.get_signature_runner("train_from_cache" if reuse else "train")
    cache = interp.get_signature_runner("infer_and_cache") if reuse else None
    steps, inference, losses, used_lengths = [], [], [], []
    for _ in range(epochs):
        for i in range(len(lengths)):
            if max_steps and len(steps) >= max_steps:
                break
            n = int(lengths[i])
            x, y = np.ascontiguousarray(tokens[i, :, :n]), np.ascontiguousarray(labels[i, :, :n])
            if reuse:
                t0 = time.perf_counter()
                features = cache(tokens=x)["features"]
                inference.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                loss = train(features=features, labels=y)["loss"]
            else:
                t0 = time.perf_counter()
                loss = train(tokens=x, labels=y)["loss"]
            steps.append(time.perf_counter() - t0)
            losses.append(float(loss))
            used_lengths.append(n)
    # save -> new interpreter -> restore -> the same predictions
    ckpt = checkpoint or os.path.join(tempfile.mkdtemp(prefix="ondevice-runner-"), "personal.ckpt")
    probe = np.ascontiguousarray(tokens[0, :, : int(lengths[0])])
    before = interp.get_signature_runner("infer")(tokens=probe)["logits"]
    interp.get_signature_runner("save")(checkpoint_path=np.array(ckpt.encode()))
    fresh = make_interpreter(model)
    fresh.allocate_tensors()
    fresh.get_signature_runner("restore")(checkpoint_path=np.array(ckpt.encode()))
    after = fresh.get_signature_runner("infer")(tokens=probe)["logits"]
    steady = steps[warmup:] if len(steps) > warmup else steps
    return {
        "format": FORMAT,
        "device": device or platform.node(),
        "machine": platform.machine(),
        "system": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "model": os.path.basename(model),
        "variant": os.path.splitext(os.path.basename(model))[0] + ("+reuse" if reuse else ""),
        "batch_size": int(tokens.shape[1]),
        "mean_length": float(np.mean(used_lengths)),
        "steps": len(steps),
        "step_seconds": steps,
        "steady_step_seconds": float(np.median(steady)),
        "warmup": warmup,
        "inference_seconds": inference,
        "losses": losses,
        "load_seconds": load_seconds,
        "peak_rss_mb": peak_rss_mb(),
        "restore_max_abs_diff": float(np.abs(before - after).max()),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Personalise an exported .tflite model and log step times.")
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True, help="the JSON timing log (a device profile)")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--reuse", action="store_true", help="infer_and_cache, then train_from_cache per batch")
    ap.add_argument("--warmup", type=int, default=3, help="steps left out of steady_step_seconds")
    ap.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: all)")
    ap.add_argument("--device", default="", help="a name for the device (default: the host name)")
    ap.add_argument("--checkpoint", default="", help="where to save the personal weights")
    args = ap.parse_args(argv)
    log = run(args.model, args.data, args.epochs, args.reuse, args.warmup, args.device, args.checkpoint, args.max_steps)
    with open(args.out, "w") as f:
        json.dump(log, f, indent=1)
    print(
        f"{log['steps']} steps, steady {log['steady_step_seconds'] * 1e3:.1f} ms/step, "
        f"peak RSS {log['peak_rss_mb']:.0f} MB, restore max |diff| {log['restore_max_abs_diff']:.1e} -> {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
