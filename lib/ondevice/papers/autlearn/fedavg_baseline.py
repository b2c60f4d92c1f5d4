"""FedAvg, AutLearn's federated baseline, as the paper's reference [3] (McMahan et al., 2017) runs
it: each client trains every layer by plain SGD (no optimizer state carried between clients or
rounds) at CloudTrain's batch size, and the server averages the clients' weights weighted by their
numbers of examples (`techniques.fedavg`); from the public model, to the plateau of the loss on the
validation users (`cloud_baselines.converge_fedavg`, scored every epoch of examples as CloudTrain).

A rate `r` of the grids is the centralized SGD rate the run stands for: each client steps at `r`
times the clients a round (K). Averaging K clients' local steps from the same weights is one step
of a K-times larger batch, so at the centralized rate FedAvg moves per example a K-th as far as
centralized SGD, and with less of SGD's noise (linear scaling, Goyal et al., 2017).

The paper leaves the local epochs and the rate open. The rule, fixed before any test run
(`screening`): on the first seed, every pair of the preset's grids (`fedavg_epoch_candidates` x
`<kind>_fedavg_rate_candidates`, fewer epochs and smaller rates first) trains FedAvg from the public
model, at most `<kind>_fedavg_screen_rounds` rounds (0: to its plateau); the pair whose kept round
has the lowest loss on the validation users (`cloud_baselines.holdout_loss`; no test part is seen)
wins, ties and diverged runs to the earlier pair, and trains on to its plateau with its rate cuts.
That run is the first seed's FedAvg; later seeds train with the chosen pair. The default screens 2
(LSTM) and 9 (MobileNet) epochs of examples at one local epoch (3 times as many at three).

The clients' rate warms up (`warmup_rounds`, `warmed`): it starts at the grid rate, the step
CloudTrain takes, and rises linearly to K times it over `fedavg_warmup_epochs` epochs of examples
(Goyal et al.'s gradual warm-up for linear scaling), so that the grid can hold CloudTrain's own rate:
without it the LSTM's clients at CloudTrain's 1.0 (4.0 each, K = 4) reached a local loss of 6.2 in
round 1 (default, seed 0, 2026-12-06), while CloudTrain at 1.0 trains.

The known-answer control (`control_table`) runs in the condition of the rows it vouches for and
against their baseline: FedAvg with the users' chosen setting (local epochs, rate, warm-up, cuts) on
*shuffled* clients (IID: as many and as large as the users, `fedavg_ablation`), whose kept held-out
loss must come within `fedavg_control_tolerance` (relative, fixed before any run) of the chosen
CloudTrain's, the very run the rows compare FedAvg with: on IID clients FedAvg minimises the pooled
loss CloudTrain minimises, so at convergence it must reach it; if it does not, our FedAvg (or its
setting) cannot reach the baseline, whatever the users' non-IID data do. The earlier control chose
IID FedAvg's own setting on the shuffled clients and judged it against centralized SGD at that rate
(the LSTM 2.993 against SGD 0.3's 2.956, passing, while the rows' CloudTrain, SGD 1.0, kept 2.910;
MobileNet 0.519 against SGD 0.03's 0.540, while at the users' grid 0.01, one local epoch, no warm-up,
IID FedAvg kept 0.589 against CloudTrain's SGD 0.01 at 0.536, +9.9%: default, seed 0, 2026-12-06).
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import NamedTuple

import numpy as np
import pandas as pd

from ondevice import streams
from ondevice.engine.stage import resumable
from ondevice.papers.autlearn import cached_runs, cloud_baselines, common, protocol, report, screening
from ondevice.papers.autlearn.common import MODEL_NAMES
from ondevice.papers.autlearn.fedavg_ablation import SHUFFLED
from ondevice.training.bucketing import EqualLength
from ondevice.training.many_users import ManyUsers
from ondevice.training.rate_cuts import RateCuts, with_cuts
from ondevice.training.trainer import Trainer


def check(params) -> None:
    """The FedAvg fields of autlearn_accuracy's parameters."""
    epochs = params.fedavg_epoch_candidates
    params.require(bool(epochs) and min(epochs) >= 1, "fedavg_epoch_candidates", "must hold epochs >= 1")
    for name in ("text_fedavg_rate_candidates", "image_fedavg_rate_candidates"):
        params.require(bool(getattr(params, name)) and min(getattr(params, name)) > 0, name, "must hold positive rates")
    params.require(params.fedavg_control_tolerance > 0, "fedavg_control_tolerance", "must be positive")
    params.require(params.fedavg_warmup_epochs >= 0, "fedavg_warmup_epochs", "must be >= 0 (0: no warm-up)")
    for kind in ("text", "image"):
        name, cap = f"{kind}_fedavg_screen_rounds", rounds_and_clients(params, kind)[0]
        params.require(0 <= screen_rounds(params, kind) < cap, name, f"must be 0 (no screen) or below the cap {cap}")


