"""The measurements `make bench` prints (`bench`), each a function a test can run on a tiny model:
timing, the machine's GEMM rate, the train step's FLOP formula, where a step's time goes, and
evaluation throughput against the eager path it replaced."""

from __future__ import annotations

import time

import numpy as np


def median_seconds(fn, repeats: int, *args, warmup: int = 3) -> float:
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
        seconds = median_seconds(lambda f, p, q: f(p, q).numpy(), repeats, tf.function(tf.matmul), a, b)
        best = max(best, 2 * size**3 / seconds)
    return best


def step_flops(config, batch: int, length: int) -> tuple[float, str, str]:
    """FLOPs of one full training step, and the formula they come from (forward, then step): forward FLOPs per position
    (each LSTM layer: 4 gates of (input + H) x H multiply-adds; the softmax: H x V; 2 FLOPs per
    multiply-add; elementwise work left out), times batch x length positions, times 3 (the backward
    pass counted as twice the forward: gradients of the inputs and of the weights)."""
    from ondevice.training.inference_reuse import forward_flops

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

    from ondevice.training.step import make_optimizer

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
        out[name] = median_seconds(run, repeats, tf.function(fn), *args) * 1e3
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
    compiled = median_seconds(task.evaluate, 3, model, samples, warmup=0)
    eager = median_seconds(eager_evaluate, 3, model, samples, task.k, warmup=0)
    positions = len(samples.inputs)
    return {
        "positions_per_s": positions / compiled,
        "words_per_s": n_words / compiled,
        "eager_positions_per_s": positions / eager,
        "same_chars_needed": same,
    }
