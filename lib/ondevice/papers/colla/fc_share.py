"""How much of a prediction's FLOPs Customization can trim (issue 70): the FC over every place,
whose share the places set (the FC's width) and the history sets too (the LSTM runs once per
step, the FC once), so the FLOP claim is diagnosed over both."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd

from ondevice.models import mrnn
from ondevice.papers.colla.common import CollaParams
from ondevice.report import claims

HISTORIES = range(1, 13)
# The paper fixes no history: "In training, we split a sequence which has n elements into n - 1
# training sequences. For instance, [id 1, id 2, id 3] would be split into [id 1]->[id 2] and
# [id 1, id 2]->[id 3]" (every prefix), of sequences of 10-minute windows up to a day long.
PAPER_CHANGE = 1.0  # "nearly halved": Same's FLOPs twice Customization's
SECTION = "The FC's share of a prediction against history length"
CHANGE = "change (Same over Customization)"


def curve(params: CollaParams, places: int, costs: pd.DataFrame) -> pd.DataFrame:
    """Per history length: the FC's share of a Same prediction's FLOPs and the claim's change
    (Same's FLOPs over Customization's, less 1) at the median places a device holds in its last
    cycle; the change of medians is this, the FLOPs being linear in the places."""
    held = float(costs[costs.cycle == costs.cycle.max()].places_held.median())
    rows = []
    for h in sorted({*HISTORIES, params.history}):
        same = replace(params.device_config(places, customised=False), history=h)
        full = mrnn.inference_flops(same)
        rows.append(
            {
                "history": h,
                "ours": h == params.history,
                "places": places,
                "median places held": held,
                "fc share of Same": 1 - mrnn.inference_flops(same, 0) / full,
                CHANGE: full / mrnn.inference_flops(same, held) - 1,
            }
        )
    return pd.DataFrame(rows)


def reaching(table: pd.DataFrame) -> int | None:
    """The longest history at which the median device's change reaches the paper's (it falls with
    history, so every shorter one reaches it too), or None."""
    hits = table[table[CHANGE] >= PAPER_CHANGE - 1e-12].history
    return int(hits.max()) if len(hits) else None


def diagnosis(table: pd.DataFrame) -> claims.Diagnosis:
    """Both causes, from the table. The paper leaves its history open, so the rule: READ_TWO_WAYS
    when some history in the table reaches the paper's change (which reading of the history is taken
    decides it); DATA when none does (the places alone keep ours from the paper's)."""
    ours = table[table.ours].iloc[0]
    first, last, k = table.iloc[0], table.iloc[-1], reaching(table)
    text = (
        f"places held: the FC over all {ours.places} places is {ours['fc share of Same']:.0%} of a Same prediction's"
        f" FLOPs at our {ours.history} steps and a device holds a median {ours['median places held']:g} in its last"
        f" cycle, {ours[CHANGE]:+.1%}; history: the FC's share is {first['fc share of Same']:.0%} at"
        f" {first.history} step and {last['fc share of Same']:.0%} at {last.history} (change {first[CHANGE]:+.1%}"
        f" to {last[CHANGE]:+.1%}); "
    )
    text += "the paper does not state its history length (every prefix of a day's sequence); "
    reach = f"at no history in {first.history}..{last.history}" if not k else f"at {k} step(s) or fewer"
    text += f"the paper's {PAPER_CHANGE:+.0%} is reached {reach} (fc_share.csv)"
    return claims.Diagnosis(text, SECTION, claims.Kind.READ_TWO_WAYS if k else claims.Kind.DATA)