def screen_rounds(params, kind: str) -> int:
    """Rounds every candidate pair trains before the best goes on to its plateau (0: no screen)."""
    return params.image_fedavg_screen_rounds if kind == "image" else params.text_fedavg_screen_rounds


def rounds_and_clients(params, kind: str) -> tuple[int, int]:
    """(rounds at most, clients per round) of FedAvg for a model kind (`image_fedavg_*`: 0 = the shared field)."""
    if kind == "image":
        return params.image_fedavg_rounds or params.fedavg_rounds, params.image_fedavg_clients or params.fedavg_clients
    return params.fedavg_rounds, params.fedavg_clients


class Choice(NamedTuple):
    """The chosen local epochs and client rate of one kind, the chosen run's weights and curve
    (the first seed's FedAvg), and the table of every candidate."""

    local_epochs: int
    learning_rate: float
    weights: list[np.ndarray]
    curve: list[dict]
    table: pd.DataFrame


def client_trainer(params, kind: str, model, learning_rate: float) -> Trainer:
    """A client's step: every layer (`cloud_baselines.every_layer`), plain SGD, batched as CloudTrain
    (`cloud_baselines.batching`: the LSTM in equal-length buckets, MobileNet in even batches)."""
    model, the_task = cloud_baselines.every_layer(model, kind), protocol.task(params, kind)
    return Trainer(model, the_task, learning_rate, "sgd", hooks=cloud_baselines.batching(kind))


def clients_together(params, kind: str, model, learning_rate: float, clients: int) -> ManyUsers | None:
    """A round's `clients` clients trained at once with `fedavg_together` (each as `client_trainer`
    trains it alone, to float32 rounding); the LSTM only: `ManyUsers` batches embedding, LSTM and
    dense layers, not the MobileNet's convolutions and batch normalisation.

    Off in the presets: slower at the client batch of 64 (`bench_fedavg` at default, rounds of 4 of
    the default users' sizes: x0.88 on one thread, as the notebook runs in `make reproduce`, x0.68 on
    two). The softmax product, which `ManyUsers` runs client by client, is 88% of a client step's
    FLOPs at default (96 x 10,000 per position against the LSTMs' 4 x 96 x 160 and 4 x 96 x 192), so
    batching shares little, while together pads each step to the longest client batch and keeps
    stepping the clients that finished their epoch, masked (552 client slots for 430 steps)."""
    if not params.fedavg_together or kind != "text":
        return None
    return ManyUsers(model, protocol.task(params, kind), clients, learning_rate, "sgd", source=EqualLength())


