"""MoIL's three techniques (thesis Ch. 4) with real TensorFlow on a small MobileNetV2: GDM's
per-class sampling, LF's trainable variables and frozen batch normalisation, the frozen/head
split, and FMC training the head from a memory-mapped cache to the same weights as LF without it."""

import numpy as np
import pytest

from numerics import assert_close_float32, assert_same_update, keras_terms
from ondevice.models import mobilenet_v2 as mv
from ondevice.papers.moil.techniques import feature_cache as fc
from ondevice.papers.moil.techniques import gdm
from ondevice.papers.moil.techniques import layer_freezing as lf
from ondevice.tasks.classification import ClassificationTask
from ondevice.training.trainer import Trainer, seed_everything

SIZE, CLASSES, WIDTH = 32, 6, 0.35


def test_sample_global_takes_round_alpha_of_every_class():
    labels = np.repeat(np.arange(4), [10, 20, 5, 1])
    rng = np.random.default_rng(0)
    idx = gdm.sample_global(labels, 0.3, rng)
    counts = np.bincount(labels[idx], minlength=4)
    assert counts.tolist() == [3, 6, 2, 0]  # 1.5 rounds up, 0.3 down
    assert len(np.unique(idx)) == len(idx) and np.all(np.diff(idx) > 0)
    assert gdm.sample_global(labels, 0.0, rng).size == 0
    assert np.array_equal(gdm.sample_global(labels, 1.0, rng), np.arange(len(labels)))
    # uniform within a class: every member of class 1 gets drawn about equally often
    hits = np.zeros(20)
    for _ in range(2000):
        hits[gdm.sample_global(labels, 0.3, rng)[3:9] - 10] += 1
    assert hits.min() > 0.22 * 2000 and hits.max() < 0.38 * 2000
    with pytest.raises(ValueError, match="alpha"):
        gdm.sample_global(labels, 1.5, rng)


def test_sample_global_multi_hot_uses_first_positive_label():
    y = np.zeros((6, 5), np.float32)
    y[[0, 1, 2], 1] = 1
    y[[3, 4, 5], 3] = 1
    y[[0, 3], 4] = 1  # extra labels do not change the sampling class
    assert gdm.sampling_class(y).tolist() == [1, 1, 1, 3, 3, 3]
    idx = gdm.sample_global(y, 1 / 3, np.random.default_rng(1))
    assert sorted(gdm.sampling_class(y[idx])) == [1, 3]
    y[5] = 0
    with pytest.raises(ValueError, match="no positive label"):
        gdm.sample_global(y, 0.5, np.random.default_rng(1))


