"""How the global proxy's size moves the forgetting rows. Without AudioSet, "global" AUC is scored on
held-out ESC-50 clips (`audio_data`): every clip of the held-out classes the data mirror has is
either scored or in GDM's mixing pool, so the scored set cannot grow here. Instead it shrinks: the
forgetting claims are re-measured on random subsets of its clips (FRACTIONS, DRAWS each), from the
clip scores of the ablation's runs (`forgetting`), at every candidate rate. A curve that moves
toward the thesis's change as the set grows says the proxy's size is a cause; a flat one says not.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ondevice import streams
from ondevice.models import yamnet
from ondevice.papers.moil import protocol
from ondevice.papers.moil.audio_data import AUDIOSET, AudioData, Part
from ondevice.papers.moil.audio_model import class_aucs, clip_scores
from ondevice.papers.moil.forgetting import CLAIMS, PRE, Ablation
from ondevice.papers.moil.rate_choice import rate_text
from ondevice.report import claims

FRACTIONS = (0.25, 0.5, 0.75, 1.0)  # of the scored global clips
DRAWS = 20  # random subsets per fraction below 1
MEASURED = tuple(list(CLAIMS)[:2])  # the forgetting rows: GDM(0) forgets, mixing keeps more
SECTION = "Forgetting against the global set's size"
AUDIOSET_EVAL = 17477  # clips in AudioSet's evaluation set, the thesis's global set


def scores(weights: dict[str, list[np.ndarray]], part: Part) -> dict[str, np.ndarray]:
    """Each model's clip scores on `part` ([clips, classes]), one YAMNet rebuilt with its weights."""
    model = yamnet.build()
    predict, out = protocol.forward(model), {}  # compiled once: it reads the weights set below
    for name, w in weights.items():
        model.set_weights(w)
        out[name] = clip_scores(predict, part)
    return out


def _change(aucs: dict[str, pd.Series], claim: str) -> float:
    """The claim's relative change of median class AUCs (`claims.paired_effect`'s statistic)."""
    better, worse = CLAIMS[claim]
    return float(np.median(aucs[better]) / np.median(aucs[worse]) - 1)


def curve(part: Part, by_rate: dict[float, dict[str, np.ndarray]], seed: int) -> pd.DataFrame:
    """Per rate, fraction and draw: the clips and labels scored and each MEASURED claim's change on
    that subset of `part` (every model scored on the same clips, so each change stays paired); a
    draw with fewer than two labels scored, or a median AUC of 0, has no change and is dropped."""
    rng, rows = streams.rng(seed, "moil-audio/global-proxy"), []
    columns = ["Adam rate", "fraction", "clips", "draw", "labels", *MEASURED]
    for fraction in FRACTIONS:
        size = max(2, round(fraction * len(part)))
        for draw in range(DRAWS if size < len(part) else 1):
            clips = np.sort(rng.choice(len(part), size, replace=False))
            sub = part.subset(clips)
            for rate, by_model in by_rate.items():
                aucs = {name: class_aucs(sub, s[clips]) for name, s in by_model.items()}
                with np.errstate(divide="ignore", invalid="ignore"):
                    changes = {c: _change(aucs, c) for c in MEASURED} if len(aucs[PRE]) >= 2 else {}
                if changes and np.isfinite(list(changes.values())).all():
                    row = {"Adam rate": rate, "fraction": fraction, "clips": size, "draw": draw}
                    rows.append(row | {"labels": len(aucs[PRE])} | changes)
    return pd.DataFrame(rows, columns=columns)


def summary(draws: pd.DataFrame) -> pd.DataFrame:
    """Per rate and fraction: each claim's mean change over the draws and the draws' 95% range."""
    rows = []
    for (rate, fraction), d in draws.groupby(["Adam rate", "fraction"]):
        row = {"Adam rate": rate, "fraction": fraction, "clips": int(d.clips.iloc[0]), "draws": len(d)}
        row["labels scored"] = float(d.labels.mean())
        for c in MEASURED:
            low, high = np.quantile(d[c], [0.025, 0.975])
            row |= {c: float(d[c].mean()), f"{c}, draws low": float(low), f"{c}, draws high": float(high)}
        rows.append(row)
    spread = [f"{c}{end}" for c in MEASURED for end in ("", ", draws low", ", draws high")]
    return pd.DataFrame(rows, columns=["Adam rate", "fraction", "clips", "draws", "labels scored", *spread])


