"""On-device artifacts: every DeepType personal-model variant as a trainable .tflite, a manifest,
per-user data files for `tools/ondevice_runner.py`, and device profiles read back from it.

    python -m ondevice.papers.deeptype.export --scale default        # or: make export SCALE=default

writes `results/<scale>/export/`:

- `<variant>.tflite`: `full` (every layer trains), `fine_tune` (only the softmax trains, Sec. 5)
  and `fine_tune_reuse` (fine-tune plus `infer_and_cache` / `train_from_cache`, Sec. 5.5), each
  converted from the cached global model of the first seed (builtin ops where they suffice, Flex
  where needed); with `techniques/deeptype/svd_compression.py` present also `svd_compression`
  and `svd_compression_fine_tune_reuse` (see NOTES: not the cloud-re-trained weights).
  Vocabulary compression is per user and bucketing changes batches, not the file: not exported;
- `user_<n>.npz`: the first test user's personal training samples in online batches
  (`tokens`, `labels`: int32 [batches, batch size, longest length], right-padded with 0;
  `lengths`: int32 [batches], the length each batch is cut to before it is fed);
- `manifest.json`: per file its signatures with input and output shapes (-1 = any) and dtypes,
  size, whether it needs the Flex delegate and which Select TF ops it uses, and the data files.

A device profile is the JSON timing log the runner writes on a phone or board (see the runner's
docstring). `load_device_profile` reads it and `extrapolate_seconds` turns a number of training
steps into seconds on that device; every such number is labelled "extrapolated".
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from ondevice import REPO_ROOT

PROFILE_FORMAT = "ondevice-runner-log/1"
VARIANTS = ("full", "fine_tune", "fine_tune_reuse")
NOTES = {
    "svd_compression": "softmax factored at 10% of its input width from the global model, without the cloud "
                       "re-training (svd_compression.retrain_global): the file's structure and step cost are the "
                       "compressed model's, its weights are not the re-trained ones",
}
NOTES["svd_compression_fine_tune_reuse"] = NOTES["svd_compression"]


def user_batches(samples, batch_size: int) -> dict[str, np.ndarray]:
    """A user's samples in typing order, cut into online batches of `batch_size` (the last partial
    batch is dropped, as a keyboard trains only once its buffer is full), padded to one shape."""
    n = len(samples) // batch_size
    if n == 0:
        raise ValueError(f"the user has {len(samples)} samples, fewer than one batch of {batch_size}")
    padded = [samples.padded(np.arange(i * batch_size, (i + 1) * batch_size)) for i in range(n)]
    longest = max(x.shape[1] for x, _ in padded)
    tokens = np.zeros((n, batch_size, longest), np.int32)
    labels = np.zeros((n, batch_size, longest), np.int32)
    for i, (x, y) in enumerate(padded):
        tokens[i, :, : x.shape[1]], labels[i, :, : y.shape[1]] = x, y
    return {"tokens": tokens, "labels": labels, "lengths": np.array([x.shape[1] for x, _ in padded], np.int32)}


def variant_modules(model, task, learning_rate: float, optimizer: str = "adam") -> dict:
    """name -> (trainable module, signatures) for every variant that exists in this checkout."""
    import importlib

    from ondevice.papers.deeptype.techniques.fine_tune import FineTune
    from ondevice.device import tflite, tflite_reuse

    out = {
        "full": (tflite.TrainableModel(model, task, learning_rate, optimizer), tflite_reuse.BASE_SIGNATURES),
        "fine_tune": (tflite.TrainableModel(model, task, learning_rate, optimizer, hooks=[FineTune()]),
                      tflite_reuse.BASE_SIGNATURES),
        "fine_tune_reuse": (tflite_reuse.ReuseTrainableModel(model, task, learning_rate, optimizer),
                            tflite_reuse.REUSE_SIGNATURES),
    }
    try:  # SVD compression of the softmax (written separately; exported when its module is here)
        svd = importlib.import_module("ondevice.papers.deeptype.techniques.svd_compression")
        compressed = svd.compress(model, svd.rank_for(int(model.get_layer("softmax").input.shape[-1]), 0.1))
        out["svd_compression"] = (tflite.TrainableModel(compressed, task, learning_rate, optimizer),
                                  tflite_reuse.BASE_SIGNATURES)
        out["svd_compression_fine_tune_reuse"] = (
            tflite_reuse.ReuseTrainableModel(compressed, task, learning_rate, optimizer), tflite_reuse.REUSE_SIGNATURES)
    except (ImportError, AttributeError, ValueError):
        pass
    return out


def describe(flatbuffer: bytes) -> dict:
    """Manifest entry of one file: signatures, size, Flex need and Select ops."""
    from ondevice.device import tflite, tflite_reuse

    ops = tflite_reuse.flex_ops(flatbuffer)
    return {"size_bytes": len(flatbuffer), "needs_flex": bool(ops), "flex_ops": ops,
            "signatures": tflite_reuse.signature_details(tflite.interpreter(flatbuffer))}


def export(scale: str, seed: int = 0, out: Path | None = None, overrides: dict | None = None, log=print) -> dict:
    """Write the variants, the first test user's data file and manifest.json; returns the manifest."""
    from ondevice.papers.deeptype import common
    from ondevice.papers.deeptype.experiments.deeptype_online_latency import Params
    from ondevice.report.record import atomic_write
    from ondevice.tasks.next_word import NextWordTask
    from ondevice.device import tflite_reuse

    params = Params.for_scale(scale, seed, **(overrides or {}))
    out = Path(out) if out else REPO_ROOT / "results" / scale / "export"
    corpus = common.load_corpus(params, log=log)
    models = common.train_global(params, corpus, log)
    model = models.model
    model.set_weights(models.weights[params.seed])
    task = NextWordTask(params.k)
    files = {}
    for name, (module, signatures) in variant_modules(model, task, params.online_learning_rate, params.optimizer).items():
        flatbuffer = tflite_reuse.convert(module, signatures)
        atomic_write(out / f"{name}.tflite", lambda p, b=flatbuffer: p.write_bytes(b))
        files[f"{name}.tflite"] = {"variant": name, **describe(flatbuffer), **({"note": NOTES[name]} if name in NOTES else {})}
        log(f"{name}.tflite: {len(flatbuffer) / 1e6:.2f} MB, Flex ops: {', '.join(files[f'{name}.tflite']['flex_ops']) or 'none'}")
    user = corpus.split.test[0]
    train, _ = corpus.personal(user, params.personal_train_fraction)
    data = user_batches(train, params.online_batch_size)
    atomic_write(out / "user_0.npz", lambda p: np.savez(open(p, "wb"), **data))
    manifest = {
        "scale": scale, "seed": params.seed, "optimizer": params.optimizer,
        "learning_rate": params.online_learning_rate,
        "model": {"input_vocab": corpus.vocab.input_size, "output_vocab": corpus.vocab.size,
                  "embedding_dim": params.embedding_dim, "hidden_units": params.hidden_units,
                  "lstm_layers": params.lstm_layers},
        "global_model_from_cache": models.entries[params.seed].hit,
        "files": files,
        "user_data": {"user_0.npz": {"user": user, "batches": int(len(data["lengths"])),
                                     "batch_size": params.online_batch_size,
                                     "longest": int(data["tokens"].shape[2])}},
        "runner": "python tools/ondevice_runner.py --model <file> --data user_0.npz --out log.json",
    }
    atomic_write(out / "manifest.json", lambda p: p.write_text(json.dumps(manifest, indent=1, sort_keys=True)))
    log(f"wrote {len(files)} models, user_0.npz and manifest.json to {out}")
    return manifest


