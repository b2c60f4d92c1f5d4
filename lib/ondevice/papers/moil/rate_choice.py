"""The incremental learning rate, which the thesis does not give (its Adam 5e-4 is pre-training's),
chosen among candidate rates on held-out *local training* clips by a rule fixed before any run
(`RULE`: the lowest held-out loss, which does not saturate as the held-out AUC does), never on the
test sets (the user's validation clips, the global evaluation clips).

Each candidate trains the configuration the thesis's "converged on the local dataset" is said of
(Sec. 5.3.1, the alpha sweep): GDM(alpha) with every layer training, the first seed, for the
protocol's epochs, on D_M without the held-out clips (a per-class share of the user's training
clips). It is scored on the held-out clips after every epoch, so the curve shows whether it
converged. The protocol's runs then train on all of the user's training clips at the chosen rate.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ondevice.papers.moil.protocol import MoilParams, Personalizer

RULE = (
    "the candidate Adam rate whose GDM(alpha) model (every layer, the first seed, the protocol's epochs, "
    "trained without the held-out clips) has the lowest held-out local loss (the training objective, binary "
    "cross-entropy, mean over the held-out clips) after its last epoch; losses within 1e-12 tie, and a tie "
    "goes to the smaller rate (the thesis gives none)"
)
TIE = 1e-12  # held-out losses this close are equal: AUC saturates at 1.0 on few clips, a loss does not
AUC, LOSS, RATE = "held-out local AUC", "held-out local loss", "Adam rate"
HELD_OUT = "holdout"  # the evaluation set's name in a run's scores: its AUC is holdout_auc, its loss holdout_loss


def rate_text(x: float) -> str:
    """An Adam rate as people write it: 5e-4, 1.5e-4."""
    mantissa, exponent = f"{x:.3e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def choose(table: pd.DataFrame) -> float:
    """`RULE` on one row per candidate (columns RATE, AUC, LOSS, after the last epoch): the chosen rate.
    AUC is shown beside the loss but does not decide (it tied at 1.0 on the held-out clips). Missing
    columns, no candidates, repeated or non-positive rates and non-finite scores are errors."""
    missing = [c for c in (RATE, AUC, LOSS) if c not in table.columns]
    if missing:
        raise ValueError(f"the rate choice needs the columns {missing}")
    if table.empty:
        raise ValueError("the rate choice has no candidate rates")
    rates = table[RATE].astype(float)
    if rates.duplicated().any() or not (rates > 0).all():
        raise ValueError(f"candidate rates must be distinct and positive, got {list(rates)}")
    values = table[[AUC, LOSS]].to_numpy(float)
    if not np.isfinite(values).all():
        raise ValueError(f"held-out scores must be finite, got {table[[RATE, AUC, LOSS]].to_dict('records')}")
    losses = table[LOSS].astype(float)
    return float(rates[losses <= losses.min() + TIE].min())


@dataclass
class Choice:
    """The chosen rate, the candidates' held-out scores after the last epoch and per epoch, and the
    parameters with the chosen rate (what every later stage runs with)."""

    rate: float
    table: pd.DataFrame  # per candidate: RATE, AUC, LOSS, chosen
    history: pd.DataFrame  # per candidate and epoch (0: pre-trained): held-out AUC and loss, training loss
    params: MoilParams
    clips: dict[str, int]  # held-out and training clips of the choice

    def plot(self):
        """Held-out local AUC and loss per epoch, one curve per candidate rate (the convergence curve)."""
        import matplotlib.pyplot as plt
        import seaborn as sns
        from matplotlib.ticker import MaxNLocator

        h = self.history.assign(rate=lambda d: d[RATE].map(rate_text))
        order = [rate_text(r) for r in sorted(self.table[RATE], reverse=True)]
        fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
        for ax, column in zip(axes, (AUC, LOSS)):
            sns.lineplot(data=h, x="epoch", y=column, hue="rate", hue_order=order, marker="o", ax=ax)
            ax.set(title=column + " per epoch", ylabel=column)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.legend(title="Adam rate", fontsize=8, frameon=False)
        fig.suptitle(f"The rate choice on held-out local training clips: Adam {rate_text(self.rate)} chosen")
        sns.despine(fig)
        fig.tight_layout()
        return fig


def select(
    params: MoilParams, personalizer: Callable[[MoilParams], Personalizer], clips: dict[str, int], log=print
) -> Choice:
    """Train GDM(params.alpha), every layer, at each of `params.learning_rates` through
    `personalizer(params with that rate)`, whose runs are scored on the held-out clips alone (as
    HELD_OUT: per-class AUCs and per-clip losses), and choose by `RULE`."""
    rows, curves = [], []
    for rate in params.learning_rates:
        say = lambda line, r=rate: log(f"rate choice, Adam {rate_text(r)}: {line}")  # noqa: E731
        run = personalizer(dataclasses.replace(params, learning_rate=rate)).run(params.alpha, None, params.seed, say)
        for h in run.history:
            curves.append(
                {
                    RATE: rate,
                    "epoch": h["epoch"],
                    AUC: h[f"{HELD_OUT}_auc"],
                    LOSS: h[f"{HELD_OUT}_loss"],
                    "loss": h["loss"],
                }
            )
        rows.append({k: curves[-1][k] for k in (RATE, AUC, LOSS)})
    table = pd.DataFrame(rows)
    rate = choose(table)
    table["chosen"] = table[RATE] == rate
    log(f"rate choice: Adam {rate_text(rate)} ({RULE})")
    return Choice(rate, table, pd.DataFrame(curves), dataclasses.replace(params, learning_rate=rate), clips)