def test_mix_is_local_plus_the_sample():
    xl, yl = np.zeros((4, 2, 2, 1), np.float32), np.full(4, 7)
    xg = np.arange(40, dtype=np.float32).reshape(10, 2, 2, 1)
    yg = np.repeat([0, 1], 5)
    x, y = gdm.mix((xl, yl), (xg, yg), 0.4, np.random.default_rng(2))
    assert x.shape == (8, 2, 2, 1) and y.tolist()[:4] == [7] * 4
    assert sorted(y[4:].tolist()) == [0, 0, 1, 1]
    for xi, yi in zip(x[4:], y[4:]):  # each sampled input keeps its own label
        assert yg[int(xi[0, 0, 0]) // 4] == yi
    x0, y0 = gdm.mix((xl, yl), (xg, yg), 0.0, np.random.default_rng(2))
    assert len(x0) == 4 and np.array_equal(y0, yl)
    with pytest.raises(ValueError, match="differ in shape"):
        gdm.mix((xl, yl), (xg[:, :1], yg), 0.5, np.random.default_rng(2))


def _data(n=24, seed=0):
    rng = np.random.default_rng(seed)
    return rng.random((n, SIZE, SIZE, 1), np.float32), rng.integers(0, CLASSES, n).astype(np.int32)


def _model(seed=0):
    seed_everything(seed)
    return mv.build(SIZE, 1, CLASSES, WIDTH)


def test_units_count_the_architecture_rows():
    model = _model()
    found = mv.units(model)
    assert len(found) == 20
    assert [u[0].name for u in found][:3] == ["Conv1", "expanded_conv_depthwise", "block_1_expand"]
    assert [l.name for l in found[-1]] == ["predictions"]
    layers = [l for u in found for l in u]
    assert len(layers) == len(set(map(id, layers)))
    weighted = {id(l) for l in model.layers if l.weights}
    assert weighted == {id(l) for l in layers if l.weights}  # every weight belongs to a unit


@pytest.mark.parametrize("n", [1, 3])
def test_layer_freezing_trains_only_the_last_units_and_freezes_batch_norm(n):
    model = _model()
    task = ClassificationTask((SIZE, SIZE, 1), CLASSES)
    before = model.get_weights()
    names_before = {w.name: w.numpy() for w in model.weights}
    trainer = Trainer(model, task, 0.01, hooks=[lf.lf_hook(n, mv.units)])
    trained = {id(v) for v in trainer.variables_to_train}
    expected = {id(v) for u in mv.units(model)[-n:] for l in u for v in l.trainable_variables}
    assert trained == expected and trained
    x, y = _data()
    trainer.fit((x, y), 2, 8, np.random.default_rng(0))
    last = {w.name for u in mv.units(model)[-n:] for l in u for w in l.weights}
    changed = {w.name for w in model.weights if not np.array_equal(w.numpy(), names_before[w.name])}
    # frozen weights, including batch-norm moving statistics, are untouched; the head's change
    assert changed and changed <= last
    assert len(before) == len(model.get_weights())
    with pytest.raises(ValueError, match="n must lie in"):
        Trainer(_model(), task, 0.01, hooks=[lf.lf_hook(21, mv.units)])


def test_split_composes_to_the_model():
    model = _model()
    x, _ = _data(8)
    # two models over the same layers (the same kernels, usually bit-identical; another graph may sum in
    # another order): MobileNetV2's ~4,600 chained terms, a deep chain, so ~1e-4 of the logits (which are
    # ~1e-11 here: a bare atol would pass anything); a unit skipped or run twice changes them by ~100%
    for n in (1, 2, 4):
        frozen, head = lf.split(model, n, mv.units)
        assert_close_float32(head(frozen(x)).numpy(), model(x).numpy(), terms=keras_terms(model), deep=True)
        assert {id(w) for w in head.weights} <= {id(w) for w in model.weights}
    assert lf.split(model, 1, mv.units)[0].output_shape == (None, 1280)
    with pytest.raises(ValueError, match="no frozen part"):
        lf.split(model, 20, mv.units)


def test_feature_cache_training_equals_layer_freezing(tmp_path):
    """Algorithm 2: the head trained from cached features ends with the same weights and the
    same accuracy as LF(n) training through the frozen part, for the same seed."""
    x, y = _data(40)
    n, epochs, batch = 2, 2, 8
    task = ClassificationTask((SIZE, SIZE, 1), CLASSES)

    plain = _model(5)
    start = plain.get_weights()
    lf_trainer = Trainer(plain, task, 0.01, hooks=[lf.lf_hook(n, mv.units)])
    lf_hist = lf_trainer.fit((x, y), epochs, batch, np.random.default_rng(9))

    cached = _model(5)
    cached.set_weights(start)
    lf.freeze(cached, n, mv.units)
    frozen, head = lf.split(cached, n, mv.units)
    features = fc.build(frozen, x, tmp_path / "train.npy", batch_size=16)
    assert isinstance(features, np.memmap) and not list(tmp_path.glob(".*tmp"))
    head_task = ClassificationTask(features.shape[1:], CLASSES)
    fmc_trainer = Trainer(head, head_task, 0.01, hooks=[fc.CachedFeatures(features, y)])
    fmc_hist = fmc_trainer.fit(None, epochs, batch, np.random.default_rng(9))

    # features from the cache's compiled pass (batches of 16) vs the frozen part inside the training step
    # (batches of 8): MobileNetV2's chain in another graph, then the 6-class log-sum-exp, the batch's mean
    # of 8 and the epoch's of 5 steps. The trained weights' moves add each step's gradient sums over the
    # batch, over 10 steps (Adam: moves ~lr each, so another lr or sign changes them by ~100%); frozen
    # weights do not move in either path and must agree to 4 ulp.
    chain = keras_terms(cached)
    losses = [h["loss"] for h in fmc_hist]
    assert_close_float32(losses, [h["loss"] for h in lf_hist], terms=chain + 6 + batch + 5, deep=True)
    steps = epochs * len(x) // batch
    for a, b, s in zip(cached.get_weights(), plain.get_weights(), start):
        assert_same_update(a, b, s, terms=steps * (chain + batch))
    test_x, test_y = _data(16, seed=1)
    test_features = fc.build(frozen, test_x, tmp_path / "test.npy", batch_size=16)
    assert (
        task.evaluate(plain, (test_x, test_y))["accuracy"]
        == head_task.evaluate(head, (test_features, test_y))["accuracy"]
    )


def test_size_report_and_errors(tmp_path):
    features = np.zeros((3, 1280), np.float32)
    report = fc.size_report(features, 224 * 224 * 3 * 4)  # the thesis counts 4 bytes per pixel value
    assert report["cached_bytes_per_sample"] == 5120 and report["raw / cached"] == pytest.approx(117.6, abs=0.05)
    with pytest.raises(ValueError, match="labels"):
        fc.CachedFeatures(features, np.zeros(2))
