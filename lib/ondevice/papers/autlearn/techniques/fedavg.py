"""FedAvg (McMahan et al., 2017), AutLearn's federated baseline, as an in-process loop.

Each round a random subset of clients starts from the global weights, trains `local_epochs` on
its own data (a fresh optimizer state each time), and the server replaces the global weights by
the average of the clients' weights, weighted by their numbers of training examples. Only weights
travel; a client's data never leaves `clients`. One Trainer (and one compiled step) serves every
client; the hooks of the trainer (e.g. equal-length buckets) apply on each client. With `together`
(a `training.many_users.ManyUsers` of the same model, loss and SGD rate, one slot per client of a
round) a round's clients train at once, each on its own batches from its own random stream, so a
client's weights are those it gets alone, to float32 rounding (`tests/test_autlearn_accuracy.py`).

Like `Trainer.fit`, the loop can score the global model on held-out data and stop at a plateau
(a `Plateau` of `ondevice.training.trainer`), so that FedAvg is compared at convergence. A
`client_rate(round)` sets the clients' learning rate round by round (a warm-up: Goyal et al., 2017).
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from ondevice import streams
from ondevice.training.many_users import ManyUsers
from ondevice.training.trainer import Plateau, Trainer


def average(weights: list[list[np.ndarray]], sizes: list[int]) -> list[np.ndarray]:
    """The size-weighted mean of several clients' weight lists."""
    share = np.asarray(sizes, np.float64) / float(sum(sizes))
    return [
        sum(s * w[i].astype(np.float64) for s, w in zip(share, weights)).astype(weights[0][i].dtype)
        for i in range(len(weights[0]))
    ]


def clients_alone(trainer: Trainer, weights, clients: dict, picked: list, epochs: int, batch_size: int, rngs: list):
    """One round's clients trained one after another from `weights`: each client's weights and last epoch's loss."""
    updates, losses = [], []
    for c, rng in zip(picked, rngs):
        trainer.reset(weights)
        losses.append(trainer.fit(clients[c], epochs, batch_size, rng)[-1]["loss"])
        updates.append(trainer.model.get_weights())
    return updates, losses


def clients_together(many: ManyUsers, weights, clients: dict, picked: list, epochs: int, batch_size: int, rngs: list):
    """One round's clients trained at once from `weights`: each client's weights and last epoch's loss."""
    many.reset(weights)
    histories = many.fit([clients[c] for c in picked], epochs, batch_size, rngs)
    return [many.user_weights(k) for k in range(len(picked))], [h[-1]["loss"] for h in histories]


class Rounds(list):
    """`fedavg`'s rows, one per round; with a stop rule also the kept round and whether the plateau
    was reached (False: the round cap came first)."""

    best_round: int | None = None
    plateau: bool = False


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
    evaluate=None,
    stop: Plateau | None = None,
    evaluate_every: int = 1,
    together: ManyUsers | None = None,
    client_rate: Callable[[int], float] | None = None,
) -> tuple[list[np.ndarray], Rounds]:
    """Global weights after at most `rounds` of FedAvg from `start`, and one history row per round.

    `clients`: client id -> its training data (what `trainer`'s task batches). Clients of a round
    are drawn without replacement from the stream "fedavg/round/<r>"; client c's batches in round r
    from "fedavg/<r>/<c>".

    `evaluate(model)` (a dict of floats) scores the global weights after every `evaluate_every`-th
    round and after the last; its values join that round's row. With `stop`, rounds end when the
    monitored value reaches a plateau (patience counted in evaluations, not rounds) and the weights
    the rule keeps are returned and left in the model (`Rounds.best_round`). `client_rate(r)`: the
    clients' learning rate in round r (recorded in its row); None: the trainer's, every round."""
    if not 1 <= clients_per_round <= len(clients):
        raise ValueError(f"clients_per_round must be in 1..{len(clients)}, got {clients_per_round}")
    if stop is not None and evaluate is None:
        raise ValueError("stop needs evaluate: a plateau is judged on held-out data")
    if evaluate_every < 1:
        raise ValueError(f"evaluate_every must be at least 1, got {evaluate_every}")
    ids = sorted(clients)
    weights, history = [w.copy() for w in start], Rounds()
    watch = stop.watch() if stop is not None else None
    for r in range(1, rounds + 1):
        begin = time.perf_counter()
        rate = {}
        if client_rate is not None:
            trainer.learning_rate = rate["client_rate"] = float(client_rate(r))
            if together is not None:
                together.learning_rate = trainer.learning_rate
        picked = [
            ids[i]
            for i in sorted(streams.rng(seed, f"fedavg/round/{r}").choice(len(ids), clients_per_round, replace=False))
        ]
        rngs = [streams.rng(seed, f"fedavg/{r}/{c}") for c in picked]
        fit = (weights, clients, picked, local_epochs, batch_size, rngs)
        updates, losses = clients_together(together, *fit) if together else clients_alone(trainer, *fit)
        sizes = [trainer.task.size(clients[c]) for c in picked]
        weights = average(updates, sizes)
        row = {"round": r, "clients": len(picked), "examples": int(sum(sizes)), **rate}
        row |= {"client_loss": float(np.average(losses, weights=sizes)), "seconds": time.perf_counter() - begin}
        scored = evaluate is not None and (r % evaluate_every == 0 or r == rounds)
        if scored:
            trainer.model.set_weights(weights)
        scores = evaluate(trainer.model) if scored else {}
        history.append(row | scores)
        if log:
            held = "".join(f", {k} {v:.4f}" for k, v in scores.items())
            log(f"FedAvg round {r}/{rounds}: {len(picked)} clients, mean local loss {row['client_loss']:.3f}{held}")
        if scored and watch is not None and watch.update(scores[stop.monitor], r, trainer.model):
            break
    if watch is not None:
        weights = watch.weights
        history.best_round, history.plateau = watch.epoch, watch.plateau
    trainer.model.set_weights(weights)
    return weights, history
