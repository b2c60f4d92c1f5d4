"""The LSTM's AutLearn-gap diagnosis: data when CloudCustomize is not below CloudTrain, else open."""

import numpy as np
import pandas as pd

from ondevice.papers.autlearn import feature_gap, resolution
from ondevice.report import claims, curves, judge

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


# ---- MobileNet: AutLearn's frozen features against the input resolution (`resolution`) ----------


def image_users(cloud: float) -> pd.DataFrame:
    rows = [dict(kind="image", seed=s, user=f"w{u}", method="CloudTrain", top1=cloud) for s in (0, 1) for u in range(4)]
    return pd.DataFrame(rows + [dict(kind="image", seed=1, user="w0", method="CloudTrain", top1=0.0)])


def curve(top1: list[float], run_size: int = 64) -> pd.DataFrame:
    sizes = resolution.RESOLUTIONS
    table = pd.DataFrame(dict(image_size=sizes, users=4, autlearn_mean_top1=top1))
    return table.assign(run_size=table.image_size == run_size)


def test_the_resolution_row_reads_scale_when_the_largest_size_closes_half_the_gap_else_open():
    # CloudTrain 0.8 on the first seed (the second seed's other value is not read); AutLearn 0.5 at 64 px
    scale = resolution.diagnosis(curve([0.5, 0.6, 0.66]), image_users(0.8), "CloudTrain", 0)[resolution.CLAIM]
    assert scale.kind is claims.Kind.SCALE and "closes 53% of the gap" in scale.text and "224 px 0.660" in scale.text
    open_ = resolution.diagnosis(curve([0.5, 0.6, 0.64]), image_users(0.8), "CloudTrain", 0)[resolution.CLAIM]
    assert open_.kind is claims.Kind.OPEN and "closes 47% of the gap" in open_.text
    worse = resolution.diagnosis(curve([0.5, 0.45, 0.4]), image_users(0.8), "CloudTrain", 0)[resolution.CLAIM]
    assert worse.kind is claims.Kind.OPEN


def test_the_curve_stores_autlearns_change_against_cloudtrain_and_the_judge_reads_it_at_the_papers_size():
    table = resolution.against_cloud(curve([0.5, 0.6, 0.66]), image_users(0.8), "CloudTrain", 0)
    assert table.autlearn_over_cloudtrain.round(4).tolist() == [-0.375, -0.25, -0.175]
    sections = judge._claims("autlearn_accuracy", judge.PAPERS)
    (declared,) = curves.declared(sections, "autlearn_accuracy", resolution.CLAIM)
    holds, text = curves.link(declared, table.astype(str).to_dict("records"), ours=-0.375, paper=0.01)
    assert holds and "input size (pixels) (image_size 224): -17.5%" in text
    flat = resolution.against_cloud(curve([0.5, 0.5, 0.49]), image_users(0.8), "CloudTrain", 0)
    assert not curves.link(declared, flat.astype(str).to_dict("records"), ours=-0.375, paper=0.01)[0]
