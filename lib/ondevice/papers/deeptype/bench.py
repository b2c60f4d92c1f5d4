"""`make bench`: how fast the DeepType training step runs on this machine, in one printout (not a test).

    python -m ondevice.papers.deeptype.bench [--scale default] [--length 12] [--repeats 20]

Prints: the step time of each technique against full training (fine-tune, SVD compression of
the softmax), TFLite vs TensorFlow step time, one online batch with and without reuse at several
lengths, the machine's float32 GEMM FLOP/s and the full LSTM train step's achieved FLOP/s as a
fraction of it, at the personal batch (16) and the global batch (128), and with XLA compilation;
where a step's time goes (`step_parts`); evaluation throughput in positions and words per second.
The FLOP count is printed with its formula and the numbers that go into it (`step_flops`).

Models have the scale's shape with fresh weights: step time does not depend on the weights.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _median_seconds(fn, repeats: int, *args, warmup: int = 3) -> float:
    """Median wall seconds of `fn(*args)` over `repeats` calls after `warmup` untimed ones."""
    for _ in range(warmup):
        fn(*args)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def gemm_flops(n: int = 1024, repeats: int = 10) -> float:
    """float32 matmul FLOP/s of an n x n product (2 n^3 FLOPs), best of the medians over two sizes."""
    import tensorflow as tf

    best = 0.0
    for size in (n // 2, n):
        a = tf.random.stateless_normal([size, size], seed=[1, 2])
        b = tf.random.stateless_normal([size, size], seed=[3, 4])
        seconds = _median_seconds(lambda f, p, q: f(p, q).numpy(), repeats, tf.function(tf.matmul), a, b)
        best = max(best, 2 * size**3 / seconds)
    return best


def step_flops(config, batch: int, length: int) -> tuple[float, str, str]:
    """FLOPs of one full training step, and the formula they come from (forward, then step): forward FLOPs per position
    (each LSTM layer: 4 gates of (input + H) x H multiply-adds; the softmax: H x V; 2 FLOPs per
    multiply-add; elementwise work left out), times batch x length positions, times 3 (the backward
    pass counted as twice the forward: gradients of the inputs and of the weights)."""
    from ondevice.papers.deeptype.techniques.inference_reuse import forward_flops

    lstm, softmax = forward_flops(config, 1)
    h, widths = config.hidden_units, [config.embedding_dim] + [config.hidden_units] * (config.layers - 1)
    layers = " + ".join(f"2*4*{h}*({d}+{h})" for d in widths)
    total = 3 * (lstm + softmax) * batch * length
    forward = (
        f"forward per position = LSTM layers {layers} = {lstm:,.0f}, + softmax 2*{h}*{config.output_vocab} = "
        f"{softmax:,.0f}: {lstm + softmax:,.0f} FLOPs"
    )
    formula = f"3 x forward per position x batch x length = 3 x {lstm + softmax:,.0f} x {batch} x {length}"
    return total, forward, f"{formula} = {total / 1e9:.4f} GFLOP"


def step_parts(model, task, batch: tuple, repeats: int) -> dict[str, float]:
    """Median ms of one training step cut at its joints (forward; + loss; + gradients; + the
    optimizer update, i.e. the full step) and of the cross-entropy alone (forward and backward on
    logits of the step's shape): where the step's time goes, which the FLOP count cannot say, since
    the cross-entropy's exponentials over every position x vocabulary word are not GEMM FLOPs."""
    import tensorflow as tf

    from ondevice.training.trainer import make_optimizer

    x, y = (tf.constant(a) for a in batch)
    variables, opt = model.trainable_variables, make_optimizer("sgd", 0.1, 5.0)
    opt.build(variables)

    def gradients(x, y):
        with tf.GradientTape() as tape:
            loss = task.loss(y, model(x, training=True))
        return loss, tape.gradient(loss, variables)

    def step(x, y):
        loss, grads = gradients(x, y)
        opt.apply_gradients(zip(grads, variables))
        return loss

    def cross_entropy(logits, y, loss=task.loss):
        with tf.GradientTape() as tape:
            tape.watch(logits)
            value = loss(y, logits)
        return tape.gradient(value, logits)

    def sparse_op(y, logits):  # the loss before `next_word.cross_entropy`, for the comparison
        ce, mask = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits), tf.cast(y != 0, tf.float32)
        return tf.reduce_sum(ce * mask) / (
            tf.cast(tf.shape(y)[0], tf.float32) if task.loss_per == "sample" else tf.reduce_sum(mask)
        )

    logits = tf.random.stateless_normal([*y.shape, model.output_shape[-1]], seed=[5, 6])
    parts = {
        "forward": (lambda x, y: tf.reduce_sum(model(x, training=True)), (x, y)),
        "forward + loss": (lambda x, y: task.loss(y, model(x, training=True)), (x, y)),
        "forward + loss + gradients": (gradients, (x, y)),
        "full step (+ SGD update, clip 5)": (step, (x, y)),
        "cross-entropy alone (forward + backward)": (cross_entropy, (logits, y)),
        "  the same by TensorFlow's sparse op (before)": (lambda a, b: cross_entropy(a, b, sparse_op), (logits, y)),
    }
    start, out = model.get_weights(), {}
    for name, (fn, args) in parts.items():
        run = lambda f, *a: [tf.convert_to_tensor(t).numpy() for t in tf.nest.flatten(f(*a))]
        out[name] = _median_seconds(run, repeats, tf.function(fn), *args) * 1e3
    model.set_weights(start)
    return out


