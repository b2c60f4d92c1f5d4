"""`make bench`: how fast the DeepType training step runs on this machine, in one printout (not a test).

    python -m ondevice.papers.deeptype.bench [--scale default] [--length 12] [--repeats 20]

Prints: the step time of each technique against full training (fine-tune, SVD compression of
the softmax), TFLite vs TensorFlow step time, one online batch with and without reuse at several
lengths, the machine's float32 GEMM FLOP/s and the full LSTM train step's achieved FLOP/s as a
fraction of it, at the personal batch (16) and the global batch (128), and with XLA compilation;
where a step's time goes (`step_parts`); evaluation throughput in positions and words per second.
The FLOP count is printed with its formula and the numbers that go into it (`step_flops`); the
measurements themselves are in `bench_measures`.

Models have the scale's shape with fresh weights: step time does not depend on the weights.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

LIMITS = (
    "  limits: the softmax GEMM runs near the machine's GEMM rate; each LSTM time step is a chain of small\n"
    "  products (batch x 4H) that cannot start before the previous step ends, so per-op overhead and memory\n"
    "  traffic set its pace; cross-entropy over the vocabulary and Adam's update of the V x H kernel are\n"
    "  memory-bound. Larger batches amortise the per-op overhead but grow the memory-bound logits."
)


@dataclass
class Bench:
    """What every section shares: the model's shape, a model with fresh weights, the task, the
    timed batches' length and the number of timed repeats."""

    config: object
    model: object
    task: object
    length: int
    repeats: int
    rng: np.random.Generator

    def batch(self, size: int, length: int | None = None):
        shape = (size, length or self.length)
        inputs = self.rng.integers(2, self.config.input_vocab, shape, dtype=np.int32)
        return inputs, self.rng.integers(2, self.config.output_vocab, shape, dtype=np.int32)

    def time(self, fn, *args, repeats: int | None = None, warmup: int = 3) -> float:
        """Median seconds of `fn(*args)` over `repeats` calls (default: the bench's) after `warmup`."""
        from ondevice.papers.deeptype.bench_measures import median_seconds

        return median_seconds(fn, repeats or self.repeats, *args, warmup=warmup)


def technique_steps(b: Bench, x, y) -> dict[str, float]:
    """[1] Seconds per step of full training and of each technique that changes the step."""
    from ondevice.models import svd_compression as svd
    from ondevice.training.fine_tune import FineTune
    from ondevice.training.trainer import Trainer

    rank = svd.rank_for(b.config.hidden_units, 0.1)
    compressed = svd.compress(b.model, rank)
    variants = {
        "full": (b.model, []),
        "fine_tune": (b.model, [FineTune()]),
        f"svd_compression (rank {rank})": (compressed, []),
        "svd_compression + fine_tune": (compressed, [FineTune()]),
    }
    steps = {}
    for name, (m, hooks) in variants.items():
        steps[name] = b.time(Trainer(m, b.task, 1e-3, hooks=hooks).step, x, y)
        print(f"  {name:34s} {steps[name] * 1e3:8.2f} ms   x{steps[name] / steps['full']:.2f} of full")
    print("  (vocabulary compression and bucketing change the model per user / the batches: not timed here)")
    return steps


def tflite_steps(b: Bench, x, y, steps: dict[str, float]) -> None:
    """[2] One training step through the TFLite interpreter (Flex delegate) against TensorFlow's."""
    from ondevice.device import tflite
    from ondevice.training.fine_tune import FineTune
    from ondevice.training.step import Step

    for name, hooks in (("full", []), ("fine_tune", [FineTune()])):
        train = tflite.interpreter(tflite.convert(Step(b.model, b.task, 1e-3, hooks=hooks)))
        run = train.get_signature_runner("train")
        lite = b.time(lambda r, a, c: r(tokens=a, labels=c), run, x, y)
        print(f"  {name:10s} TFLite {lite * 1e3:8.2f} ms   TF {steps[name] * 1e3:8.2f} ms   x{lite / steps[name]:.2f}")


