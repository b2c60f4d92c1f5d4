"""`make bench`: one round of AutLearn's FedAvg with its LSTM clients trained one at a time (the
per-client `Trainer`, the preset's `fedavg_together=False`) against the same round with the clients
together (one `ManyUsers`), at the scale's model, client batch and clients per round (not a test).

    python -m ondevice.papers.autlearn.bench_fedavg [--scale default] [--samples 2000] [--repeats 3]

The clients hold random samples shaped like the typing samples (3 previous words, then 3-10 typed
characters; `bench_measures.eval_samples`) in unequal numbers, from half to one and a half times
`--samples` (the default's 12 users hold 1,442 to 9,354 training samples, median 2,027), so some
clients sit masked in the round's last steps as in the notebook. Each way runs the same round
(same draws, same batches), one after the other, round after round, so that load from other
processes falls on both alike; the printed times are medians after one untimed round each.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def clients(config, n: int, samples: int) -> dict:
    """`n` clients of random typing-shaped samples, from samples / 2 to 3 samples / 2 each."""
    from ondevice.papers.deeptype.bench_measures import eval_samples

    sizes = np.linspace(samples / 2, 3 * samples / 2, n).astype(int) if n > 1 else [samples]
    return {f"client{k}": eval_samples(config, int(size), seed=k) for k, size in enumerate(sizes)}


def round_seconds(params, model, data: dict, repeats: int) -> dict[str, float]:
    """Median seconds of one FedAvg round (one local epoch) each way, and the weights' largest gap."""
    from ondevice.papers.autlearn import fedavg_baseline
    from ondevice.papers.autlearn.techniques.fedavg import fedavg

    rate, batch, per_round = 0.3, params.text_cloud_batch_size, len(data)
    trainer = fedavg_baseline.client_trainer(params, "text", model, rate)
    ways = {
        "one at a time": None,
        "together": fedavg_baseline.clients_together(params, "text", model, rate, per_round),
    }
    start, times, last = model.get_weights(), {name: [] for name in ways}, {}
    for r in range(1 + repeats):
        for name, many in ways.items():
            begin = time.perf_counter()
            last[name] = fedavg(trainer, start, data, 1, per_round, 1, batch, seed=r, together=many)[0]
            if r > 0:
                times[name].append(time.perf_counter() - begin)
    gap = max(float(np.abs(a - b).max()) for a, b in zip(*last.values()))
    return {name: float(np.median(t)) for name, t in times.items()} | {"largest weight gap": gap}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="A FedAvg round's LSTM clients one at a time vs together.")
    ap.add_argument("--scale", default="default", choices=("smoke", "default", "paper"))
    ap.add_argument("--samples", type=int, default=2000, help="a middle client's samples")
    ap.add_argument("--clients", type=int, default=0, help="clients per round (0: the scale's fedavg_clients)")
    ap.add_argument("--repeats", type=int, default=3, help="timed rounds")
    args = ap.parse_args(argv)

    from ondevice.data.typing_samples import CHARS
    from ondevice.models import lstm_lm
    from ondevice.papers.autlearn.experiments.autlearn_accuracy import Params
    from ondevice.papers.deeptype.bench_users import machine

    p = Params.for_scale(args.scale)
    n = args.clients or p.fedavg_clients
    config = lstm_lm.LSTMConfig(p.vocab_size + len(CHARS), p.vocab_size, p.embedding_dim, p.hidden_units, p.lstm_layers)
    data = clients(config, n, args.samples)
    print(f"ondevice bench, FedAvg clients together: {machine()}, medians of {args.repeats} rounds")
    print(
        f"  {args.scale} AutLearn LSTM (vocabulary {p.vocab_size}, embedding {p.embedding_dim}, "
        f"{p.lstm_layers} x LSTM {p.hidden_units}), {n} clients x {args.samples // 2}-{3 * args.samples // 2} "
        f"samples, batch {p.text_cloud_batch_size}, SGD, equal-length buckets, one local epoch"
    )
    seconds = round_seconds(p, lstm_lm.build(config, seed=0), data, args.repeats)
    alone, together = seconds["one at a time"], seconds["together"]
    print(f"  a round, clients one at a time: {alone:8.2f} s ({alone / n:.2f} s per client)")
    print(f"  a round, clients together:      {together:8.2f} s ({together / n:.2f} s per client)")
    print(f"  FedAvg clients together: x{alone / together:.2f} over one at a time")
    print(f"  largest gap between the two rounds' averaged weights: {seconds['largest weight gap']:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
