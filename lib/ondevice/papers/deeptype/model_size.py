"""Table 2's model sizes by arithmetic, on the paper's LSTM and on ours: parameters per layer
(float32, 4 bytes each) of the baseline, layer compression, vocabulary compression and all
combined, under both readings of where the paper factors: its Sec. 5.1 text ("we apply this
technique to the last softmax layer", what we implement) and the embedding as well (the only
reading its 17.0 MB fits: a 20K x 400 embedding is as large as the 400 x 20K softmax). Each model
is taken at the paper's rank (10% of the hidden units, both matrices) and at our rules' ranks (per
matrix, as fractions of its width), so the size rows' diagnoses are computed from both shapes, not
guessed."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ondevice.report import claims
from ondevice.tasks.typing_protocol import DeepTypeParams

SOFTMAX_ONLY, WITH_EMBEDDING = "softmax (Sec. 5.1 text; ours)", "embedding and softmax"
PAPER_RANK_FRACTION = 0.1  # Sec. 5.1: t = 40 of 400
_P = DeepTypeParams("paper", 0)  # its defaults are the paper's model (Sec. 2, 5.1): 20K words, 400 units, 2 layers
PAPER_SHAPE = dict(words_in=_P.vocab_size, words_out=_P.vocab_size, embedding=_P.embedding_dim)
PAPER_SHAPE |= dict(hidden=_P.hidden_units, layers=_P.lstm_layers)


def parameters(
    words_in: int, words_out: int, embedding: int, hidden: int, layers: int, rank: int = 0, **cut
) -> dict[str, int]:
    """Parameters per layer of the LSTM LM (`models.lstm_lm`): `rank` > 0 factors the softmax,
    cut["embedding_rank"] > 0 the embedding too (when that is smaller), cut["kept"] > 0 cuts the
    softmax to that many words (Sec. 5.2)."""
    words, e_rank = cut.get("kept") or words_out, cut.get("embedding_rank", 0)
    out = {"embedding": min(words_in * embedding, e_rank * (words_in + embedding) or words_in * embedding)}
    width = embedding
    for i in range(layers):
        out[f"lstm_{i + 1}"] = 4 * hidden * (width + hidden + 1)
        width = hidden
    out["softmax"] = (rank * (hidden + words) if rank else hidden * words) + words
    return out


def variants(shape: dict, rank: int, kept: int, embedding_rank: int = 0) -> dict[tuple[str, str], dict]:
    """(variant, reading) -> parameters per layer: Table 2's rows with a size under both readings
    (the embedding at `embedding_rank`, or at `rank` when 0)."""
    out = {("baseline", "-"): parameters(**shape), ("vocab", SOFTMAX_ONLY): parameters(**shape, kept=kept)}
    for reading, e_rank in ((SOFTMAX_ONLY, 0), (WITH_EMBEDDING, embedding_rank or rank)):
        out[("svd", reading)] = parameters(**shape, rank=rank, embedding_rank=e_rank)
        out[("combined", reading)] = parameters(**shape, rank=rank, embedding_rank=e_rank, kept=kept)
    return out


def table(
    ours: dict, our_rank: int, our_kept: float, paper_kept: float, paper_mb: dict, our_embedding_rank: int = 0
) -> pd.DataFrame:
    """Per model (paper's, ours), rank rule, variant and reading: parameters, MB, size change
    (baseline / variant - 1, the effects' form), the softmax's share, and the paper's reported MB.
    Our rules' ranks are fractions of each matrix's width (`our_embedding_rank` of the embedding's;
    0: the softmax's fraction of the hidden units for both)."""
    rows, fraction = [], our_rank / ours["hidden"]
    e_fraction = our_embedding_rank / ours["embedding"] if our_embedding_rank else None
    for model, shape, kept in (("paper's", PAPER_SHAPE, paper_kept), ("ours", ours, our_kept)):
        for rule, f, e in (("paper's 10%", PAPER_RANK_FRACTION, None), ("our rule's", fraction, e_fraction)):
            rank = max(1, int(round(f * shape["hidden"])))
            e_rank = max(1, int(round(e * shape["embedding"]))) if e else rank
            sizes = variants(shape, rank, int(round(kept)), e_rank)
            base = sum(sizes[("baseline", "-")].values())
            for (variant, reading), per_layer in sizes.items():
                n = sum(per_layer.values())
                rows.append(dict(model=model, rank_rule=rule, rank=rank, embedding_rank=e_rank, variant=variant))
                rows[-1]["reading"] = reading
                rows[-1].update(parameters=n, size_mb=4 * n / 1e6, size_change=base / n - 1)
                rows[-1].update(softmax_share=per_layer["softmax"] / n, embedding_share=per_layer["embedding"] / n)
                rows[-1]["paper_reported_mb"] = paper_mb.get(variant, np.nan) if model == "paper's" else np.nan
    return pd.DataFrame(rows)


def _at(t: pd.DataFrame, model: str, rule: str, variant: str, reading: str) -> float:
    sel = t[(t.model == model) & (t.rank_rule == rule) & (t.variant == variant) & (t.reading == reading)]
    return float(sel.size_change.iloc[0])


def diagnosis(
    t: pd.DataFrame, variant: str, measured: float, section: str, reading: str = SOFTMAX_ONLY
) -> claims.Diagnosis:
    """Why our size change differs from the paper's, from the arithmetic: the paper's model under
    both readings at its t, ours under both at our t (`measured` is ours under `reading`). The kind
    is the larger of the two gaps (log size ratio): between the readings of the paper's own model
    (READ_TWO_WAYS; only when we measured the text's reading), or between the two models' shapes
    under the measured reading (SCALE)."""
    base = t[(t.model == "paper's") & (t.variant == "baseline")].iloc[0]
    reported = base.paper_reported_mb / float(
        t[(t.model == "paper's") & (t.variant == variant)].paper_reported_mb.iloc[0]
    )
    p_text, p_emb = (_at(t, "paper's", "paper's 10%", variant, r) for r in (SOFTMAX_ONLY, WITH_EMBEDDING))
    o_text, o_emb = (_at(t, "ours", "our rule's", variant, r) for r in (SOFTMAX_ONLY, WITH_EMBEDDING))
    ours = t[(t.model == "ours") & (t.variant == "baseline")].iloc[0]
    our_row = t[(t.model == "ours") & (t.rank_rule == "our rule's")].iloc[0]
    rank, e_rank = int(our_row["rank"]), int(our_row["embedding_rank"])
    p_rank = int(t[(t.model == "paper's") & (t.rank_rule == "paper's 10%")]["rank"].iloc[0])
    p_read, o_read = (p_emb, o_emb) if reading == WITH_EMBEDDING else (p_text, o_text)
    reading_gap, shape_gap = abs(np.log((1 + p_emb) / (1 + p_text))), abs(np.log((1 + p_read) / (1 + o_read)))
    m = {r: f" (measured {measured:+.0%})" if r == reading else "" for r in (SOFTMAX_ONLY, WITH_EMBEDDING)}
    text = (
        f"arithmetic (4 bytes a parameter): the paper's LSTM ({base.parameters / 1e6:.1f}M, softmax "
        f"{base.softmax_share:.0%}, embedding {base.embedding_share:.0%}) at t={p_rank} shrinks {p_text:+.0%} "
        f"with the softmax factored as Sec. 5.1 says, {p_emb:+.0%} with the embedding too (its Table 2: "
        f"{reported - 1:+.0%}); ours ({ours.parameters / 1e6:.2f}M, softmax {ours.softmax_share:.0%}, embedding "
        f"{ours.embedding_share:.0%}) at t={rank} shrinks {o_text:+.0%} with the softmax{m[SOFTMAX_ONLY]}, "
        f"{o_emb:+.0%} with the embedding too (t={e_rank}){m[WITH_EMBEDDING]}"
    )
    # measured under the reading the paper's sizes fit, what is left is the shapes' difference
    two_ways = reading == SOFTMAX_ONLY and reading_gap >= shape_gap
    kind = claims.Kind.READ_TWO_WAYS if two_ways else claims.Kind.SCALE
    return claims.Diagnosis(text, section, kind)
