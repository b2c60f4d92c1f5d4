"""FedAvg, AutLearn's federated baseline, as the paper's reference [3] (McMahan et al., 2017) runs
it: each client trains every layer by plain SGD (no optimizer state carried between clients or
rounds) at CloudTrain's batch size, and the server averages the clients' weights weighted by their
numbers of examples (`techniques.fedavg`); from the public model, to the plateau of the loss on the
validation users (`cloud_baselines.converge_fedavg`, scored every epoch of examples as CloudTrain).

A rate `r` of the grids is the centralized SGD rate the run stands for: each client steps at `r`
times the clients a round (K). Averaging K clients' local steps from the same weights is one step
of a K-times larger batch, so at the centralized rate FedAvg moves per example a K-th as far as
centralized SGD, and with less of SGD's noise (linear scaling, Goyal et al., 2017). Measured on
MobileNet's IID control (default, seed 0, K = 3, 1 local epoch, rate cuts; CloudTrain 0.559,
centralized SGD at 0.03 0.540): clients at 0.03, the plateau fitted the pooled training data more
closely than centralized SGD's at the same held-out loss (training loss 0.170 against 0.272) and the
cuts did not lower it (0.607, 0.612, 0.595: +6.4%, fails), with a patience in epochs of examples or,
as tried, in the global model's steps; clients at 0.1, scored every epoch of examples: 0.596 after 7
epochs (centralized SGD 0.614), then 0.516 and 0.507 after the cuts (-9.4%); grid rate 0.03 (clients
at 0.09), this module's run: 0.591, 0.527, 0.519 (-7.2%, 23 min on one thread). Both pass, and both
end below CloudTrain (Adam 0.0005) and centralized SGD: the control's verdict says so.

The paper leaves the local epochs and the rate open. The rule, fixed before any test run:
on the first seed, every pair of the preset's grids (`fedavg_epoch_candidates` x
`<kind>_fedavg_rate_candidates`, fewer epochs and smaller rates first) trains FedAvg on the test
users' training parts to its plateau; the pair whose kept round has the lowest loss on the
validation users (`cloud_baselines.holdout_loss`, the data the plateau watches; no test part is
seen) is chosen; ties and diverged runs (a non-finite loss) lose to the earlier pair. That run is
the first seed's FedAvg; later seeds and the shuffled clients train with the chosen pair. With a
screen (`<kind>_fedavg_screen_rounds`, fixed before any run), every pair trains at most that many
rounds and only the pair with the lowest screened loss trains on to its plateau; its first rounds
are the screen's (the same client draws), so a screened run that reached its plateau before the
screen's cap is already the chosen run (not with rate cuts, `cloud_baselines.rate_cuts`: a screen
runs at its rate only, so the chosen pair trains again with its cuts). Losing pairs cost the
screen's rounds, not their plateau.
The default screens 2 (LSTM) and 9 (MobileNet, whose first plateau came after 7) epochs of
examples at one local epoch (3 times as many at three): cold, the grid's 8 LSTM and 6 MobileNet
pairs each to its plateau did not fit a session (one LSTM pair took 1,952 s under contention).

The known-answer control (`control_table`): on shuffled (IID) clients FedAvg minimises the same
pooled loss as CloudTrain (the example-weighted mean of the clients' losses), so at convergence its
kept held-out loss must come within `fedavg_control_tolerance` (relative, fixed in the preset before
any run) of CloudTrain's; if it does not, FedAvg (or its setting) is wrong, whatever the non-IID gap.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import NamedTuple

import numpy as np
import pandas as pd

from ondevice import streams
from ondevice.engine.stage import resumable
from ondevice.papers.autlearn import cached_runs, cloud_baselines, common, protocol, report
from ondevice.papers.autlearn.common import MODEL_NAMES
from ondevice.papers.autlearn.fedavg_ablation import SHUFFLED
from ondevice.training import selection
from ondevice.training.bucketing import EqualLength
from ondevice.training.many_users import ManyUsers
from ondevice.training.rate_cuts import RateCuts, with_cuts
from ondevice.training.trainer import Trainer

SECTION = "FedAvg's known answer: IID clients reach CloudTrain's held-out loss"


def check(params) -> None:
    """The FedAvg fields of autlearn_accuracy's parameters."""
    epochs = params.fedavg_epoch_candidates
    params.require(bool(epochs) and min(epochs) >= 1, "fedavg_epoch_candidates", "must hold epochs >= 1")
    for name in ("text_fedavg_rate_candidates", "image_fedavg_rate_candidates"):
        params.require(bool(getattr(params, name)) and min(getattr(params, name)) > 0, name, "must hold positive rates")
    params.require(params.fedavg_control_tolerance > 0, "fedavg_control_tolerance", "must be positive")
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

    def phase(k: int, phase_rate: float) -> list[dict]:  # each cut draws its own clients
        trainer.learning_rate = phase_rate * per_round
        draws = streams.tf_seed(seed, f"fedavg/{kind}" + (f"/cut{k}" if k else ""))
        fed = (rounds, per_round, local_epochs, batch, draws)
        return cloud_baselines.converge_fedavg(trainer, start if k == 0 else model.get_weights(), clients, *fed, **rule)

    run = lambda: with_cuts(cuts, rate, phase, model)  # noqa: E731
    builders = (train, client_trainer, clients_together)  # the clients' step is in the key: not in cached_runs.CODE
    curve, _ = cached_runs.curve_run("autlearn_fedavg", setting, data, model, run, builders, log)
    return [p | dict(local_epochs=local_epochs, client_rate=p.get("learning_rate", rate) * per_round) for p in curve]