def measure(ablation: Ablation, pre_weights: list[np.ndarray], part: Part, seed: int) -> pd.DataFrame:
    """The size curve of MEASURED at every rate of the ablation (its first seed's runs)."""
    roles = {role for c in MEASURED for role in CLAIMS[c]} - {PRE}
    weights = {PRE: pre_weights} | {
        f"{rate!r}/{role}": run.weights
        for rate, runs in ablation.runs.items()
        for role, run in runs.items()
        if role in roles
    }
    scored = scores(weights, part)
    by_rate = {rate: {PRE: scored[PRE]} | {r: scored[f"{rate!r}/{r}"] for r in roles} for rate in ablation.runs}
    return summary(curve(part, by_rate, seed))


def paper_changes(paper: claims.Paper) -> dict[str, float]:
    """The thesis's change of each claim, as `claims.effects_table` computes it."""
    values = {n.quantity: n.value for n in paper.numbers}
    return {e.claim: values[e.better] / values[e.worse] - 1 for e in paper.effects}


def moves_toward(table: pd.DataFrame, rate: float, claim: str, paper: float) -> bool:
    """The rule fixed before the run: the full set's change is closer to the paper's than the smallest
    subset's mean by more than half the smallest subset's 95% draw range."""
    t = table[table["Adam rate"] == rate].sort_values("fraction")
    small, full = t.iloc[0], t.iloc[-1]
    margin = (small[f"{claim}, draws high"] - small[f"{claim}, draws low"]) / 2
    return abs(full[claim] - paper) < abs(small[claim] - paper) - margin


def diagnoses(table: pd.DataFrame, rate: float, paper: claims.Paper, data: AudioData) -> dict[str, claims.Diagnosis]:
    """The MEASURED rows' diagnosis: the proxy stated with its measured sensitivity at `rate`; kind
    data when the size moves the change toward the thesis's (`paper`'s, by `moves_toward`), else
    open. None where the global set is AudioSet's own (paper scale) or no subset had a change."""
    change = paper_changes(paper)
    t = table[table["Adam rate"] == rate].sort_values("fraction")
    if t.empty or data.global_categories == [AUDIOSET]:
        return {}
    small, full = t.iloc[0], t.iloc[-1]
    out = {}
    for c in MEASURED:
        toward = moves_toward(table, rate, c, change[c])
        out[c] = claims.Diagnosis(
            f"global set is a proxy: {int(full.clips)} held-out clips of {data.source} on "
            f"{full['labels scored']:.0f} AudioSet labels (with GDM's pool, every clip of the held-out classes "
            f"there) for AudioSet's {AUDIOSET_EVAL:,} evaluation clips; at this rate (first seed) the change is "
            f"{small[c]:+.1%} on {int(small.clips)} clips (mean of {int(small.draws)} draws, 95% "
            f"{small[f'{c}, draws low']:+.1%} to {small[f'{c}, draws high']:+.1%}) and {full[c]:+.1%} on all "
            f"{int(full.clips)}: growing the set "
            + ("moves it toward" if toward else "does not move it toward")
            + f" the thesis's {change[c]:+.1%} beyond the smallest subsets' spread",
            SECTION,
            claims.Kind.DATA if toward else claims.Kind.OPEN,
        )
    return out


def plot(table: pd.DataFrame, paper: claims.Paper):
    """Each forgetting row's change against the number of global clips scored, one curve per rate
    (bars: the draws' 95% range), beside the thesis's change."""
    import matplotlib.pyplot as plt

    change = paper_changes(paper)
    fig, axes = plt.subplots(1, len(MEASURED), figsize=(11, 3.6))
    for ax, c in zip(axes, MEASURED):
        for rate, t in table.groupby("Adam rate"):
            low, high = t[c] - t[f"{c}, draws low"], t[f"{c}, draws high"] - t[c]
            ax.errorbar(t.clips, 100 * t[c], yerr=100 * np.stack([low, high]), marker="o", capsize=3)
            ax.lines[-1].set_label(f"Adam {rate_text(rate)}")
        ax.axhline(100 * change[c], color="black", linestyle="--", label="thesis")
        ax.set(title=c, xlabel="global clips scored", ylabel="change (%)")
        ax.legend(fontsize=8, frameon=False)
    fig.suptitle("The forgetting rows against the global set's size (random subsets of its clips)")
    fig.tight_layout()
    return fig