def online_reuse(b: Bench) -> None:
    """[3] One online batch of 16 with and without reuse of inference results, TF and TFLite."""
    from ondevice.device import tflite
    from ondevice.training import inference_reuse

    online = inference_reuse.OnlineTrainer(b.model, b.task, 1e-3)
    reuse = inference_reuse.OnlineTrainer(b.model, b.task, 1e-3)
    lite = tflite.interpreter(tflite.convert(reuse, tflite.REUSE_SIGNATURES)).get_signature_runner
    ltrain, lcache, lfrom = lite("train"), lite("infer_and_cache"), lite("train_from_cache")
    header = ("length", 6), ("TF without", 11), ("TF with", 9), ("ratio", 6), ("TFLite without", 15), ("with", 6)
    print(" " + "".join(f" {name:>{width}s}" for name, width in header + (("ratio", 6),)))
    for length in (2, 10, 20, 30):
        bx, by = b.batch(16, length)
        feats, lfeats = online.infer_and_cache(bx)["features"], lcache(tokens=bx)["features"]
        r = [b.time(online.train, bx, by), b.time(online.train_from_cache, feats, by)]
        r.append(b.time(lambda a, c: ltrain(tokens=a, labels=c), bx, by))
        r.append(b.time(lambda f, c: lfrom(features=f, labels=c), lfeats, by))
        cells = (r[0] * 1e3, r[1] * 1e3, r[0] / r[1], r[2] * 1e3, r[3] * 1e3, r[2] / r[3])
        print(f"  {length:6d}" + "".join(f" {v:{width}.2f}" for v, (_, width) in zip(cells, header[1:] + (("", 6),))))


def against_gemm(b: Bench, steps: dict[str, float]) -> None:
    """[4] The full train step's achieved FLOP/s as a fraction of this run's GEMM FLOP/s, where the
    step's time goes, and the same step compiled by XLA."""

    from ondevice.papers.deeptype.bench_measures import gemm_flops, step_flops, step_parts
    from ondevice.training import inference_reuse
    from ondevice.training.step import Step
    from ondevice.training.trainer import Trainer

    start, peak = b.model.get_weights(), gemm_flops()
    print(f"  GEMM (float32 matmul, TensorFlow): {peak / 1e9:.1f} GFLOP/s")
    print(f"  FLOPs of a train step = 3 x forward (backward counted as 2 x forward); {step_flops(b.config, 1, 1)[1]}")
    for size in (16, 128):
        t = b.time(Trainer(b.model, b.task, 1e-3).step, *b.batch(size))
        f, _, formula = step_flops(b.config, size, b.length)
        print(f"  batch {size:3d}: {formula}")
        print(f"  batch {size:3d}: {t * 1e3:8.2f} ms/step -> {f / t / 1e9:6.2f} GFLOP/s = {f / t / peak:6.1%} of GEMM")
        b.model.set_weights(start)
    # where the time goes: the softmax (one big GEMM per step) vs the LSTM layers (a loop of small ones)
    lstm, soft = (f * 16 * b.length for f in inference_reuse.forward_flops(b.config, 1))
    below, dt = 2 * lstm + soft, steps["full"] - steps["fine_tune"]
    if dt > 0:  # full minus fine-tune: the LSTM backward (2 x LSTM forward) and the softmax's input gradient
        rate = below / dt
        print(
            f"  softmax: {soft / (soft + lstm):.0%} of the forward FLOPs at batch 16; the work full training adds over "
            f"fine-tune runs at ~{rate / 1e9:.1f} GFLOP/s = {rate / peak:.0%} of GEMM"
        )
    for size in (16, 128):
        parts = step_parts(b.model, b.task, b.batch(size), b.repeats)
        full = parts["full step (+ SGD update, clip 5)"]
        print(f"  where a step's time goes, batch {size} x length {b.length} (ms, share of the full step):")
        for name, ms in parts.items():
            print(f"    {name:42s} {ms:8.2f}  {ms / full:5.0%}")
    # an attempt to raise the fraction: compile the same step with XLA (fuses the LSTM loop's small ops)
    try:
        xla = Step(b.model, b.task, 1e-3, jit_compile=True).train
        tx = b.time(lambda a, c: float(xla(a, c)["loss"]), *b.batch(16), repeats=min(b.repeats, 3), warmup=1)
        rate = step_flops(b.config, 16, b.length)[0] / tx
        print(f"  batch  16, XLA (jit_compile): {tx * 1e3:8.2f} ms/step -> {rate / peak:6.1%} of GEMM")
    except Exception as exc:  # noqa: BLE001  (XLA is an attempt, not a requirement)
        print(f"  batch  16, XLA: not available ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})")
    b.model.set_weights(start)
    print(LIMITS)