def train(params, kind, model, start, clients: dict, holdout, seed: int, local_epochs: int, rate: float, log, cap=0):
    """FedAvg from `start` over `clients` to its plateau (the preset's rounds, or at most `cap`, and
    clients per round), each client stepping at `rate` x clients per round (the module's docstring);
    its curve, each point with the setting. The client draws follow `seed` and the kind only, so
    every client set and candidate is drawn alike. A run is stored in the model cache
    (`cached_runs`; `holdout`: the `Holdout` the plateau watches)."""
    (rounds, per_round), batch = rounds_and_clients(params, kind), params.cloud(kind)[2]
    rounds, cuts = (min(rounds, cap), RateCuts(0)) if cap else (rounds, cloud_baselines.rate_cuts(params, kind))
    per_round = min(per_round, len(clients))
    trainer = client_trainer(params, kind, model, rate * per_round)
    stop, every = params.plateau(kind), params.fedavg_evaluate_every
    rule = dict(evaluate=holdout, stop=stop, evaluate_every=every, log=log)
    rule["together"] = clients_together(params, kind, model, rate * per_round, per_round)
    setting = dict(kind=kind, seed=seed, local_epochs=local_epochs, rate=rate, rounds=rounds, per_round=per_round)
    setting |= dict(batch=batch, stop=asdict(stop), every=every, together=rule["together"] is not None)
    setting |= cached_runs.model_fields(params, kind) | (dict(cuts=asdict(cuts)) if cuts.cuts else {})
    data = [cached_runs.digest(start), cached_runs.digest(clients), holdout.digest]

    warm = warmup_rounds(params, len(clients), local_epochs, per_round)
    if warm:
        setting |= dict(warmup_rounds=warm)

    def phase(k: int, phase_rate: float) -> list[dict]:  # each cut draws its own clients
        trainer.learning_rate = phase_rate * per_round
        draws = streams.tf_seed(seed, f"fedavg/{kind}" + (f"/cut{k}" if k else ""))
        fed = (rounds, per_round, local_epochs, batch, draws)
        ramp = dict(client_rate=warmed(phase_rate, per_round, warm)) if warm and k == 0 else {}
        weights = start if k == 0 else model.get_weights()
        return cloud_baselines.converge_fedavg(trainer, weights, clients, *fed, **rule, **ramp)

    run = lambda: with_cuts(cuts, rate, phase, model)  # noqa: E731
    builders = (train, client_trainer, clients_together, warmed)  # the clients' step and rates: not in cached_runs.CODE
    curve, _ = cached_runs.curve_run("autlearn_fedavg", setting, data, model, run, builders, log)
    scaled = lambda p: p.get("client_rate", p.get("learning_rate", rate) * per_round)  # noqa: E731
    return [p | dict(local_epochs=local_epochs, client_rate=scaled(p)) for p in curve]


def warmup_rounds(params, clients: int, local_epochs: int, per_round: int) -> int:
    """Rounds of the warm-up: `fedavg_warmup_epochs` epochs of examples (a round trains `local_epochs`
    x `per_round` of `clients` clients' data), at least one round when it is on (0: off)."""
    if not params.fedavg_warmup_epochs:
        return 0
    return max(1, math.ceil(params.fedavg_warmup_epochs * clients / (local_epochs * per_round)))


def warmed(rate: float, per_round: int, rounds: int):
    """round -> the clients' rate: from `rate`, the centralized step CloudTrain takes, linearly up to
    `per_round` x `rate` (the module's scaling) over `rounds` rounds, then there (Goyal et al.'s gradual
    warm-up: a client's first local steps at K times the rate diverged where CloudTrain's trained)."""
    return lambda r: rate * (1 + (per_round - 1) * min(1.0, r / rounds))


def choose(params, kind: str, pre: common.Pretrained, clients: dict, holdout, log=print) -> Choice:
    """The module's rule on one kind with the users as clients, from the first seed's public model;
    the model is left with the chosen run's weights. Resumable per kind (`engine.stage`)."""
    choice = _choose(params, kind, pre, clients, holdout, log)
    pre.model.set_weights(choice.weights)
    return choice


@resumable("fedavg_choice", part=lambda params, kind, *a, **k: f"{kind}-users")
def _choose(params, kind: str, pre: common.Pretrained, clients: dict, holdout, log=print) -> Choice:
    rates = getattr(params, f"{kind}_fedavg_rate_candidates")
    grid = [dict(local_epochs=e, learning_rate=r) for e in params.fedavg_epoch_candidates for r in rates]

    def run(candidate: dict, cap: int) -> list[dict]:
        e, r = candidate["local_epochs"], candidate["learning_rate"]
        rounds = f", {cap} rounds" if cap else ""
        log(f"{MODEL_NAMES[kind]}: FedAvg on the users as clients, {e} local epoch(s), SGD rate {r}{rounds}")
        return train(params, kind, pre.model, pre.weights, clients, holdout, params.seed, e, r, log, cap)

    cuts = bool(cloud_baselines.rate_cuts(params, kind).cuts)
    s = screening.choose(grid, run, pre.model, screen_rounds(params, kind), cuts, log)
    e, r = s.best["local_epochs"], s.best["learning_rate"]
    log(f"{MODEL_NAMES[kind]}: FedAvg on the users as clients with {e} local epoch(s) at SGD rate {r}")
    table = s.table.assign(method="FedAvg", model=MODEL_NAMES[kind], clients="users", optimizer="sgd")
    return Choice(e, r, s.weights, s.curve, table)