def load_device_profile(path: str | Path) -> dict:
    """A runner log (a device profile): checked for the fields extrapolation needs."""
    profile = json.loads(Path(path).read_text())
    if profile.get("format") != PROFILE_FORMAT:
        raise ValueError(f"{path}: not a device profile (format {profile.get('format')!r}, expected {PROFILE_FORMAT!r})")
    for key in ("device", "variant", "steady_step_seconds", "mean_length", "batch_size"):
        if key not in profile:
            raise ValueError(f"{path}: device profile lacks {key!r}")
    return profile


def extrapolate_seconds(profile: dict, steps: int, mean_length: float | None = None) -> dict:
    """Training time of `steps` steps on the profiled device, from its steady step time. With
    `mean_length`, the step time is scaled linearly from the profile's mean sequence length (an
    LSTM step's work is proportional to the positions it runs); without, used as measured."""
    step = float(profile["steady_step_seconds"])
    if mean_length is not None:
        step *= float(mean_length) / float(profile["mean_length"])
    return {"device": profile["device"], "variant": profile["variant"], "steps": int(steps),
            "step_seconds": step, "seconds": step * steps, "label": "extrapolated"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", default="default", choices=("smoke", "default", "paper"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="", help="default: results/<scale>/export")
    ap.add_argument("--params", default="{}", help="JSON overrides of the online-latency parameters")
    args = ap.parse_args(argv)
    export(args.scale, args.seed, Path(args.out) if args.out else None, json.loads(args.params))
    return 0


if __name__ == "__main__":
    sys.exit(main())