def choose(params, kind: str, data, pre: common.Pretrained, log=print) -> Choice:
    """The module's rule on one kind, from the first seed's public model (with its screen); the
    model is left with the chosen run's weights. Resumable per kind (`engine.stage`)."""
    choice = _choose(params, kind, data, pre, log)
    pre.model.set_weights(choice.weights)
    return choice


@resumable("fedavg_choice", part=lambda params, kind, *args, **kwargs: kind)
def _choose(params, kind: str, data, pre: common.Pretrained, log=print) -> Choice:
    holdout, screen = cloud_baselines.holdout_loss(kind, data.validation), screen_rounds(params, kind)
    runs, rows = [], []
    grid = [(e, r) for e in params.fedavg_epoch_candidates for r in getattr(params, f"{kind}_fedavg_rate_candidates")]

    def score(candidate: dict) -> float:
        e, r = candidate["local_epochs"], candidate["learning_rate"]
        log(f"{MODEL_NAMES[kind]}: FedAvg candidate {e} local epoch(s), SGD rate {r}")
        curve = train(params, kind, pre.model, pre.weights, data.train, holdout, params.seed, e, r, log, screen)
        kept = next(p for p in curve if p["kept"])
        runs.append((pre.model.get_weights(), curve))
        rows.append(dict(kept_round=kept["step"], ended_by=kept["ended_by"], kept_epochs_seen=kept["epochs_seen"]))
        loss = kept["holdout_loss"]
        return -loss if np.isfinite(loss) else -np.inf

    candidates = [dict(local_epochs=e, learning_rate=r) for e, r in grid]
    best, table = selection.select(candidates, score, log)
    chosen = int(np.flatnonzero(table.chosen.to_numpy())[0])
    table = pd.concat([table, pd.DataFrame(rows)], axis=1).assign(**{"validation holdout loss": -table.score})
    table = table.drop(columns="score").assign(method="FedAvg", model=MODEL_NAMES[kind], optimizer="sgd")
    table["screen rounds"] = screen
    if screen and (rows[chosen]["ended_by"] == "cap" or cloud_baselines.rate_cuts(params, kind).cuts):
        e, r = best["local_epochs"], best["learning_rate"]
        log(f"{MODEL_NAMES[kind]}: FedAvg, the best screened pair ({e} local epoch(s), rate {r}) to its plateau")
        curve = train(params, kind, pre.model, pre.weights, data.train, holdout, params.seed, e, r, log)
        runs[chosen] = (pre.model.get_weights(), curve)
    kept = next(p for p in runs[chosen][1] if p["kept"])
    table["chosen run: kept round"] = np.where(table.chosen, kept["step"], np.nan)
    table["chosen run: validation holdout loss"] = np.where(table.chosen, kept["holdout_loss"], np.nan)
    pre.model.set_weights(runs[chosen][0])
    log(f"{MODEL_NAMES[kind]}: FedAvg with {best['local_epochs']} local epoch(s) at SGD rate {best['learning_rate']}")
    return Choice(best["local_epochs"], best["learning_rate"], *runs[chosen], table)


def choose_all(params, text, images, pre, log=print) -> tuple[dict[str, Choice], pd.DataFrame]:
    """`choose` on both kinds (the first seed's public models): the choices and one table."""
    choices = {k: choose(params, k, d, pre[k][params.seed], log) for k, d in (("text", text), ("image", images))}
    return choices, pd.concat([c.table for c in choices.values()], ignore_index=True)


def federate(params, kind, model, start, clients, holdout, seed, choice: Choice, reuse: bool, log) -> list[dict]:
    """FedAvg with the chosen setting, leaving its kept weights in `model`; with `reuse` the chosen
    run itself (the first seed's users as clients) instead of training it again."""
    if reuse:
        model.set_weights(choice.weights)
        return choice.curve
    return train(params, kind, model, start, clients, holdout, seed, choice.local_epochs, choice.learning_rate, log)


def control_table(history: list[dict], tolerance: float, cloud: str, fedavg: str) -> pd.DataFrame:
    """Per model and seed with shuffled clients, from the convergence curves: CloudTrain's and
    IID FedAvg's kept held-out losses (`report.stopping_table`), the relative gap and the verdict
    against `tolerance`; the users' FedAvg beside them."""
    rows, stopping = [], report.stopping_table(pd.DataFrame(history))
    for (model, seed), g in stopping.groupby(["model", "seed"], sort=False):
        if SHUFFLED not in set(g.method):
            continue
        c, s, f = (g[g.method == m].iloc[0] for m in (cloud, SHUFFLED, fedavg))
        gap = s.kept_holdout_loss / c.kept_holdout_loss - 1
        row = dict(model=model, seed=seed, cloudtrain_loss=c.kept_holdout_loss, cloudtrain_ended_by=c.ended_by)
        row |= dict(iid_fedavg_loss=s.kept_holdout_loss, iid_kept_round=s.kept, iid_ended_by=s.ended_by)
        row |= dict(iid_epochs_seen=s.kept_epochs_seen, relative_gap=gap, tolerance=tolerance)
        rows.append(row | dict(users_fedavg_loss=f.kept_holdout_loss, verdict=_verdict(gap, tolerance, s.ended_by)))
    return pd.DataFrame(rows)


def _verdict(gap: float, tolerance: float, ended_by: str) -> str:
    if np.isfinite(gap) and gap < -tolerance:  # the control is one-sided; a centralized model left behind is news
        return f"passes: IID FedAvg's plateau is {gap:+.1%} below CloudTrain's held-out loss, which CloudTrain misses"
    if np.isfinite(gap) and gap <= tolerance:
        return f"passes: within {tolerance:.0%} of CloudTrain's held-out loss"
    if ended_by == "cap":
        return "fails: the round cap ended IID FedAvg before its plateau (not converged)"
    return f"fails: IID FedAvg's plateau is {gap:+.1%} above CloudTrain's held-out loss"