def choose_all(params, text, images, pre, log=print) -> tuple[dict[str, Choice], pd.DataFrame]:
    """`choose` on both kinds with the users as clients (the first seed's public models): kind ->
    choice, and one table. The shuffled clients of the control train with the users' choice."""
    choices = {}
    for kind, data in (("text", text), ("image", images)):
        holdout, first = cloud_baselines.holdout_loss(kind, data.validation), pre[kind][params.seed]
        choices[kind] = choose(params, kind, first, data.train, holdout, log)
    return choices, pd.concat([c.table for c in choices.values()], ignore_index=True)


def federate(params, kind, model, start, clients, holdout, seed, choice: Choice, reuse: bool, log) -> list[dict]:
    """FedAvg with a chosen setting, leaving its kept weights in `model`; with `reuse` the chosen
    run itself (the first seed's clients of that set) instead of training it again."""
    if reuse:
        model.set_weights(choice.weights)
        return choice.curve
    return train(params, kind, model, start, clients, holdout, seed, choice.local_epochs, choice.learning_rate, log)


def control_table(history: list[dict], tolerance: float, cloud: str, fedavg: str) -> pd.DataFrame:
    """Per model and seed with shuffled clients, from the convergence curves: IID FedAvg's kept
    held-out loss (the users' setting on shuffled clients) against the chosen CloudTrain's (`cloud`,
    the known answer), the relative gap and the verdict against `tolerance` (`report.stopping_table`);
    beside them the users' FedAvg (`fedavg`)."""
    rows, stopping = [], report.stopping_table(pd.DataFrame(history))
    for (model, seed), g in stopping.groupby(["model", "seed"], sort=False):
        if SHUFFLED not in set(g.method):
            continue
        c, s, f = (g[g.method == name].iloc[0] for name in (cloud, SHUFFLED, fedavg))
        gap = s.kept_holdout_loss / c.kept_holdout_loss - 1
        row = dict(model=model, seed=seed, cloudtrain_loss=c.kept_holdout_loss, cloudtrain_ended_by=c.ended_by)
        row |= dict(iid_fedavg_loss=s.kept_holdout_loss, iid_kept_round=s.kept, iid_ended_by=s.ended_by)
        row |= dict(iid_epochs_seen=s.kept_epochs_seen, relative_gap=gap, tolerance=tolerance)
        row |= dict(verdict=_verdict(gap, tolerance, s.ended_by), users_fedavg_loss=f.kept_holdout_loss)
        rows.append(row | dict(users_gap_to_cloudtrain=f.kept_holdout_loss / c.kept_holdout_loss - 1))
    return pd.DataFrame(rows)


def _verdict(gap: float, tolerance: float, ended_by: str) -> str:
    if np.isfinite(gap) and gap <= tolerance:  # one-sided: below CloudTrain is no failure of FedAvg
        return f"passes: within {tolerance:.0%} of CloudTrain's held-out loss (or below it)"
    if ended_by == "cap":
        return "fails: the round cap ended IID FedAvg before its plateau (not converged)"
    return f"fails: IID FedAvg's plateau is {gap:+.1%} above CloudTrain's"


def plot_control(training: pd.DataFrame, tolerance: float, cloud: str):
    """Per model, the first seed's held-out loss of IID FedAvg and of the chosen CloudTrain (`cloud`,
    the control's known answer) against the examples seen; the band is CloudTrain's kept loss up to
    the tolerance."""
    import matplotlib.pyplot as plt

    scored = training.dropna(subset=["holdout_loss"])
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    for ax, model in zip(axes, MODEL_NAMES.values()):
        d = scored[(scored.model == model) & (scored.seed == scored.seed.min())]
        for method in (cloud, SHUFFLED):
            m = d[d.method == method]
            ax.plot(m.epochs_seen, m.holdout_loss, marker="o", label=method)
        kept = d[(d.method == cloud) & d.kept].holdout_loss
        if len(kept):
            ax.axhspan(kept.iloc[0], kept.iloc[0] * (1 + tolerance), color="0.85", label=f"{cloud} + {tolerance:.0%}")
        xlabel = "examples seen (epochs of the pooled training data)"
        ax.set(title=f"{model}: IID FedAvg against {cloud}", xlabel=xlabel, ylabel="loss on validation users")
        ax.legend(frameon=False, fontsize=8)
    return report._finish(fig)
