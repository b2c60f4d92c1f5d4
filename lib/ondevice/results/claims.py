"""Claims: the paper's numbers beside ours, and whether each claimed effect holds here."""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd


@dataclass(frozen=True)
class PaperNumber:
    quantity: str
    value: float
    source: str


@dataclass(frozen=True)
class Effect:
    """A claimed direction: `better` should exceed `worse` (by the paper's account)."""

    claim: str
    better: str
    worse: str


@dataclass(frozen=True)
class Paper:
    citation: str
    numbers: tuple[PaperNumber, ...]
    effects: tuple[Effect, ...]


def paper_vs_ours(paper: Paper, ours: dict[str, float]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The paper's numbers beside ours (never instead), and whether each claimed effect holds here."""
    missing = [n.quantity for n in paper.numbers if n.quantity not in ours]
    if missing:
        raise KeyError(f"no measured value for {missing}")
    numbers = pd.DataFrame([
        {"quantity": n.quantity, "paper": n.value, "ours": ours[n.quantity],
         "ours / paper": ours[n.quantity] / n.value if n.value else float("nan"), "paper source": n.source}
        for n in paper.numbers
    ])
    paper_values = {n.quantity: n.value for n in paper.numbers}
    effects = pd.DataFrame([
        {"effect": e.claim, "holds in paper": paper_values[e.better] > paper_values[e.worse],
         "holds in ours": ours[e.better] > ours[e.worse],
         "paper change": paper_values[e.better] / paper_values[e.worse] - 1,
         "our change": ours[e.better] / ours[e.worse] - 1}
        for e in paper.effects
    ])
    return numbers, effects


def verdict(result: Result) -> str:
    """A Markdown sentence per claimed effect: does it hold on our data, and on what data."""
    lines = []
    for _, row in result.tables["effects"].iterrows():
        ours, paper = bool(row["holds in ours"]), bool(row["holds in paper"])
        lines.append(f"- **{row['effect']}**: {'holds' if ours else 'does not hold'} in our measurement "
                     f"({'as in' if ours == paper else 'unlike'} the paper), with a change of "
                     f"{row['our change']:+.1%} against the paper's {row['paper change']:+.1%}.")
    if result.stand_in_data:
        lines.append(f"- Our data is **stand-in data** for {result.stand_in_data.strip()} "
                     "Absolute numbers are not comparable with the paper's; the direction of each effect is.")
    return "\n".join(lines)
