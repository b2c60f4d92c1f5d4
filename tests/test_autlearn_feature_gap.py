"""The LSTM's AutLearn-gap diagnosis: data when CloudCustomize is not below CloudTrain, else open."""

import numpy as np
import pandas as pd

from ondevice.papers.autlearn import feature_gap
from ondevice.report import claims

DATA = pd.DataFrame(
    {
        "data": [
            "Sent140 (public): pre-training",
            "Sent140 (public): held out for the plateau",
            "personal users: training part",
        ],
        "words": [900, 100, 5000],
    }
)


def users(custom_shift: float) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    base = rng.uniform(0.1, 0.3, size=(2, 30))
    rows = []
    for seed in range(2):
        for u in range(30):
            rows.append(dict(kind="text", seed=seed, user=f"u{u}", method="CloudTrain", top1=base[seed, u]))
            rows.append(
                dict(kind="text", seed=seed, user=f"u{u}", method="CloudCustomize", top1=base[seed, u] + custom_shift)
            )
    return pd.DataFrame(rows)


def test_tie_gives_a_data_diagnosis_with_the_public_word_count():
    out = feature_gap.diagnoses(users(0.001), "CloudCustomize", "CloudTrain", DATA, np.random.default_rng(1), 200)
    d = out[feature_gap.CLAIM]
    assert d.kind is claims.Kind.DATA
    assert "1,000 public words" in d.text and "5,000 pooled" in d.text


def test_customize_clearly_below_cloud_leaves_the_row_open():
    out = feature_gap.diagnoses(users(-0.05), "CloudCustomize", "CloudTrain", DATA, np.random.default_rng(1), 200)
    assert out == {}
