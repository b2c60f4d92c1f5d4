"""FedAvg (McMahan et al., 2017), AutLearn's federated baseline, as an in-process loop.

Each round a random subset of clients starts from the global weights, trains `local_epochs` on
its own data (a fresh optimizer state each time), and the server replaces the global weights by
the average of the clients' weights, weighted by their numbers of training examples. Only weights
travel; a client's data never leaves `clients`. One Trainer (and one compiled step) serves every
client; the hooks of the trainer (e.g. equal-length buckets) apply on each client.
"""

from __future__ import annotations

import time

import numpy as np

from ondevice import streams
from ondevice.training.trainer import Trainer


def average(weights: list[list[np.ndarray]], sizes: list[int]) -> list[np.ndarray]:
    """The size-weighted mean of several clients' weight lists."""
    share = np.asarray(sizes, np.float64) / float(sum(sizes))
    return [
        sum(s * w[i].astype(np.float64) for s, w in zip(share, weights)).astype(weights[0][i].dtype)
        for i in range(len(weights[0]))
    ]


def fedavg(
    trainer: Trainer,
    start: list[np.ndarray],
    clients: dict,
    rounds: int,
    clients_per_round: int,
    local_epochs: int,
    batch_size: int,
    seed: int,
    log=None,
) -> tuple[list[np.ndarray], list[dict]]:
    """Global weights after `rounds` of FedAvg from `start`, and one history row per round.

    `clients`: client id -> its training data (what `trainer`'s task batches). Clients of a round
    are drawn without replacement from the stream "fedavg/round/<r>"; client c's batches in round r
    from "fedavg/<r>/<c>"."""
    if not 1 <= clients_per_round <= len(clients):
        raise ValueError(f"clients_per_round must be in 1..{len(clients)}, got {clients_per_round}")
    ids = sorted(clients)
    weights, history = [w.copy() for w in start], []
    for r in range(1, rounds + 1):
        begin = time.perf_counter()
        picked = [
            ids[i]
            for i in sorted(streams.rng(seed, f"fedavg/round/{r}").choice(len(ids), clients_per_round, replace=False))
        ]
        updates, sizes, losses = [], [], []
        for c in picked:
            trainer.reset(weights)
            rows = trainer.fit(clients[c], local_epochs, batch_size, streams.rng(seed, f"fedavg/{r}/{c}"))
            updates.append(trainer.model.get_weights())
            sizes.append(trainer.task.size(clients[c]))
            losses.append(rows[-1]["loss"])
        weights = average(updates, sizes)
        history.append(
            {
                "round": r,
                "clients": len(picked),
                "examples": int(sum(sizes)),
                "client_loss": float(np.average(losses, weights=sizes)),
                "seconds": time.perf_counter() - begin,
            }
        )
        if log:
            log(f"FedAvg round {r}/{rounds}: {len(picked)} clients, mean local loss {history[-1]['client_loss']:.3f}")
    trainer.model.set_weights(weights)
    return weights, history
