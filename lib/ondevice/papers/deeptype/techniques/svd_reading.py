"""Where DeepType's layer compression factors (Sec. 5.1 read two ways), both measured, and which
reading Table 2's main rows use.

Sec. 5.1's text factors "the last softmax layer"; Table 2's 17.0 MB fits only the softmax *and* the
embedding factored (`model_size`). The softmax's rank comes from `svd_rank`'s rule; then, with the
softmax at that rank, the embedding's rank by the same rule, per matrix: each swept fraction of
the embedding width below full is factored (`models.svd_embedding`) and re-trained on the crowd
(first seed, cached), and the smallest rank whose re-trained held-out loss is within the tolerance
is kept. Which reading the main rows use is `READING_RULE`, fixed before any run and read on the
held-out global text (never a test user); the other reading is the sensitivity row."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ondevice.models import svd_compression as svd
from ondevice.models.svd_embedding import compress_embedding
from ondevice.papers.deeptype import common
from ondevice.papers.deeptype.model_size import SOFTMAX_ONLY, WITH_EMBEDDING
from ondevice.papers.deeptype.techniques import svd_rank, svd_retrain

# The compression's own aim (the rank rule's): the smallest model that stays close to the original.
READING_RULE = (
    "the reading with fewer parameters among those whose re-trained held-out loss is within the rank rule's "
    "tolerance of the unfactored model's; if neither is (or both are the same size), the Sec. 5.1 text's "
    "(softmax only)"
)


@dataclass
class Readings:
    """Both readings' compressed global models (every seed), the rank sweeps and the rule's choice."""

    compressed: dict[str, svd_retrain.Compressed]  # reading -> the compressed global models
    main: str  # the reading the rule chose
    sweep: pd.DataFrame  # the softmax's ranks (`svd_rank.sweep`)
    embedding_sweep: pd.DataFrame  # the embedding's ranks, the softmax at its rule's rank
    table: pd.DataFrame  # one row per reading (`readings_table`)

    @property
    def chosen(self) -> svd_retrain.Compressed:
        return self.compressed[self.main]

    @property
    def other(self) -> str:
        return next(r for r in self.compressed if r != self.main)


def embedding_sweep(params, corpus, models, softmax_rank: int, log=print) -> pd.DataFrame:
    """One row per swept fraction of the embedding width (first seed), the softmax factored at
    `softmax_rank`: held-out loss factored, and re-trained below full rank; `svd_rank.judge`'s choice."""
    task, holdout = common.global_task(params), corpus.holdout_samples
    models.model.set_weights(models.weights[params.seed])
    reference, rows = svd_rank.held_out_loss(task, models.model, holdout), []
    for fraction in sorted(params.svd_rank_sweep):
        rank = svd.rank_for(params.embedding_dim, fraction)
        models.model.set_weights(models.weights[params.seed])
        factored = svd.compress(compress_embedding(models.model, rank), softmax_rank)
        row = dict(rank_fraction=fraction, rank=rank, softmax_rank=softmax_rank)
        row["holdout_loss"], row["retrained_holdout_loss"] = svd_rank.held_out_loss(task, factored, holdout), np.nan
        if rank < params.embedding_dim:
            entry = svd_retrain.retrain_seed(models, params, corpus, params.seed, softmax_rank, log, rank)
            row["retrained_holdout_loss"] = svd_retrain.kept_loss(entry)
        rows.append(row)
    table = svd_rank.judge(pd.DataFrame(rows), reference, params.svd_rank_tolerance, params.embedding_dim)
    log(f"SVD rank rule on the embedding (softmax t = {softmax_rank}): t = {svd_rank.chosen_rank(table)}")
    return table


def readings_table(sweep: pd.DataFrame, esweep: pd.DataFrame, compressed: dict) -> pd.DataFrame:
    """Per reading: its ranks, parameters and MB of the compressed global model, held-out loss
    factored and re-trained against the limit, and `chosen` by `READING_RULE`."""
    rows = []
    for reading, table in ((SOFTMAX_ONLY, sweep), (WITH_EMBEDDING, esweep)):
        r, c = table[table.chosen].iloc[0], compressed[reading]
        rows.append(dict(reading=reading, softmax_rank=c.rank, embedding_rank=c.embedding_rank))
        rows[-1].update(parameters=c.model.count_params(), size_mb=4 * c.model.count_params() / 1e6)
        rows[-1].update({k: r[k] for k in ("holdout_loss", "retrained_holdout_loss", "unfactored_holdout_loss")})
        rows[-1].update(limit=r["limit"], within_tolerance=bool(r["within_tolerance"]))
    t = pd.DataFrame(rows)
    within = t[t.within_tolerance]
    sizes = within.parameters.tolist()
    main = within.reading.iloc[int(np.argmin(sizes))] if sizes and len(set(sizes)) == len(sizes) else SOFTMAX_ONLY
    t["chosen"] = t.reading == main
    return t


def compress(params, corpus, models, log=print) -> Readings:
    """Both readings at their rules' ranks, every seed's global model factored and re-trained (cached)."""
    sweep = svd_rank.sweep(params, corpus, models, log)
    rank = svd_rank.chosen_rank(sweep)
    esweep = embedding_sweep(params, corpus, models, rank, log)
    compressed = {
        SOFTMAX_ONLY: svd_retrain.compress_globals(models, params, corpus, rank, log),
        WITH_EMBEDDING: svd_retrain.compress_globals(models, params, corpus, rank, log, svd_rank.chosen_rank(esweep)),
    }
    table = readings_table(sweep, esweep, compressed)
    main = table[table.chosen].reading.iloc[0]
    log(f"SVD reading rule ({READING_RULE}): {main}")
    return Readings(compressed, main, sweep, esweep, table)