def eval_samples(config, n_words: int = 2000, seed: int = 0):
    """Random samples shaped like DeepType's (3 previous words, then 3-10 typed characters)."""
    from ondevice.data.typing_samples import Samples

    rng = np.random.default_rng(seed)
    context, chars = 3, rng.integers(3, 11, n_words)
    lengths = context + chars
    total = int(lengths.sum())
    inputs = rng.integers(2, config.input_vocab, total, dtype=np.int32)
    labels = rng.integers(2, config.output_vocab, total, dtype=np.int32)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    chars = chars.astype(np.int32)
    return Samples(inputs, labels, offsets, np.full(n_words, context, np.int32), chars, labels[:n_words])


def eager_evaluate(model, samples, k: int = 3, batch_size: int = 256) -> np.ndarray:
    """R(x) of every sample the way evaluation ran before it was compiled: the model called eagerly,
    the cross-entropy by `sparse_softmax_cross_entropy_with_logits`, R(x) one sample at a time."""
    import tensorflow as tf

    from ondevice.metrics import typed_chars_needed

    needed = np.zeros(len(samples), np.int32)
    for start in range(0, len(samples), batch_size):
        idx = np.arange(start, min(start + batch_size, len(samples)))
        x, y = samples.padded(idx)
        logits = model(x, training=False)
        shown = tf.concat([tf.fill([*y.shape, 2], -np.inf), logits[..., 2:]], axis=-1)  # never <pad>, <unk>
        label = tf.gather(logits, y, batch_dims=2)
        hit = (tf.reduce_sum(tf.cast(shown >= label[..., None], tf.int32), axis=-1) - 1 < k).numpy() & (y != 1)
        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits).numpy()
        for row, j in enumerate(idx):
            needed[j] = typed_chars_needed(hit[row], int(samples.n_context[j]), int(samples.word_len[j]))
    return needed


