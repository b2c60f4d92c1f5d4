"""`make bench`: K users' personal training steps as one batched step (`training.many_users`) against
K separate steps, at DeepType's personal batch (16) and the scale's model (not a test).

    python -m ondevice.papers.deeptype.bench_users [--scale default] [--users 20] [--length 12] [--repeats 10]

Throughput is users x samples per second. Three ways to run one step of each of K users, each user
with its own batch: (a) `ManyUsers` with K users, one call; (b) `ManyUsers` with one user, K calls
(the same computation, separately); (c) the per-user `Step` (what `Trainer` and the exports run), K
calls. The three are timed in alternation, round after round, so that load from other processes on
the machine falls on all of them alike; the printed numbers are medians over the rounds. The
personal regime is DeepType's: SGD at 1.0, gradients clipped at norm 5, loss summed per sample.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import numpy as np

from ondevice.papers.deeptype.bench_measures import gemm_flops, step_flops

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def cpu_model() -> str:
    """The CPU's model name as the kernel reports it (else the platform's processor string)."""
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        return names[0] if names else platform.processor() or "unknown"
    except OSError:
        return platform.processor() or "unknown"


def machine() -> str:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"{cpu_model()}, {os.cpu_count()} CPUs, load average {load:.1f} at start"


def round_seconds(ways: dict, rounds: int, warmup: int = 2) -> dict[str, float]:
    """Median seconds of each way (a function running one step of every user) over `rounds` rounds,
    each round running every way once, after `warmup` untimed rounds."""
    times = {name: [] for name in ways}
    for r in range(warmup + rounds):
        for name, fn in ways.items():
            start = time.perf_counter()
            fn()
            if r >= warmup:
                times[name].append(time.perf_counter() - start)
    return {name: float(np.median(t)) for name, t in times.items()}


def ways_to_step(model, users: int, batches: list) -> dict:
    """The three ways (a, b, c) to run one personal step of each user on its batch."""
    from ondevice.tasks.next_word import NextWordTask
    from ondevice.training.many_users import ManyUsers
    from ondevice.training.step import Step

    task = NextWordTask(loss_per="sample")
    regime = dict(learning_rate=1.0, optimizer="sgd", clip_norm=5.0)
    together, alone = ManyUsers(model, task, users, **regime), ManyUsers(model, task, 1, **regime)
    step = Step(model, task, **regime)
    tokens, labels = (np.stack([b[i] for b in batches]) for i in (0, 1))
    ones = np.ones(users, np.float32)
    rows = ones * tokens.shape[1]
    one = np.ones(1, np.float32)

    def each_alone():
        for x, y in batches:
            alone.train(x[None], y[None], one * x.shape[0], one, one).numpy()

    def each_step():
        for x, y in batches:
            float(step.train(x, y)["loss"])

    return {
        f"(a) {users} users in one batched step": lambda: together.train(tokens, labels, rows, ones, ones).numpy(),
        f"(b) {users} batched steps of one user": each_alone,
        f"(c) {users} per-user Step calls": each_step,
    }, step_parts(together, tokens, labels, rows)


def step_parts(many, tokens, labels, rows) -> dict:
    """Pieces of the batched step (a), each a compiled function on its shapes: where its time goes."""
    import tensorflow as tf

    from ondevice.training.many_users import lstm_layer

    w = [tf.convert_to_tensor(v) for v in many.stacked]
    embedded = many.embed(tokens)
    below = many.hidden(embedded)

    def gradients(fn, *inputs):
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            total = tf.reduce_sum(fn(*inputs))
        return tape.gradient(total, inputs)

    def lstm(x, *weights):
        for at in range(0, len(weights), 3):
            x = lstm_layer(x, *weights[at : at + 3])
        return x

    parts = {
        "forward + loss": lambda: many.losses(embedded, labels, rows),
        "LSTM layers, forward + backward": lambda: gradients(lstm, embedded, *w[1:-2]),
        "softmax + cross-entropy, forward + backward": lambda: gradients(
            lambda h, _: many.output_sums(h, labels), below, many.stacked[-2]
        ),
    }
    return {name: (lambda f=tf.function(fn): tf.nest.map_structure(np.asarray, f())) for name, fn in parts.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Throughput of K users' personal steps batched vs separate.")
    ap.add_argument("--scale", default="default", choices=("smoke", "default", "paper"))
    ap.add_argument("--users", type=int, default=20)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--length", type=int, default=12, help="sequence length of the timed batches (samples: ~12)")
    ap.add_argument("--repeats", type=int, default=10, help="timed rounds")
    ap.add_argument("--threads", type=int, default=0, help="TensorFlow's intra-op threads (0: its default, the CPUs)")
    args = ap.parse_args(argv)
    if args.threads:
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(args.threads)

    from ondevice.data.typing_samples import CHARS
    from ondevice.models import lstm_lm
    from ondevice.tasks.typing_protocol import MODEL_PRESETS, DeepTypeParams

    preset = MODEL_PRESETS[args.scale]
    fields = ("vocab_size", "embedding_dim", "hidden_units", "lstm_layers")
    words, embedding, hidden, layers = (preset.get(f, getattr(DeepTypeParams, f)) for f in fields)
    config = lstm_lm.LSTMConfig(words + len(CHARS), words, embedding, hidden, layers)
    model, rng = lstm_lm.build(config, seed=0), np.random.default_rng(0)
    shape = (args.batch, args.length)
    batches = [
        (rng.integers(2, config.input_vocab, shape, dtype=np.int32), rng.integers(2, words, shape, dtype=np.int32))
        for _ in range(args.users)
    ]
    threads = f"{args.threads} intra-op threads" if args.threads else "TensorFlow's default threads"
    print(f"ondevice bench, many users: {machine()}, {threads}, medians of {args.repeats} rounds")
    print(
        f"  {args.scale} model (vocabulary {words}, embedding {embedding}, {layers} x LSTM {hidden}), "
        f"{args.users} users x batch {args.batch} x length {args.length}, SGD 1.0 clip 5"
    )
    ways, parts = ways_to_step(model, args.users, batches)
    seconds = round_seconds({**ways, **parts}, args.repeats)
    report(
        {n: seconds[n] for n in ways},
        args.users * args.batch,
        step_flops(config, args.batch, args.length)[0] * args.users,
    )
    full = next(iter(seconds.values()))
    print("  where (a)'s time goes (ms, share of (a); timed alone, so shares need not add up):")
    for name in parts:
        print(f"    {name:44s} {seconds[name] * 1e3:8.1f}  {seconds[name] / full:5.0%}")
    return 0


def report(seconds: dict[str, float], samples: int, flops: float) -> None:
    """Each way's throughput, the batched step's ratio over it, and the ceiling: the FLOPs of the K
    steps at this run's GEMM rate; a way already near it cannot be beaten by much (the softmax, 3/4
    of a step's FLOPs, is one product of 16 x length rows that runs near that rate for one user)."""
    peak = gemm_flops()
    together = samples / next(iter(seconds.values()))
    for name, s in seconds.items():
        rate = samples / s
        print(
            f"  {name:40s} {s * 1e3:9.1f} ms {rate:7.0f} user-samples/s {flops / s / 1e9:6.1f} GFLOP/s "
            f"= {flops / s / peak:4.0%} of GEMM; together x{together / rate:.2f}"
        )
    ceiling = peak / flops * samples
    print(
        f"  ceiling: the steps' FLOPs at this run's GEMM rate ({peak / 1e9:.1f} GFLOP/s) = {ceiling:.0f} user-samples/s"
    )
    ratios = [together * s / samples for s in seconds.values()][1:]
    print(f"  batched users (target x3): x{ratios[0]:.2f} over separate steps, x{ratios[1]:.2f} over per-user Steps")


if __name__ == "__main__":
    sys.exit(main())
