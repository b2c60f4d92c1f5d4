"""Where the LSTM's CloudTrain-over-AutLearn gap lies: in the on-device step or in the features.

AutLearn and CloudCustomize run the same on-device step (the last layer on the user's data, its
rate and epochs chosen on validation users); they differ only in the features under it: the public
model's (Sent140 alone) or CloudTrain's (every layer trained further on the users' pooled text).
When CloudCustomize is not below CloudTrain, the on-device step loses nothing, so AutLearn's gap is
the public model's features, and what those saw is a count of words in the data tables.
"""

from __future__ import annotations

from ondevice.report import claims
from ondevice.report.conclusion import effect_row, wide

CLAIM = "CloudTrain beats AutLearn (LSTM)"
SECTION = "Results per user"


def diagnoses(users, custom: str, cloud: str, data_table, rng, n_boot: int) -> dict[str, claims.Diagnosis]:
    """CLAIM -> a data diagnosis when the LSTM's CloudCustomize top-1 (method `custom` in the per-user
    table `users`) is not below CloudTrain's (`cloud`): the paired interval reaches zero or above;
    otherwise nothing (the row stays open)."""
    top1 = [wide(users, "top1", kind="text", method=m) for m in (custom, cloud)]
    row = effect_row({}, *top1, rng, n_boot, "mean")
    if row["ci high"] < 0:
        return {}
    words = dict(zip(data_table["data"], data_table["words"]))
    public = sum(n for name, n in words.items() if name.startswith("Sent140"))
    pooled = words["personal users: training part"]
    text = (
        f"the public model's features: CloudCustomize (CloudTrain's features, AutLearn's on-device step) vs "
        f"CloudTrain {row['our change']:+.1%} [{row['ci low']:+.1%}, {row['ci high']:+.1%}], so the step loses "
        f"nothing; AutLearn's features saw {public:,} public words (the mirror's Sent140 part), CloudTrain's "
        f"also the users' {pooled:,} pooled training words"
    )
    return {CLAIM: claims.Diagnosis(text, SECTION, claims.Kind.DATA)}
