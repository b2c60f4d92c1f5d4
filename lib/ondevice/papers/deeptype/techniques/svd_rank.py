"""The SVD rank t of DeepType's layer compression (Sec. 5.1), chosen by a rule fixed before any test
run, on held-out *training* text (the global text's hold-out, never a test user).

The paper keeps "only 10% of the singular values" because that was enough "to approximate the
original weight matrix" of its 400 x 20K softmax: the reason is the approximation, the 10% its
outcome. Our rule states that reason: each rank of `svd_rank_sweep` below full is factored and
re-trained on the crowd as the paper's cloud does (`svd_retrain.retrain_seed`, first seed,
cached), and t is the smallest rank whose re-trained held-out loss is at most
(1 + `svd_rank_tolerance`) x the unfactored global model's. If none is, t is the largest rank
tried (the rule never factors at full rank, which would grow the layer). The sweep table keeps
every rank's loss before and after re-training, so a reader sees what the rule saw."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ondevice.models import svd_compression as svd
from ondevice.papers.deeptype import common
from ondevice.papers.deeptype.techniques import svd_retrain
from ondevice.params import Params

SMOKE = dict(svd_retrain_epochs=2, svd_rank_sweep=(0.1, 0.5, 1.0))  # every smoke preset: the same cached models
RULE = "smallest swept rank whose re-trained held-out loss <= (1 + tolerance) x the unfactored model's"


@dataclass(frozen=True)
class SVDParams(Params):
    """The fields of the SVD rank rule (an experiment's Params derives from it too)."""

    svd_rank_sweep: tuple[float, ...] = (0.1, 0.25, 0.5, 1.0)  # rank fractions of the hidden units swept
    svd_rank_tolerance: float = 0.01  # fixed before any run: 1% above the unfactored held-out loss
    svd_retrain_epochs: int = 13  # a cap: each re-training stops on the global plateau rule

    def check(self) -> None:
        fractions = self.svd_rank_sweep
        ok = len(fractions) >= 2 and all(0 < f <= 1 for f in fractions) and 1.0 in fractions
        self.require(ok, "svd_rank_sweep", "needs 1.0 and at least one smaller fraction, each in (0, 1]")
        self.require(self.svd_rank_tolerance >= 0, "svd_rank_tolerance", "must be >= 0")
        self.require(self.svd_retrain_epochs >= 0, "svd_retrain_epochs", "must be >= 0")


def held_out_loss(task, model, holdout) -> float:
    return float(np.log(task.evaluate(model, holdout)["perplexity"]))


def sweep(params, corpus, models, log=print) -> pd.DataFrame:
    """One row per swept rank (first seed): held-out loss factored, and re-trained below full rank;
    `chosen` marks the rule's rank, `unfactored_holdout_loss` the reference."""
    if corpus.holdout_samples is None:
        raise ValueError("the SVD rank rule needs held-out global text (global_holdout_words > 0)")
    task, holdout = common.global_task(params), corpus.holdout_samples
    models.model.set_weights(models.weights[params.seed])
    reference = held_out_loss(task, models.model, holdout)
    table = svd.rank_sweep(models.model, sorted(params.svd_rank_sweep), params.hidden_units, task, holdout)
    retrained = []
    for rank in table["rank"]:
        if rank >= params.hidden_units:
            retrained.append(np.nan)
            continue
        entry = svd_retrain.retrain_seed(models, params, corpus, params.seed, int(rank), log)
        retrained.append(svd_retrain.kept_loss(entry))
    table["retrained_holdout_loss"] = retrained
    table = judge(table, reference, params.svd_rank_tolerance, params.hidden_units)
    log(f"SVD rank rule ({RULE}, tolerance {params.svd_rank_tolerance:g}): t = {chosen_rank(table)}")
    return table


def judge(table: pd.DataFrame, reference: float, tolerance: float, full: int) -> pd.DataFrame:
    """The rule on one matrix's sweep (`rank`, `retrained_holdout_loss`; `full`: its full rank):
    adds the reference loss, the limit, `within_tolerance` and the `chosen` rank."""
    limit = reference * (1 + tolerance)
    table["unfactored_holdout_loss"], table["limit"] = reference, limit
    table["within_tolerance"] = table.retrained_holdout_loss <= limit
    below = table[table["rank"] < full]
    passing = below[below.within_tolerance]
    chosen = int(passing["rank"].min()) if len(passing) else int(below["rank"].max())
    table["chosen"] = table["rank"] == chosen
    return table


def chosen_rank(table: pd.DataFrame) -> int:
    return int(table.loc[table.chosen, "rank"].iloc[0])


def compress(params, corpus, models, log=print) -> tuple[svd_retrain.Compressed, pd.DataFrame]:
    """Every seed's global model factored at the rule's rank and re-trained (cached), and the sweep."""
    table = sweep(params, corpus, models, log)
    return svd_retrain.compress_globals(models, params, corpus, chosen_rank(table), log), table