def evaluation(b: Bench) -> None:
    """[5] Evaluation throughput, compiled against the eager per-sample path it replaced."""
    from ondevice.papers.deeptype.bench_measures import eval_throughput

    r = eval_throughput(b.model, b.task, b.config)
    print(f"  compiled: {r['positions_per_s']:,.0f} positions/s = {r['words_per_s']:,.0f} typed words/s")
    speedup = r["positions_per_s"] / r["eager_positions_per_s"]
    print(f"  eager, per-sample R(x) (before): {r['eager_positions_per_s']:,.0f} positions/s -> x{speedup:.2f}")
    print(f"  the same R(x) for every word: {r['same_chars_needed']}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Step-time benchmark of the DeepType training step.")
    ap.add_argument("--scale", default="default", choices=("smoke", "default", "paper"))
    ap.add_argument("--length", type=int, default=12, help="sequence length of the timed batches (samples: ~12)")
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args(argv)

    import tf_keras as keras

    from ondevice.data.typing_samples import CHARS
    from ondevice.models import lstm_lm
    from ondevice.tasks.next_word import NextWordTask
    from ondevice.tasks.typing_protocol import MODEL_PRESETS, DeepTypeParams

    preset = MODEL_PRESETS[args.scale]
    fields = ("vocab_size", "embedding_dim", "hidden_units", "lstm_layers")
    words, embedding, hidden, layers = (preset.get(f, getattr(DeepTypeParams, f)) for f in fields)
    # the input side holds the words and the characters (see data.typing_samples.Vocabulary)
    config = lstm_lm.LSTMConfig(words + len(CHARS), words, embedding, hidden, layers)
    model = lstm_lm.build(config, seed=0)
    b = Bench(config, model, NextWordTask(), args.length, args.repeats, np.random.default_rng(0))
    x, y = b.batch(16)
    print(
        f"ondevice bench: {args.scale} model (vocabulary {words}, embedding {embedding}, {layers} x LSTM {hidden}), "
        f"batch 16 x length {args.length}, {os.cpu_count()} CPUs, medians of {args.repeats} steps"
    )
    start = model.get_weights()
    print("\n[1] step time per technique (TensorFlow), relative to full training")
    steps = technique_steps(b, x, y)
    model.set_weights(start)
    print("\n[2] TFLite (Flex delegate) vs TensorFlow, one training step")
    tflite_steps(b, x, y, steps)
    print("\n[3] one online batch of 16, without / with reuse of inference results (ms)")
    online_reuse(b)
    model.set_weights(start)
    print("\n[4] achieved FLOP/s of the full LSTM train step vs this machine's GEMM")
    against_gemm(b, steps)
    print("\n[5] evaluation throughput (task.evaluate: top-k-eff and perplexity, batches of 256)")
    evaluation(b)
    keras.backend.clear_session()
    return 0


if __name__ == "__main__":
    sys.exit(main())
