"""On-device artifacts: every DeepType personal-model variant as a trainable .tflite, a manifest,
and a per-user data file for `tools/ondevice_runner.py`.

    python -m ondevice.papers.deeptype.export --scale default        # or: make export SCALE=default

writes `results/<scale>/export/`:

- `<variant>.tflite`: `full` (every layer trains), `fine_tune` (only the softmax, Sec. 5.4),
  `fine_tune_reuse` (plus `infer_and_cache` / `train_from_cache`, Sec. 5.5), and the same with the
  softmax SVD-compressed (Sec. 5.1; see NOTES), from the first seed's cached global model, trained
  by the personal optimizer at the personal rate of `deeptype_online_latency`. Vocabulary
  compression is per user and bucketing changes batches, not the file: not exported;
- `user_0.npz`: the first test user's training samples in online batches (`tokens`, `labels`:
  int32 [batches, batch size, longest length], right-padded with 0; `lengths`: the length each
  batch is cut to before it is fed);
- `manifest.json`: per file its signatures (shapes, -1 = any, and dtypes), size and Flex ops.

The runner's timing log is a device profile: `ondevice.device.device_profile` reads it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from ondevice import REPO_ROOT

SVD_NOTE = (
    "softmax factored at 10% of its input width from the global model, without the cloud re-training "
    "(svd_retrain.retrain_global): the file's structure and step cost are the compressed model's, its "
    "weights are not the re-trained ones"
)
RUNNER = "python tools/ondevice_runner.py --model <file> --data user_0.npz --out log.json"
NOTES = {"svd_compression": SVD_NOTE, "svd_compression_fine_tune_reuse": SVD_NOTE}


def variant_modules(model, task, learning_rate: float, optimizer: str = "adam", clip_norm: float = 0.0) -> dict:
    """name -> (trainable module, its signatures) of every exported variant."""
    from ondevice.device.tflite import REUSE_SIGNATURES, SIGNATURES
    from ondevice.models import svd_compression as svd
    from ondevice.training.fine_tune import FineTune
    from ondevice.training.inference_reuse import OnlineTrainer
    from ondevice.training.step import Step

    compressed = svd.compress(model, svd.rank_for(int(model.get_layer("softmax").input.shape[-1]), 0.1))
    training, clip = (task, learning_rate, optimizer), {"clip_norm": clip_norm}
    return {
        "full": (Step(model, *training, **clip), SIGNATURES),
        "fine_tune": (Step(model, *training, hooks=[FineTune()], **clip), SIGNATURES),
        "fine_tune_reuse": (OnlineTrainer(model, *training, **clip), REUSE_SIGNATURES),
        "svd_compression": (Step(compressed, *training, **clip), SIGNATURES),
        "svd_compression_fine_tune_reuse": (OnlineTrainer(compressed, *training, **clip), REUSE_SIGNATURES),
    }


def describe(flatbuffer: bytes) -> dict:
    """Manifest entry of one file: signatures, size, Flex need and Select ops."""
    from ondevice.device import litert, tflite, tflite_reuse

    ops = tflite_reuse.flex_ops(flatbuffer)
    return {
        "size_bytes": len(flatbuffer),
        "needs_flex": bool(ops),
        "flex_ops": ops,
        "signatures": litert.signature_details(tflite.interpreter(flatbuffer)),
    }


def export(scale: str, seed: int = 0, out: Path | None = None, overrides: dict | None = None, log=print) -> dict:
    """Write the variants, the first test user's data file and manifest.json; returns the manifest."""
    from ondevice.data import per_user_text
    from ondevice.device import tflite
    from ondevice.papers.deeptype import common, protocol
    from ondevice.papers.deeptype.experiments.deeptype_online_latency import Params
    from ondevice.report.record import atomic_write

    p = Params.for_scale(scale, seed, **(overrides or {}))
    out = Path(out) if out else REPO_ROOT / "results" / scale / "export"
    corpus = per_user_text.load_corpus(p, log=log)
    models = common.train_global(p, corpus, log)
    models.model.set_weights(models.weights[p.seed])
    files = {}
    training = (p.personal_learning_rate, p.personal_optimizer, p.personal_clip_norm)
    modules = variant_modules(models.model, common.task(p), *training)
    for name, (module, signatures) in modules.items():
        flatbuffer = tflite.convert(module, signatures)
        atomic_write(out / f"{name}.tflite", lambda path, b=flatbuffer: path.write_bytes(b))
        entry = files[f"{name}.tflite"] = {"variant": name, **describe(flatbuffer)} | (
            {"note": NOTES[name]} if name in NOTES else {}
        )
        log(f"{name}.tflite: {len(flatbuffer) / 1e6:.2f} MB, Flex ops: {', '.join(entry['flex_ops']) or 'none'}")
    user = corpus.split.test[0]
    data = protocol.user_batches(corpus.personal(user, p.personal_train_fraction)[0], p.online_batch_size)
    atomic_write(out / "user_0.npz", lambda path: np.savez(open(path, "wb"), **data))
    model = dict(input_vocab=corpus.vocab.input_size, output_vocab=corpus.vocab.size, embedding_dim=p.embedding_dim)
    model.update(hidden_units=p.hidden_units, lstm_layers=p.lstm_layers)
    user_data = dict(user=user, batches=int(len(data["lengths"])), batch_size=p.online_batch_size)
    user_data["longest"] = int(data["tokens"].shape[2])
    manifest = dict(scale=scale, seed=p.seed, optimizer=p.personal_optimizer, learning_rate=p.personal_learning_rate)
    manifest.update(model=model, global_model_from_cache=models.entries[p.seed].hit, files=files)
    manifest.update(user_data={"user_0.npz": user_data}, runner=RUNNER)
    atomic_write(out / "manifest.json", lambda path: path.write_text(json.dumps(manifest, indent=1, sort_keys=True)))
    log(f"wrote {len(files)} models, user_0.npz and manifest.json to {out}")
    return manifest


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
