"""`make bench`: rounds of AutLearn's FedAvg with its LSTM clients trained one at a time (the
per-client `Trainer`, the preset's `fedavg_together=False`) against the same rounds with the clients
together (one `ManyUsers`), at the scale's model, client batch and clients per round (not a test).

    python -m ondevice.papers.autlearn.bench_fedavg [--scale default] [--fraction 1.0] [--repeats 3] [--threads 1]
    python -m ondevice.papers.autlearn.bench_fedavg --mobilenet [--scale default] [--repeats 10]

The clients hold typing samples (`typing_samples.build_samples`) of random words of 3-10 letters,
as many as the default run's 12 users have training samples (`USER_SAMPLES`, times `--fraction`);
each round draws the scale's clients per round from them, so that a round's clients differ in size
as in the notebook (together, the smaller ones sit masked until the largest has finished its
epoch). Each way runs the same rounds (same draws, same batches), one after the other, so that
load from other processes falls on both alike; the printed times are sums over the timed rounds,
after one untimed round each.

With `--mobilenet`: rounds of MobileNet's FedAvg on the scale's FEMNIST writers (its clients a
round, one local epoch, CloudTrain's batch), timed per client step with everything a round does
(resets, weights in and out, batching), against the same client's bare step repeated on one batch
(issue 68's target: a round at 50% or more of its clients' own step rate).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from ondevice.threads import limit_threads

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


# the training samples of autlearn_accuracy's 12 LSTM users at default (tables/users.csv, 6602817)
USER_SAMPLES = (1442, 1475, 1548, 1731, 1958, 2013, 2040, 3612, 3645, 3952, 4368, 9354)


def clients(params, fraction: float):
    """Users of random words (3-10 letters, 12-word sentences, the scale's vocabulary size) with as
    many samples as the default's users have, times `fraction`; and their vocabulary."""
    from ondevice.data.typing_samples import Vocabulary, build_samples

    rng = np.random.default_rng(0)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words = np.array(["".join(rng.choice(letters, n)) for n in rng.integers(3, 11, params.vocab_size)])
    users = [[list(rng.choice(words, 12)) for _ in range(max(1, round(n * fraction / 12)))] for n in USER_SAMPLES]
    vocab = Vocabulary.from_sentences([s for u in users for s in u], params.vocab_size)
    return vocab, {f"user{k}": build_samples(u, vocab, params.context_words) for k, u in enumerate(users)}


def rounds(data: dict, per_round: int, repeats: int) -> list[dict]:
    """1 + `repeats` rounds' clients, each `per_round` drawn without replacement (fixed draws)."""
    rng, names = np.random.default_rng(0), sorted(data)
    return [{c: data[c] for c in rng.choice(names, per_round, replace=False)} for _ in range(1 + repeats)]


def round_seconds(params, model, drawn: list[dict]) -> dict[str, float]:
    """Seconds of the rounds after the first (one local epoch each) each way, and the largest gap
    between the two ways' averaged weights over the rounds."""
    from ondevice.papers.autlearn import fedavg_baseline
    from ondevice.papers.autlearn.techniques.fedavg import fedavg

    rate, batch, per_round = 0.3, params.text_cloud_batch_size, len(drawn[0])
    trainer = fedavg_baseline.client_trainer(params, "text", model, rate)
    ways = {"one at a time": None, "together": fedavg_baseline.clients_together(params, "text", model, rate, per_round)}
    start, seconds, gap = model.get_weights(), dict.fromkeys(ways, 0.0), 0.0
    for r, clients_ in enumerate(drawn):
        weights = []
        for name, many in ways.items():
            begin = time.perf_counter()
            weights.append(fedavg(trainer, start, clients_, 1, per_round, 1, batch, seed=r, together=many)[0])
            seconds[name] += (time.perf_counter() - begin) * (r > 0)
        gap = max([gap, *(float(np.abs(a - b).max()) for a, b in zip(*weights))])
    if not np.isfinite(gap):
        raise FloatingPointError("a way's weights are not finite: lower the bench's client rate")
    return seconds | {"largest weight gap": gap}


def mobilenet_rounds(scale: str, repeats: int) -> None:
    """Print MobileNet FedAvg's seconds per client step inside rounds against its bare step."""
    from ondevice.papers.autlearn import common, fedavg_baseline
    from ondevice.papers.autlearn.experiments.autlearn_accuracy import Params
    from ondevice.papers.autlearn.techniques.fedavg import fedavg
    from ondevice.report.timings import machine

    p = Params.for_scale(scale)
    images = common.load_images(p, log=lambda *a: None)
    pre = common.pretrained_image(p, images, log=lambda *a: None)
    per_round = min(fedavg_baseline.rounds_and_clients(p, "image")[1], len(images.train))
    trainer = fedavg_baseline.client_trainer(p, "image", pre.model, 0.01 * per_round)
    batch = p.image_cloud_batch_size
    fedavg(trainer, pre.weights, images.train, 2, per_round, 1, batch, seed=0)  # untimed: traces, caches
    begin = time.perf_counter()
    _, rows = fedavg(trainer, pre.weights, images.train, repeats, per_round, 1, batch, seed=1)
    in_rounds = (time.perf_counter() - begin) / sum(-(-r["examples"] // batch) for r in rows)
    x, y = next(iter(images.train.values()))
    trainer.step(x[:batch], y[:batch])
    begin = time.perf_counter()
    for _ in range(5 * repeats):
        trainer.step(x[:batch], y[:batch])
    bare = (time.perf_counter() - begin) / (5 * repeats)
    print(f"ondevice bench, MobileNet FedAvg rounds: {machine()}, load average {os.getloadavg()[0]:.1f} at start")
    print(f"  {scale}: {per_round} clients a round, one local epoch, batch {batch}, {repeats} timed rounds")
    print(f"  per client step in rounds: {in_rounds * 1e3:7.1f} ms; bare step: {bare * 1e3:7.1f} ms")
    print(f"  rounds run at {bare / in_rounds:.0%} of the clients' own step rate (target: 50% or more)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="FedAvg rounds' LSTM clients one at a time vs together.")
    ap.add_argument("--scale", default="default", choices=("smoke", "default", "paper"))
    ap.add_argument("--fraction", type=float, default=1.0, help="of the default users' training samples")
    ap.add_argument("--repeats", type=int, default=3, help="timed rounds")
    ap.add_argument(
        "--threads",
        type=int,
        default=0,
        help="TensorFlow's threads (0: its default, the CPUs; 1: as "
        "autlearn_accuracy has beside another notebook in make reproduce)",
    )
    ap.add_argument("--mobilenet", action="store_true", help="MobileNet's rounds against its bare step instead")
    args = ap.parse_args(argv)
    if args.threads:
        limit_threads(args.threads)
    if args.mobilenet:
        mobilenet_rounds(args.scale, max(args.repeats, 10))
        return 0

    from ondevice.models import lstm_lm
    from ondevice.papers.autlearn.experiments.autlearn_accuracy import Params
    from ondevice.report.timings import machine
    from ondevice.training.bucketing import equal_length_batches

    p = Params.for_scale(args.scale, fedavg_together=True)  # the preset's is off: the clients together way
    vocab, data = clients(p, args.fraction)
    config = lstm_lm.LSTMConfig(vocab.input_size, vocab.size, p.embedding_dim, p.hidden_units, p.lstm_layers)
    drawn = rounds(data, p.fedavg_clients, args.repeats)
    threads = f"{args.threads} thread(s)" if args.threads else "TensorFlow's default threads"
    load = f"load average {os.getloadavg()[0]:.1f} at start"
    print(f"ondevice bench, FedAvg clients together: {machine()}, {load}, {threads}, {args.repeats} timed rounds")
    print(
        f"  {args.scale} AutLearn LSTM (vocabulary {p.vocab_size}, embedding {p.embedding_dim}, {p.lstm_layers} x "
        f"LSTM {p.hidden_units}), {p.fedavg_clients} of 12 clients a round ({args.fraction:g} x the default users' "
        f"samples), batch {p.text_cloud_batch_size}, SGD, equal-length buckets, one local epoch"
    )
    seconds = round_seconds(p, lstm_lm.build(config, seed=0), drawn)
    alone, together = seconds["one at a time"], seconds["together"]
    print(f"  {args.repeats} rounds, clients one at a time: {alone:8.2f} s")
    print(f"  {args.repeats} rounds, clients together:      {together:8.2f} s")
    print(f"  FedAvg clients together: x{alone / together:.2f} over one at a time")
    steps = [
        [len(equal_length_batches(c.lengths, p.text_cloud_batch_size, None)) for c in d.values()] for d in drawn[1:]
    ]
    print(
        f"  steps of the timed rounds: {sum(map(sum, steps))} client steps one at a time; together "
        f"{sum(map(max, steps))} steps of {p.fedavg_clients} clients, {sum(p.fedavg_clients * max(s) for s in steps)} "
        "client slots (a client whose epoch is done sits masked)"
    )
    print(f"  largest gap between the two ways' averaged weights: {seconds['largest weight gap']:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