def eval_throughput(model, task, config, n_words: int = 2000, seed: int = 0) -> dict:
    """Positions and words per second of `task.evaluate` (top-k-eff and perplexity) and of the eager
    per-sample evaluation it replaced (`eager_evaluate`), and whether both give every word's R(x)."""
    samples = eval_samples(config, n_words, seed)
    same = np.array_equal(task.evaluate(model, samples)["chars_needed"], eager_evaluate(model, samples, task.k))
    compiled = _median_seconds(task.evaluate, 3, model, samples, warmup=0)
    eager = _median_seconds(eager_evaluate, 3, model, samples, task.k, warmup=0)
    positions = len(samples.inputs)
    return {
        "positions_per_s": positions / compiled,
        "words_per_s": n_words / compiled,
        "eager_positions_per_s": positions / eager,
        "same_chars_needed": same,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Step-time benchmark of the DeepType training step.")
    ap.add_argument("--scale", default="default", choices=("smoke", "default", "paper"))
    ap.add_argument("--length", type=int, default=12, help="sequence length of the timed batches (samples: ~12)")
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args(argv)

    import tensorflow as tf
    import tf_keras as keras

    from ondevice.data.typing_samples import CHARS
    from ondevice.device import tflite
    from ondevice.models import lstm_lm
    from ondevice.papers.deeptype.common import MODEL_PRESETS, DeepTypeParams
    from ondevice.papers.deeptype.techniques import inference_reuse
    from ondevice.papers.deeptype.techniques import svd_compression as svd
    from ondevice.papers.deeptype.techniques.fine_tune import FineTune
    from ondevice.tasks.next_word import NextWordTask
    from ondevice.training.trainer import Trainer, make_optimizer, train_step, trainable_variables

    preset = MODEL_PRESETS[args.scale]
    shape = [
        preset.get(f, getattr(DeepTypeParams, f))
        for f in ("vocab_size", "embedding_dim", "hidden_units", "lstm_layers")
    ]
    words, embedding, hidden, layers = shape
    # the input side holds the words and the characters (see data.typing_samples.Vocabulary)
    config = lstm_lm.LSTMConfig(words + len(CHARS), words, embedding, hidden, layers)
    task, rng = NextWordTask(), np.random.default_rng(0)

    def batch(size, length):
        inputs = rng.integers(2, config.input_vocab, (size, length), dtype=np.int32)
        return inputs, rng.integers(2, config.output_vocab, (size, length), dtype=np.int32)

    x, y = batch(16, args.length)
    print(
        f"ondevice bench: {args.scale} model (vocabulary {words}, embedding {embedding}, {layers} x LSTM {hidden}), "
        f"batch 16 x length {args.length}, {os.cpu_count()} CPUs, medians of {args.repeats} steps"
    )

    print("\n[1] step time per technique (TensorFlow), relative to full training")
    model = lstm_lm.build(config, seed=0)
    start, rank = model.get_weights(), svd.rank_for(hidden, 0.1)
    compressed = svd.compress(model, rank)
    variants = {
        "full": (model, []),
        "fine_tune": (model, [FineTune()]),
        f"svd_compression (rank {rank})": (compressed, []),
    }
    variants["svd_compression + fine_tune"] = (compressed, [FineTune()])
    steps = {}
    for name, (m, hooks) in variants.items():
        steps[name] = _median_seconds(Trainer(m, task, 1e-3, hooks=hooks).step, args.repeats, x, y)
        print(f"  {name:34s} {steps[name] * 1e3:8.2f} ms   x{steps[name] / steps['full']:.2f} of full")
    print("  (vocabulary compression and bucketing change the model per user / the batches: not timed here)")
    model.set_weights(start)

    print("\n[2] TFLite (Flex delegate) vs TensorFlow, one training step")
    for name, hooks in (("full", []), ("fine_tune", [FineTune()])):
        train = tflite.interpreter(tflite.convert(tflite.TrainableModel(model, task, 1e-3, hooks=hooks)))
        run = train.get_signature_runner("train")
        lite = _median_seconds(lambda r, a, b: r(tokens=a, labels=b), args.repeats, run, x, y)
        print(f"  {name:10s} TFLite {lite * 1e3:8.2f} ms   TF {steps[name] * 1e3:8.2f} ms   x{lite / steps[name]:.2f}")

    print("\n[3] one online batch of 16, without / with reuse of inference results (ms)")
    online = inference_reuse.OnlineTrainer(model, task, 1e-3)
    reuse = inference_reuse.ReuseTrainableModel(model, task, 1e-3)
    lite = tflite.interpreter(tflite.convert(reuse, inference_reuse.REUSE_SIGNATURES)).get_signature_runner
    ltrain, lcache, lfrom = lite("train"), lite("infer_and_cache"), lite("train_from_cache")
    header = ("length", 6), ("TF without", 11), ("TF with", 9), ("ratio", 6), ("TFLite without", 15), ("with", 6)
    print(" " + "".join(f" {name:>{width}s}" for name, width in header + (("ratio", 6),)))
    for length in (2, 10, 20, 30):
        bx, by = batch(16, length)
        feats, lfeats = online.infer_and_cache(bx)["features"], lcache(tokens=bx)["features"]
        r = [_median_seconds(online.step_without_reuse, args.repeats, bx, by)]
        r.append(_median_seconds(online.train_from_cache, args.repeats, feats, by))
        r.append(_median_seconds(lambda a, b: ltrain(tokens=a, labels=b), args.repeats, bx, by))
        r.append(_median_seconds(lambda f, b: lfrom(features=f, labels=b), args.repeats, lfeats, by))
        cells = (r[0] * 1e3, r[1] * 1e3, r[0] / r[1], r[2] * 1e3, r[3] * 1e3, r[2] / r[3])
        print(f"  {length:6d}" + "".join(f" {v:{width}.2f}" for v, (_, width) in zip(cells, header[1:] + (("", 6),))))
    model.set_weights(start)

    print("\n[4] achieved FLOP/s of the full LSTM train step vs this machine's GEMM")
    peak = gemm_flops()
    print(f"  GEMM (float32 matmul, TensorFlow): {peak / 1e9:.1f} GFLOP/s")
    print(f"  FLOPs of a train step = 3 x forward (backward counted as 2 x forward); {step_flops(config, 1, 1)[1]}")
    for size in (16, 128):
        bx, by = batch(size, args.length)
        t = _median_seconds(Trainer(model, task, 1e-3).step, args.repeats, bx, by)
        f, _, formula = step_flops(config, size, args.length)
        print(f"  batch {size:3d}: {formula}")
        print(f"  batch {size:3d}: {t * 1e3:8.2f} ms/step -> {f / t / 1e9:6.2f} GFLOP/s = {f / t / peak:6.1%} of GEMM")
        model.set_weights(start)
    # where the time goes: the softmax (one big GEMM per step) vs the LSTM layers (a loop of small ones)
    lstm, soft = (f * 16 * args.length for f in inference_reuse.forward_flops(config, 1))
    below, dt = 2 * lstm + soft, steps["full"] - steps["fine_tune"]
    if dt > 0:  # full minus fine-tune: the LSTM backward (2 x LSTM forward) and the softmax's input gradient
        rate = below / dt
        print(
            f"  softmax: {soft / (soft + lstm):.0%} of the forward FLOPs at batch 16; the work full training adds over "
            f"fine-tune runs at ~{rate / 1e9:.1f} GFLOP/s = {rate / peak:.0%} of GEMM"
        )
    for size in (16, 128):
        parts = step_parts(model, task, batch(size, args.length), args.repeats)
        full = parts["full step (+ SGD update, clip 5)"]
        print(f"  where a step's time goes, batch {size} x length {args.length} (ms, share of the full step):")
        for name, ms in parts.items():
            print(f"    {name:42s} {ms:8.2f}  {ms / full:5.0%}")
    # an attempt to raise the fraction: compile the same step with XLA (fuses the LSTM loop's small ops)
    try:
        variables, opt = trainable_variables(model, []), make_optimizer("adam", 1e-3)
        opt.build(variables)
        xla = tf.function(lambda a, b: train_step(model, task, opt, variables, [], a, b), jit_compile=True)
        tx = _median_seconds(lambda a, b: float(xla(a, b)), min(args.repeats, 3), *batch(16, args.length), warmup=1)
        rate = step_flops(config, 16, args.length)[0] / tx
        print(f"  batch  16, XLA (jit_compile): {tx * 1e3:8.2f} ms/step -> {rate / peak:6.1%} of GEMM")
    except Exception as exc:  # noqa: BLE001  (XLA is an attempt, not a requirement)
        print(f"  batch  16, XLA: not available ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})")
    model.set_weights(start)
    print(
        "  limits: the softmax GEMM runs near the machine's GEMM rate; each LSTM time step is a chain of small\n"
        "  products (batch x 4H) that cannot start before the previous step ends, so per-op overhead and memory\n"
        "  traffic set its pace; cross-entropy over the vocabulary and Adam's update of the V x H kernel are\n"
        "  memory-bound. Larger batches amortise the per-op overhead but grow the memory-bound logits."
    )
    print("\n[5] evaluation throughput (task.evaluate: top-k-eff and perplexity, batches of 256)")
    r = eval_throughput(model, task, config)
    print(f"  compiled: {r['positions_per_s']:,.0f} positions/s = {r['words_per_s']:,.0f} typed words/s")
    speedup = r["positions_per_s"] / r["eager_positions_per_s"]
    print(f"  eager, per-sample R(x) (before): {r['eager_positions_per_s']:,.0f} positions/s -> x{speedup:.2f}")
    print(f"  the same R(x) for every word: {r['same_chars_needed']}")
    keras.backend.clear_session()
    return 0


if __name__ == "__main__":
    sys.exit(main())
