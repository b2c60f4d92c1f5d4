"""`make bench`: how fast the DeepType training step runs on this machine, in one printout (not a test).

    python -m ondevice.papers.deeptype.bench [--scale default] [--length 12] [--repeats 20]

Prints: the step time of each technique against full training (fine-tune; SVD compression of
the softmax when `techniques/deeptype/svd_compression.py` exists), TFLite vs TensorFlow step
time, one online batch with and without reuse at several lengths, the machine's float32 GEMM
FLOP/s and the full LSTM train step's achieved FLOP/s as a fraction of it, at the personal batch
(16) and at the global batch (128), and with XLA compilation of the same step.

Models have the scale's shape with fresh weights: step time does not depend on the weights.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import time

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _median_seconds(fn, repeats: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def gemm_flops(n: int = 1024, repeats: int = 10) -> float:
    """float32 matmul FLOP/s of an n x n product (2 n^3 FLOPs), best of the medians over two sizes."""
    import tensorflow as tf

    best = 0.0
    for size in (n // 2, n):
        a = tf.random.stateless_normal([size, size], seed=[1, 2])
        b = tf.random.stateless_normal([size, size], seed=[3, 4])
        mm = tf.function(lambda: tf.matmul(a, b))
        seconds = _median_seconds(lambda: mm().numpy(), repeats)
        best = max(best, 2 * size ** 3 / seconds)
    return best


def train_flops(config, batch: int, length: int) -> float:
    """Analytic FLOPs of one full training step: forward (LSTM gates and softmax matmuls) and a
    backward pass of about twice the forward (gradients of inputs and weights)."""
    positions = batch * length
    forward, width = 2 * positions * config.hidden_units * config.output_vocab, config.embedding_dim
    for _ in range(config.layers):
        forward += 2 * positions * 4 * config.hidden_units * (width + config.hidden_units)
        width = config.hidden_units
    return 3.0 * forward


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Step-time benchmark of the DeepType training step.")
    ap.add_argument("--scale", default="default", choices=("smoke", "default", "paper"))
    ap.add_argument("--length", type=int, default=12, help="sequence length of the timed batches (DeepType samples: ~12)")
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args(argv)

    import tensorflow as tf
    import tf_keras as keras

    from ondevice.data.typing_samples import CHARS
    from ondevice.papers.deeptype.common import MODEL_PRESETS, DeepTypeParams
    from ondevice.models import lstm_lm
    from ondevice.tasks.next_word import NextWordTask
    from ondevice.papers.deeptype.techniques import inference_reuse
    from ondevice.papers.deeptype.techniques.fine_tune import FineTune
    from ondevice.training.trainer import Trainer
    from ondevice.device import tflite, tflite_reuse

    fields = {**{f: getattr(DeepTypeParams, f) for f in ("vocab_size", "embedding_dim", "hidden_units", "lstm_layers")},
              **{k: v for k, v in MODEL_PRESETS[args.scale].items() if k in ("vocab_size", "embedding_dim", "hidden_units")}}
    # the input side holds the words and the characters (see data.typing_samples.Vocabulary)
    config = lstm_lm.LSTMConfig(fields["vocab_size"] + len(CHARS), fields["vocab_size"], fields["embedding_dim"],
                                fields["hidden_units"], fields["lstm_layers"])
    task = NextWordTask()
    rng = np.random.default_rng(0)

    def batch(size, length):
        return (rng.integers(2, config.input_vocab, (size, length), dtype=np.int32),
                rng.integers(2, config.output_vocab, (size, length), dtype=np.int32))

    x, y = batch(16, args.length)
    print(f"ondevice bench: {args.scale} model (vocabulary {config.output_vocab}, embedding {config.embedding_dim}, "
          f"{config.layers} x LSTM {config.hidden_units}), batch 16 x length {args.length}, "
          f"{os.cpu_count()} CPUs, medians of {args.repeats} steps")

    # 1. baseline vs each technique
    model = lstm_lm.build(config, seed=0)
    start = model.get_weights()
    variants = {"full": (model, []), "fine_tune": (model, [FineTune()])}
    try:
        svd = importlib.import_module("ondevice.papers.deeptype.techniques.svd_compression")
        rank = svd.rank_for(config.hidden_units, 0.1)
        variants[f"svd_compression (rank {rank})"] = (svd.compress(model, rank), [])
        variants["svd_compression + fine_tune"] = (variants[f"svd_compression (rank {rank})"][0], [FineTune()])
    except (ImportError, AttributeError) as exc:
        print(f"  (svd_compression not benchmarked: {exc})")
    print("\n[1] step time per technique (TensorFlow), relative to full training")
    steps = {}
    for name, (m, hooks) in variants.items():
        trainer = Trainer(m, task, 1e-3, hooks=hooks)
        steps[name] = _median_seconds(lambda: trainer.step(x, y), args.repeats)
        print(f"  {name:34s} {steps[name] * 1e3:8.2f} ms   x{steps[name] / steps['full']:.2f} of full")
    print("  (vocab_compression and bucketing change the model per user / the batches, not a fixed-shape step: not timed here)")
    model.set_weights(start)

    # 2. TFLite vs TensorFlow
    print("\n[2] TFLite (Flex delegate) vs TensorFlow, one training step")
    for name, hooks in (("full", []), ("fine_tune", [FineTune()])):
        interp = tflite.interpreter(tflite.convert(tflite.TrainableModel(model, task, 1e-3, hooks=hooks)))
        train = interp.get_signature_runner("train")
        lite = _median_seconds(lambda: train(tokens=x, labels=y), args.repeats)
        print(f"  {name:10s} TFLite {lite * 1e3:8.2f} ms   TF {steps[name] * 1e3:8.2f} ms   TFLite/TF x{lite / steps[name]:.2f}")

    # 3. online batch with / without reuse
    print("\n[3] one online batch of 16, without / with reuse of inference results (ms)")
    online = inference_reuse.OnlineTrainer(model, task, 1e-3)
    interp = tflite.interpreter(tflite_reuse.convert(tflite_reuse.ReuseTrainableModel(model, task, 1e-3)))
    ltrain, lcache, lfrom = (interp.get_signature_runner(s) for s in ("train", "infer_and_cache", "train_from_cache"))
    print(f"  {'length':>6s} {'TF without':>11s} {'TF with':>9s} {'ratio':>6s} {'TFLite without':>15s} {'TFLite with':>12s} {'ratio':>6s}")
    for length in (2, 10, 20, 30):
        bx, by = batch(16, length)
        feats = online.infer_and_cache(bx)["features"]
        lfeats = lcache(tokens=bx)["features"]
        r = [_median_seconds(lambda: float(online.step_without_reuse(bx, by)), args.repeats),
             _median_seconds(lambda: float(online.train_from_cache(feats, by)), args.repeats),
             _median_seconds(lambda: ltrain(tokens=bx, labels=by), args.repeats),
             _median_seconds(lambda: lfrom(features=lfeats, labels=by), args.repeats)]
        print(f"  {length:6d} {r[0] * 1e3:11.2f} {r[1] * 1e3:9.2f} {r[0] / r[1]:6.2f} {r[2] * 1e3:15.2f} {r[3] * 1e3:12.2f} {r[2] / r[3]:6.2f}")
    model.set_weights(start)

    # 4. achieved FLOP/s
    print("\n[4] achieved FLOP/s of the full LSTM train step vs this machine's GEMM")
    peak = gemm_flops()
    print(f"  GEMM (float32 matmul, TensorFlow): {peak / 1e9:.1f} GFLOP/s")
    from ondevice.training.trainer import make_optimizer, train_step, trainable_variables

    for size in (16, 128):
        bx, by = batch(size, args.length)
        trainer = Trainer(model, task, 1e-3)
        t = _median_seconds(lambda: trainer.step(bx, by), args.repeats)
        f = train_flops(config, size, args.length)
        print(f"  batch {size:3d}: {t * 1e3:8.2f} ms/step, {f / 1e9:.3f} GFLOP -> {f / t / 1e9:6.2f} GFLOP/s = "
              f"{f / t / peak:6.1%} of GEMM")
        model.set_weights(start)
    # where the time goes: the softmax (one big GEMM per step) vs the LSTM layers (a loop of small ones)
    soft = 2 * 16 * args.length * config.hidden_units * config.output_vocab
    lstm = train_flops(config, 16, args.length) / 3 - soft
    below = 2 * lstm + soft  # full minus fine-tune: the LSTMs' backward pass and the softmax's input gradient
    dt = steps["full"] - steps["fine_tune"]
    print(f"  softmax: {soft / (soft + lstm):.0%} of the forward FLOPs at batch 16; the work full training adds over "
          f"fine-tune (LSTM backward) runs at ~{below / dt / 1e9:.1f} GFLOP/s = {below / dt / peak:.0%} of GEMM" if dt > 0 else "")
    # an attempt to raise the fraction: compile the same step with XLA (fuses the LSTM loop's small ops)
    bx, by = batch(16, args.length)
    try:
        variables = trainable_variables(model, [])
        opt = make_optimizer("adam", 1e-3)
        opt.build(variables)
        xla = tf.function(lambda a, b: train_step(model, task, opt, variables, [], a, b), jit_compile=True)
        tx = _median_seconds(lambda: float(xla(bx, by)), min(args.repeats, 3), warmup=1)
        f = train_flops(config, 16, args.length)
        print(f"  batch  16, XLA (jit_compile): {tx * 1e3:8.2f} ms/step -> {f / tx / peak:6.1%} of GEMM")
    except Exception as exc:  # noqa: BLE001  (XLA is an attempt, not a requirement)
        print(f"  batch  16, XLA: not available ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})")
    model.set_weights(start)
    print("  limits: the softmax GEMM runs near the machine's GEMM rate; each LSTM time step is a chain of small\n"
          "  products (batch x 4H) that cannot start before the previous step ends, so per-op overhead and memory\n"
          "  traffic set its pace; cross-entropy over the vocabulary and Adam's update of the V x H kernel are\n"
          "  memory-bound. Larger batches amortise the per-op overhead but grow the memory-bound logits.")
    keras.backend.clear_session()
    return 0


if __name__ == "__main__":
    sys.exit(main())
