"""Rate cuts at a plateau (`training.rate_cuts`): every phase from the lowest loss so far at a
fifth of the last rate, one curve counted on across phases; and AutLearn's MobileNet baselines with them."""

import numpy as np
import pytest
import tf_keras as keras

from ondevice.papers.autlearn import cloud_baselines, common
from ondevice.papers.autlearn.experiments import autlearn_accuracy as exp
from ondevice.training.rate_cuts import RateCuts, with_cuts


class _Model:
    """Weights are one number; a phase's curve is scripted."""

    def __init__(self):
        self.w = [np.array(0.0)]

    def get_weights(self):
        return [self.w[0].copy()]

    def set_weights(self, w):
        self.w = [np.array(w[0])]


def test_each_phase_starts_from_the_lowest_loss_so_far_at_a_fifth_of_the_rate():
    model, seen = _Model(), []
    losses = {0: [5.0, 3.0, 2.0, 2.5], 1: [1.5, 1.8], 2: [1.9, 2.2]}  # phase 2 finds nothing lower

    def phase(k, rate):
        seen.append((k, rate, float(model.w[0])))
        points = []
        for step, loss in enumerate(losses[k], start=0 if k == 0 else 1):
            points.append(dict(step=step, holdout_loss=loss, examples_seen=10 * step, epochs_seen=step / 2))
        kept = min(points, key=lambda p: p["holdout_loss"])
        model.set_weights([np.array(100.0 * k + kept["step"])])  # the phase leaves its kept weights
        return [p | dict(kept=p is kept, ended_by="plateau", cap=9) for p in points]

    curve = with_cuts(RateCuts(cuts=2), 1.0, phase, model)
    assert [(k, pytest.approx(r)) for k, r, _ in seen] == [(0, 1.0), (1, 0.2), (2, 0.04)]
    assert [start for *_, start in seen] == [0.0, 2.0, 101.0]  # phase 0's epoch 2, then phase 1's step 1
    assert [p["step"] for p in curve] == [0, 1, 2, 3, 4, 5, 6, 7]  # counted on across phases
    assert [p["examples_seen"] for p in curve] == [0, 10, 20, 30, 40, 50, 60, 70]
    assert [p["kept"] for p in curve] == [False] * 4 + [True] + [False] * 3
    assert curve[4]["phase"] == 1 and curve[4]["phase_step"] == 1 and curve[4]["learning_rate"] == pytest.approx(0.2)
    assert float(model.w[0]) == 101.0  # the overall lowest's weights are left in the model


def test_no_cuts_is_the_constant_rate_run_and_bad_rules_are_refused():
    model = _Model()
    points = [dict(step=0, holdout_loss=2.0, kept=False), dict(step=1, holdout_loss=1.0, kept=True)]
    curve = with_cuts(RateCuts(0), 0.5, lambda k, r: points, model)
    assert [p["holdout_loss"] for p in curve] == [2.0, 1.0] and curve[1]["kept"] and curve[1]["learning_rate"] == 0.5
    with pytest.raises(ValueError, match="cuts"):
        RateCuts(-1)
    with pytest.raises(ValueError, match="factor"):
        RateCuts(1, factor=1.5)


def test_cloudtrain_with_a_cut_goes_on_at_a_fifth_of_its_rate_and_is_stored_apart(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("ONDEVICE_MODEL_CACHE", str(tmp_path))
    rng = np.random.default_rng(0)
    images = lambda n: (rng.random((n, 28, 28, 1)).astype(np.float32), rng.integers(0, 62, n).astype(np.int32))  # noqa: E731
    pooled, validation = images(48), common.Validation(("v",), {"v": images(8)}, {"v": images(4)})
    holdout = cloud_baselines.holdout_loss("image", validation)
    init = keras.initializers.GlorotUniform(seed=0)
    model = keras.Sequential(
        [keras.Input((28, 28, 1)), keras.layers.Flatten(), keras.layers.Dense(62, kernel_initializer=init)]
    )
    start = model.get_weights()
    params = exp.Params.for_scale("smoke", image_rate_cuts=1, image_cloud_epochs=4)
    curve = cloud_baselines.cloud_train(params, "image", model, start, pooled, holdout, 0, print)
    phases = sorted({p["phase"] for p in curve})
    assert phases == [0, 1] and [p["step"] for p in curve] == list(range(len(curve)))
    rates = {p["phase"]: p["learning_rate"] for p in curve}
    assert rates[1] == pytest.approx(params.image_cloud_learning_rate * 0.2)
    kept = [p for p in curve if p["kept"]]
    assert len(kept) == 1 and kept[0]["holdout_loss"] == min(p["holdout_loss"] for p in curve[1:])  # not the start
    assert np.isclose(holdout(model)["holdout_loss"], kept[0]["holdout_loss"], rtol=1e-5)  # its weights are left
    model.set_weights(start)
    no_cut = exp.Params.for_scale("smoke", image_rate_cuts=0, image_cloud_epochs=4)
    plain = cloud_baselines.cloud_train(no_cut, "image", model, start, pooled, holdout, 0, print)
    assert {p["phase"] for p in plain} == {0} and "reusing" not in capsys.readouterr().out  # a run of its own
    assert [p["holdout_loss"] for p in plain] == [p["holdout_loss"] for p in curve if p["phase"] == 0]
