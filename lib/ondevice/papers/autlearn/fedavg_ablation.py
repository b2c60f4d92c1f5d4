"""Why FedAvg trails CloudTrain (autlearn_accuracy, issue 26). Our CloudTrain beats FedAvg by far
more than the paper's 1%. FedAvg's clients are the users, each with one role's lines or one
writer's characters (non-IID data), so each round's local training pulls the model toward a few
users' data (client drift), which pooled training never sees. The same FedAvg (`fedavg_baseline`:
rounds, clients per round, stopping rule, start weights and client draws, the users' chosen local
epochs, client rate and warm-up) on *shuffled* clients, as many as the users and each as large as
its user's training set, filled with samples drawn at random from every user's training data,
removes only that: the data, its amount and the client sizes stay. Run on the first seed; it is
also FedAvg's known-answer control (`fedavg_baseline.control_table`).

The rule, fixed before any run: shuffling measures how much of CloudTrain's advantage the users'
non-IID split makes. It is no diagnosis of our difference from the paper: the paper's clients
(writers, roles) were non-IID as well, so a property both share cannot explain why our gap is
larger (issue 70). The row's diagnosis states the measurement, with the control's verdict (a
FedAvg that cannot reach CloudTrain on IID clients says nothing about non-IID ones), and stays open.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ondevice import streams
from ondevice.data.typing_samples import build_samples
from ondevice.papers.autlearn.common import MODEL_NAMES
from ondevice.report import claims

SECTION = "Why FedAvg trails CloudTrain: shuffled clients"
SHUFFLED = "FedAvg, shuffled clients (ablation)"
ADVANTAGE = "CloudTrain's advantage"  # relative change of the mean top-1, CloudTrain over FedAvg


def client_sets(fedavg: str, kind: str, data, seed: int, ablate: bool) -> dict:
    """Method -> FedAvg's clients: `fedavg` the users; with `ablate`, SHUFFLED the shuffled clients too."""
    return {fedavg: data.train} | ({SHUFFLED: shuffled_clients(kind, data, seed)} if ablate else {})


def shuffled_clients(kind: str, data, seed: int) -> dict:
    """As many clients as users, client i as large as user i's training set (sentences for text,
    images for images), filled without replacement from all users' training data in random order."""
    rng = streams.rng(seed, f"fedavg-ablation/shuffle/{kind}")
    if kind == "text":
        pooled = [s for u in data.users for s in data.train_sentences[u]]
        sizes = [len(data.train_sentences[u]) for u in data.users]
    else:
        x, y = data.pooled_train()
        sizes = [len(data.train[u][1]) for u in data.users]
    order, bounds = rng.permutation(sum(sizes)), np.cumsum([0, *sizes])
    parts = [order[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
    if kind == "text":
        make = lambda idx: build_samples([pooled[i] for i in idx], data.vocab, data.context_words)  # noqa: E731
    else:
        make = lambda idx: (x[np.sort(idx)], y[np.sort(idx)])  # noqa: E731
    return {f"shuffled-{i:03d}": make(idx) for i, idx in enumerate(parts)}


CLAIM = "CloudTrain beats FedAvg ({})"  # the paper's claim per model (paper.toml)


def paper_changes(paper: claims.Paper) -> dict[str, float]:
    """Model -> the paper's change for CLAIM (its two numbers' ratio - 1)."""
    values = {n.quantity: n.value for n in paper.numbers}
    changes = {e.claim: values[e.better] / values[e.worse] - 1 for e in paper.effects}
    return {model: changes[CLAIM.format(model)] for model in MODEL_NAMES.values()}


def _top1(users: pd.DataFrame, model: str, method: str) -> pd.Series:
    return users[(users.model == model) & (users.method == method)].set_index("user").top1


def table(users: pd.DataFrame, paper: claims.Paper, cloud: str, fedavg: str, seed: int, rng, n_boot: int):
    """Per model, on the first seed's users: CloudTrain's advantage over FedAvg with users as clients
    and with shuffled clients (relative change of the mean top-1, paired bootstrap over users), each
    judged against the paper's change by `claims.audit`."""
    rows, first, changes = [], users[users.seed == seed], paper_changes(paper)
    for model in MODEL_NAMES.values():
        better = _top1(first, model, cloud)
        for clients, method in (("users (the protocol)", fedavg), ("shuffled (IID)", SHUFFLED)):
            worse = _top1(first, model, method).reindex(better.index)
            r = claims.paired_effect(better.to_numpy(), worse.to_numpy(), rng, n_boot, statistic="mean")
            row = dict(model=model, clients=clients, users=len(better), seed=seed, fedavg_mean_top1=worse.mean())
            row |= dict(cloudtrain_mean_top1=better.mean(), paper_change=changes[model])
            row |= {ADVANTAGE: r["change"], "ci low": r["ci_low"], "ci high": r["ci_high"]}
            rows.append(row | {"audit": claims.audit(changes[model], r["change"], r["ci_low"], r["ci_high"])})
    return pd.DataFrame(rows)


def diagnoses(ablation: pd.DataFrame, control: pd.DataFrame) -> dict[str, claims.Diagnosis]:
    """CLAIM of each model -> its diagnosis (the module's rule): CloudTrain's advantage with users
    and with shuffled clients, and the control's verdict; open, since the paper's clients were
    non-IID too."""
    out, verdicts = {}, dict(zip(control.model, control.verdict))
    for model, g in ablation.groupby("model", sort=False):
        users, shuffled = (g[g.clients.str.startswith(c)].iloc[0] for c in ("users", "shuffled"))
        change = lambda r: f"{r[ADVANTAGE]:+.1%} [{r['ci low']:+.1%}, {r['ci high']:+.1%}]"  # noqa: E731
        text = "with shuffled (IID) clients, the same data, client sizes and setting, CloudTrain beats FedAvg by "
        text += f"{change(shuffled)} ({shuffled.audit} with the paper), with users as clients {change(users)} (first "
        text += "seed); the paper's clients were non-IID too, so this does not explain our difference from it; "
        text += f"the IID control {verdicts.get(model, 'did not run')}"
        out[CLAIM.format(model)] = claims.Diagnosis(text, SECTION, claims.Kind.OPEN)
    return out
