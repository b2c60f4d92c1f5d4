"""AutLearn A5/A6: structured pruning, its stop rule, FLOP and parameter counts, and the compiler
paths (TensorFlow, XLA, TFLite) agreeing on the loss of the same step. Real TensorFlow throughout."""

import numpy as np
import pandas as pd
import pytest
import tf_keras as keras

from numerics import assert_close_float32, lstm_terms
from ondevice.models import lstm_lm, mobilenet_v1
from ondevice.papers.autlearn.techniques import magnitude_pruning, pruning


def small_lstm(seed=0):
    return lstm_lm.build(lstm_lm.LSTMConfig(40, 30, 8, 12, 2), seed=seed)


def small_cnn():
    x = inputs = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(6, 3, padding="same", name="conv")(x)
    x = keras.layers.ReLU(name="relu")(x)
    x = keras.layers.DepthwiseConv2D(3, use_bias=False, name="dw")(x)
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    x = keras.layers.Dense(5, name="fc")(x)
    out = keras.layers.Dense(4, name="head")(x)
    model = keras.Model(inputs, out)
    rng = np.random.default_rng(1)
    model.set_weights([rng.normal(size=w.shape).astype(np.float32) for w in model.get_weights()])
    return model


def tokens(n=3, length=7, vocab=40):
    return np.random.default_rng(0).integers(1, vocab, (n, length)).astype(np.int32)


def zeroed_copy(model, layer, units):
    twin = keras.models.clone_model(model)
    twin.set_weights(model.get_weights())
    pruning.zero_units(twin, layer, units)
    return twin


@pytest.mark.parametrize("layer", ["embedding", "lstm_1", "lstm_2"])
def test_pruning_removes_the_lowest_norm_units_and_matches_zeroing_them(layer):
    model = small_lstm()
    norms = pruning.unit_norms(model.get_layer(layer))
    removed = pruning.lowest_units(model.get_layer(layer), 4)
    kept = np.setdiff1d(np.arange(len(norms)), removed)
    assert len(removed) == 4 and norms[removed].max() <= norms[kept].min()
    pruned = pruning.prune(model, layer, removed)
    assert pruning.width(pruned.get_layer(layer)) == pruning.width(model.get_layer(layer)) - 4
    assert pruning.parameters(pruned) < pruning.parameters(model)
    x = tokens()
    # narrower layers vs zeroed units: other shapes, so other summation orders of the same nonzero terms (the
    # 2 LSTM layers' gate sums over 7 steps, then 12 + 1); zeroing the wrong units changes the logits by ~100%
    zeroed = zeroed_copy(model, layer, removed)(x).numpy()
    assert_close_float32(pruned(x).numpy(), zeroed, terms=lstm_terms(x.shape[1], 8, 12) + 13)
    assert not np.allclose(pruned(x).numpy(), model(x).numpy(), atol=1e-4)  # it did change the model


def test_pruning_a_convolution_shrinks_the_depthwise_layer_and_the_consumer():
    model = small_cnn()
    removed = pruning.lowest_units(model.get_layer("conv"), 2)
    pruned = pruning.prune(model, "conv", removed)
    assert pruned.get_layer("dw").depthwise_kernel.shape[2] == 4 and pruned.get_layer("fc").kernel.shape[0] == 4
    x = np.random.default_rng(2).normal(size=(2, 8, 8, 3)).astype(np.float32)
    # as above: the 3x3x3 convolution (27 + 1 terms), the depthwise 3x3 (9), the 6 x 6 pooling, then 6 + 1 and
    # 5 + 1 terms, each layer in other shapes
    zeroed = zeroed_copy(model, "conv", removed)(x).numpy()
    assert_close_float32(pruned(x).numpy(), zeroed, terms=28 + 9 + 36 + 7 + 6)
    assert pruning.candidates(model) == ["conv", "fc"]  # the output layer never loses units
    with pytest.raises(ValueError, match="output"):
        pruning.prune(model, "head", [0])


def test_flop_and_parameter_counts_of_a_known_model():
    model = small_cnn()
    # conv 3x3x3->6 on 8x8 (same); depthwise 3x3 on 6 channels -> 6x6; fc 6->5; head 5->4
    assert pruning.forward_flops(model) == 2 * 8 * 8 * 9 * 3 * 6 + 2 * 6 * 6 * 9 * 6 + 2 * 6 * 5 + 2 * 5 * 4
    assert pruning.parameters(model) == (81 * 2 + 6) + 54 + (30 + 5) + (20 + 4)
    lstm = small_lstm()  # per position: two LSTMs (8->12, 12->12) and the softmax 12->30
    assert pruning.forward_flops(lstm) == 2 * 4 * 12 * (8 + 12) + 2 * 4 * 12 * 24 + 2 * 12 * 30
    assert pruning.last_layer_train_flops(lstm, "softmax", 10) == 10 * (
        pruning.forward_flops(lstm) + 2 * 12 * 30
    ) + 12 * (12 * 30 + 30)


@pytest.mark.parametrize("layer", ["embedding", "lstm_1", "lstm_2"])
def test_flops_saved_is_what_the_pruned_model_no_longer_counts(layer):
    model = small_lstm()
    for k in (1, 3, 7):
        pruned = pruning.prune(model, layer, pruning.lowest_units(model.get_layer(layer), k))
        saved = pruning.forward_flops(model) - pruning.forward_flops(pruned)
        assert pruning.flops_saved(model, layer, k) == pytest.approx(saved, rel=1e-12)
    cnn = small_cnn()
    for layer_ in ("conv", "fc"):
        pruned = pruning.prune(cnn, layer_, [0, 1])
        saved = pruning.forward_flops(cnn) - pruning.forward_flops(pruned)
        assert pruning.flops_saved(cnn, layer_, 2) == pytest.approx(saved, rel=1e-12)
    # lstm_2 feeds the softmax (12 x 30): one unit saves 2 x 30 there and 2 x 4 x (8 + 12 + 12 - 1) + ... in the LSTMs
    need = pruning.flops_saved(model, "lstm_2", 3)
    assert pruning.units_for(model, "lstm_2", need) == 3 and pruning.units_for(model, "lstm_2", need + 1) == 4
    assert pruning.units_for(model, "embedding", pruning.forward_flops(model)) == 0  # it cannot save that much
    one = min(pruning.flops_saved(model, n, 1) for n in ("embedding", "lstm_2"))
    assert pruning.reachable(model, ["embedding", "lstm_2"], pruning.forward_flops(model)) >= one
    assert pruning.reachable(model, ["embedding", "lstm_2"], 0.5 * one) == one
    assert pruning.reachable(pruning.prune(model, "lstm_2", range(11)), ["lstm_2"], 1.0) is None


def test_flops_saved_counts_each_layer_of_an_inlined_mobilenet_once():
    mobilenet = pruning.flatten(mobilenet_v1.build(None, 0.25, 32, 62))  # its backbone's layers are called twice
    for layer in ("conv1", "conv_pw_7", "conv_pw_13"):
        pruned = pruning.prune(mobilenet, layer, [0, 1, 2])
        saved = pruning.forward_flops(mobilenet) - pruning.forward_flops(pruned)
        assert pruning.flops_saved(mobilenet, layer, 3) == pytest.approx(saved, rel=1e-12)


def toy_mlp_cloud():
    """A 16-unit ReLU layer trained to tell points inside a circle from those outside (fewer units
    draw a coarser boundary), and a `retraining.Cloud` that re-trains by real Adam epochs on the
    training points and scores on a judged and a selection part."""
    from ondevice.papers.autlearn.retraining import Cloud
    from ondevice.tasks.classification import ClassificationTask
    from ondevice.training.trainer import Trainer

    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, size=(1200, 2)).astype(np.float32)
    y = ((x**2).sum(1) < 0.5).astype(np.int64)
    init = lambda s: keras.initializers.GlorotUniform(seed=s)
    inputs = keras.Input((2,))
    hidden = keras.layers.Dense(16, activation="relu", name="hidden", kernel_initializer=init(1))(inputs)
    model = keras.Model(inputs, keras.layers.Dense(2, name="out", kernel_initializer=init(2))(hidden))
    task, train = ClassificationTask((2,), 2), (x[:600], y[:600])
    Trainer(model, task, 0.03, "adam").fit(train, 60, 32, np.random.default_rng(1))
    epochs = []

    def fit(m, rate, tag=""):
        epochs.append(tag)
        Trainer(m, task, rate, "adam").fit(train, 1, 32, np.random.default_rng(len(tag)))

    top1 = lambda m, part: float((m(x[part]).numpy().argmax(-1) == y[part]).mean())
    judged, selection = slice(600, 900), slice(900, 1200)
    return model, Cloud(lambda m: top1(m, judged), lambda m: (top1(m, judged), top1(m, selection)), fit), epochs


def test_pruning_search_retrains_every_round_and_goes_on_while_the_budget_allows():
    from ondevice.papers.autlearn import retraining

    model, cloud, epochs = toy_mlp_cloud()
    base = cloud.evaluate(model)
    assert base > 0.9
    retrained = []

    def retrain(m, done):
        retrained.append(done)
        return retraining.to_plateau(m, cloud, 0.01, done, max_epochs=3)

    # no budget to speak of: the rounds go on, with no round cap, until the layer cannot lose a unit: a step
    # of 12.8 of the 128 FLOPs takes 2 units of 16 (8 FLOPs each), 16 -> 14 -> ... -> 2; then the step no
    # layer can save shrinks to one unit's 8 FLOPs: 2 -> 1
    best, rounds = pruning.search(model, cloud.scores, retrain, step=0.1, max_drop=1.0, log=lambda *_: None)
    assert [r.width_after for r in rounds] == [*range(14, 1, -2), 1] and all(r.within_budget for r in rounds)
    assert len(retrained) == len(rounds) == 8 and pruning.width(best.get_layer("hidden")) == 1
    assert retrained == [0, *(r.epochs_total for r in rounds[:-1])]  # each round re-trains on from the last
    assert [r.work_removed for r in rounds] == pytest.approx([i / 8 for i in range(1, 8)] + [15 / 16])
    assert epochs[: rounds[0].epochs] == [retraining.epoch_tag(e) for e in range(1, rounds[0].epochs + 1)]


def test_pruning_search_does_not_keep_a_round_over_the_budget():
    from ondevice.papers.autlearn import retraining

    model, cloud, _ = toy_mlp_cloud()
    base = cloud.evaluate(model)
    control = retraining.EpochControl(model, cloud, 0.01, base, 0.01, log=lambda *_: None)
    retrain = lambda m, done: retraining.to_plateau(m, cloud, 0.01, done, max_epochs=3)
    best, rounds = pruning.search(
        model, cloud.scores, retrain, step=0.1, max_drop=0.01, reference=control.reference, log=lambda *_: None
    )
    kept, last = [r for r in rounds if r.within_budget], rounds[-1]
    assert not last.within_budget and last.width_after >= 2  # the budget, not the layer's width, ended it
    assert pruning.width(best.get_layer("hidden")) == (kept[-1].width_after if kept else 16)
    assert all(r.val_accuracy >= r.budget_from - 0.01 for r in kept)
    assert last.val_accuracy < last.budget_from - 0.01
    # judged from the uncompressed model re-trained as many epochs (the control), never below the model itself
    assert all(r.budget_from == max(base, control.top1[r.epochs_total]) for r in rounds)
    assert [c.epochs for c in control.checks()] == list(range(1, len(control.top1)))
    if kept:
        assert cloud.evaluate(best) == kept[-1].val_accuracy  # the kept model, not the one that broke the budget


def test_retraining_to_a_plateau_keeps_the_best_epoch():
    from ondevice.papers.autlearn.retraining import Cloud, to_plateau

    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, kernel_initializer="zeros")])
    selection = {0.0: 0.5, 1.0: 0.6, 2.0: 0.7, 3.0: 0.65, 4.0: 0.69, 5.0: 0.9}  # by the epochs re-trained

    def step(m, rate, tag):
        m.set_weights([m.get_weights()[0] + 1, m.get_weights()[1]])

    cloud = Cloud(None, lambda m: (0.0, selection[float(m.get_weights()[0][0, 0])]), step)
    assert to_plateau(model, cloud, 0.1, 0, max_epochs=5, patience=2) == 2  # epochs 3, 4 lower: stop
    assert model.get_weights()[0][0, 0] == 2.0
    model.set_weights([np.zeros((1, 1), np.float32), np.zeros(1, np.float32)])
    assert to_plateau(model, cloud, 0.1, 0, max_epochs=5, patience=3) == 5 and model.get_weights()[0][0, 0] == 5.0
    model.set_weights([np.zeros((1, 1), np.float32), np.zeros(1, np.float32)])
    assert to_plateau(model, cloud, 0.1, 0, max_epochs=1) == 1


def test_adapting_the_uncompressed_model_trains_it_to_the_best_plateau_of_its_rates():
    """A model trained on other data (as MobileNet's ImageNet filters for FEMNIST): `adapt` trains a
    copy to the plateau at every rate with its own draws (never a pruning epoch's) and keeps the rate
    whose plateau scores best, not the one whose first epoch does; its curves start at the public
    model's score."""
    from ondevice.papers.autlearn import retraining

    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, kernel_initializer="zeros")])
    tags = []
    gain = {0.01: 1.0, 0.1: 2.0}  # how far one epoch moves the weight towards the cloud's data
    peak = 5.0  # beyond it the selection score falls

    def step(m, rate, tag):
        tags.append(tag)
        m.set_weights([m.get_weights()[0] + gain[rate], m.get_weights()[1]])

    def score(m):
        w = float(m.get_weights()[0][0, 0])
        return w / 10, 0.5 + min(w, peak) / 10 - max(w - peak, 0) / 5

    cloud = retraining.Cloud(lambda m: score(m)[0], score, step)
    adapted = retraining.adapt(model, cloud, [0.1, 0.01], max_epochs=10, patience=2, log=lambda *_: None)
    # 0.1 leads after one epoch (0.7 vs 0.6) but its plateau is 0.9 (epoch 2); 0.01 reaches 1.0 (epoch 5)
    assert adapted.rate == 0.01 and adapted.epochs == 5 and float(model.get_weights()[0][0, 0]) == 5.0
    assert [(rate, kept) for rate, kept, _ in adapted.curves] == [(0.01, 5), (0.1, 2)]
    assert all(curve[0][1] == 0.0 for _, _, curve in adapted.curves)
    assert set(tags) == {retraining.adapt_tag(e) for e in range(1, 8)}
    rows = pd.DataFrame(adapted.rows("toy"))
    assert rows.kept.sum() == 1 and rows[rows.kept].epoch.item() == 5 and rows.plateau_epoch.sum() == 2


def test_magnitude_pruning_zeroes_weights_but_keeps_shapes():
    model = small_lstm()
    sparse = magnitude_pruning.prune(model, 0.5)
    assert [w.shape for w in sparse.weights] == [w.shape for w in model.weights]
    kernel, original = sparse.get_layer("softmax").kernel.numpy(), model.get_layer("softmax").kernel.numpy()
    assert abs((kernel == 0).mean() - 0.5) < 0.02
    assert np.abs(original[kernel == 0]).max() <= np.abs(original[kernel != 0]).min()
    assert magnitude_pruning.nonzero_parameters(sparse) < 0.6 * magnitude_pruning.nonzero_parameters(model)


@pytest.mark.slow(reason="the same steps through every compiler path, TFLite conversions included")
def test_compiler_paths_give_the_same_loss_for_the_same_steps():
    from ondevice.papers.autlearn import step_timing
    from ondevice.papers.autlearn.experiments import autlearn_cost as exp

    params = exp.Params.for_scale("smoke", 0)
    start = small_lstm(seed=3).get_weights()
    x = tokens(4, 6, 40)
    y = np.random.default_rng(5).integers(1, 30, x.shape).astype(np.int32)
    losses = {}
    for path in exp.PATHS:
        model = small_lstm(seed=3)
        model.set_weights(start)
        step = step_timing.step_function(params, "text", path, model, "softmax")
        losses[path] = [step(x, y), step(x, y)]  # the second loss shows the first update agreed too
    assert losses["tensorflow"][1] < losses["tensorflow"][0]
    # other compilers' kernels: a loss sums the 2 LSTM layers' gate terms over the 6 steps, the softmax's 12 + 1,
    # the 30-word log-sum-exp and the mean over the 24 positions (the first step's rounding moves the weights
    # by lr x that relative error of the gradient: negligible on the second loss, which the step lowered by
    # ~0.04, 250x the tolerance)
    terms = lstm_terms(x.shape[1], 8, 12) + 13 + 30 + x.size
    for path in ("xla", "tflite"):
        assert_close_float32(losses[path], losses["tensorflow"], terms=terms)


def test_bad_parameters_name_the_parameter():
    from ondevice.papers.autlearn.experiments import autlearn_cost as exp
    from ondevice.params import ParameterError

    with pytest.raises(ParameterError, match="governors"):
        exp.Params.for_scale("smoke", 0, governors=["powersave"])
    with pytest.raises(ParameterError, match="time_source"):
        exp.Params.for_scale("smoke", 0, time_source="guessed")


def test_counted_work_beside_time_reads_each_claims_flops():
    """Hand-made counts: structured pruning halves the LSTM epoch's FLOPs (+100% if time followed),
    the cache removes 90% of an update's; the energy row reads the LSTM's pruned epoch."""
    from ondevice.papers.autlearn import report
    from ondevice.papers.autlearn.experiments import autlearn_cost as exp

    users = ["a", "b", "c"]
    epoch_flops = {"uncompressed": 10.0, "structured pruning": 5.0, "SVD": 8.0, "magnitude pruning": 10.0}
    epochs = [
        {"model": "LSTM", "batch": 16, "user": u, "method": m, "gflops": f}
        for u in users
        for m, f in epoch_flops.items()
    ]
    epochs += [
        {"model": "MobileNet", "batch": b, "user": u, "method": m, "gflops": 4.0 if m == "uncompressed" else 3.0}
        for b in (1, 16)
        for u in users
        for m in ("uncompressed", "structured pruning")
    ]
    online = [
        {"model": m, "user": u, "condition": c, "gflops": 10.0 if c == "without cache" else 1.0}
        for m in ("LSTM", "MobileNet")
        for u in users
        for c in exp.costs.CACHE
    ]
    flops = report.flop_quantities(pd.DataFrame(epochs).assign(epoch_seconds=0.0), pd.DataFrame(online))
    table = report.flops_beside_time(exp.PAPER, flops).set_index("effect")
    pruned = table.loc["structured pruning shortens the LSTM's epoch"]
    assert pruned["FLOP change"] == pytest.approx(1.0) and pruned["work removed"] == pytest.approx(0.5)
    assert pruned[report.NEEDED] == pytest.approx(1 - 1 / (1 + pruned["paper change"]))
    assert "magnitude pruning shortens the LSTM's epoch" not in table.index  # our ablation: no paper number
    assert table.loc["the inference cache shortens online updates (MobileNet)", "work removed"] == pytest.approx(0.9)
    energy = table.loc["optimisations lower the LSTM's training energy (performance governor)"]
    assert energy["FLOP change"] == pytest.approx(1.0)
    assert report.flop_diagnosis(pruned).startswith("counted FLOPs: the technique removes 50% of the work (+100% if")


def test_time_steps_takes_the_median_pass_so_one_disturbed_pass_does_not_count():
    import time as _time

    from ondevice.papers.autlearn import step_timing

    calls = []

    def step(x, y):  # the third timed pass (calls 6-7 after 2 warm-up calls) is slow
        calls.append(x)
        _time.sleep(0.05 if 6 <= len(calls) <= 7 else 0.001)

    batches = [(np.zeros((2, 3)), None), (np.zeros((2, 3)), None)]
    per_step, timed = step_timing.time_steps(step, batches, timing_steps=2, warmup_steps=2, repeats=5)
    assert len(calls) == 2 + 5 * 2 and timed == 2  # one shape warmed up twice, then 5 passes of 2 steps
    assert per_step < 0.02  # the slow pass (0.05 s per step) is not the median


def test_interleaved_passes_keep_the_ratio_when_the_machine_slows_down_for_a_while(monkeypatch):
    """Two steps, one with twice the other's work, on a clock that runs 4x slower after the first two
    repeats. Timed one after the other, the slow half would fall on the second step alone (ratio 0.5);
    interleaved, each step has two fast and two slow passes and the ratio stays 2."""
    from ondevice.papers.autlearn import step_timing

    clock, calls = [0.0], []

    def make(name, cost):
        def step(x, y):
            calls.append(name)
            clock[0] += cost * (4.0 if len(calls) > 6 else 1.0)  # 2 warm-up calls and 2 repeats, then slower

        return step

    monkeypatch.setattr(step_timing.time, "perf_counter", lambda: clock[0])
    steps = {"big": make("big", 2.0), "small": make("small", 1.0)}
    timed = step_timing.time_interleaved(steps, [(np.zeros(2), None)], timing_steps=1, warmup_steps=1, repeats=4)
    assert calls == ["big", "small"] + ["big", "small", "small", "big"] * 2
    assert timed["big"][0] / timed["small"][0] == pytest.approx(2.0) and timed["big"][1] == 1


def test_svd_rank_search_retrains_until_inside_the_budget_and_keeps_the_smallest_rank():
    from ondevice.papers.autlearn.techniques import svd_rank

    base = small_lstm()
    # rank 8: outside after 1 epoch, inside after 2; rank 4: inside after 1; rank 2: outside after all 3
    script = iter([0.48, 0.495, 0.492, 0.45, 0.46, 0.47])
    tags = []
    choice, trials = svd_rank.search(
        base,
        [2, 8, 4],
        lambda m: next(script),
        lambda m, tag: tags.append(tag),
        0.5,
        max_drop=0.01,
        max_epochs=3,
        log=lambda *_: None,
    )
    assert [(t.rank, t.epochs_retrained, t.within_budget) for t in trials] == [
        (8, 1, False),
        (8, 2, True),
        (4, 1, True),
        (2, 1, False),
        (2, 2, False),
        (2, 3, False),
    ]
    assert choice.rank == 4 and choice.within_budget and choice.val_accuracy == 0.492
    assert choice.model.get_layer("softmax_svd").units == 4 and len(set(tags)) == len(tags) == 6
    # no rank inside: the largest is reported, marked outside, and no smaller one is tried
    choice, trials = svd_rank.search(
        base, [8, 4], lambda m: 0.3, lambda m, tag: None, 0.5, max_drop=0.01, max_epochs=2, log=lambda *_: None
    )
    assert choice.rank == 8 and not choice.within_budget and [t.rank for t in trials] == [8, 8]


def test_compression_summary_reads_work_accuracy_and_time_per_compression():
    from ondevice.papers.autlearn import compression

    comp = pd.DataFrame(
        [
            ("LSTM", "uncompressed", "", 0.0, True),
            ("LSTM", "SVD", "softmax rank 4 of 12", 0.02, False),
            ("LSTM", "magnitude pruning", "50% of weights zero", 0.005, True),
        ],
        columns=["model", "method", "detail", "accuracy_drop", "within_budget"],
    )
    epochs = pd.DataFrame(
        [
            ("LSTM", 16, u, m, g, t)
            for u, scale in (("a", 1.0), ("b", 2.0), ("c", 3.0))
            for m, g, t in (("uncompressed", 10.0, 4.0), ("SVD", 3.0, 3.0), ("magnitude pruning", 10.0, 4.0))
            for g, t in [(g * scale, t * scale)]
        ],
        columns=["model", "batch", "user", "method", "gflops", "epoch_seconds"],
    )
    table = compression.summary(comp, epochs).set_index("method")
    assert table.loc["SVD", "work_removed"] == pytest.approx(0.7) and table.loc["SVD", "time_saved"] == pytest.approx(
        0.25
    )
    assert table.loc["SVD", "accuracy_lost"] == 0.02 and not table.loc["SVD", "within_budget"]
    assert table.loc["magnitude pruning", "work_removed"] == 0 and table.loc["magnitude pruning", "time_saved"] == 0
    assert table.loc["magnitude pruning", "role"].startswith("our ablation")
    assert table.loc["SVD", "role"].startswith("the paper's")


def profile_table(parts_ms: dict) -> pd.DataFrame:
    """A hand-made profile: {part: (uncompressed ms, SVD ms, uncompressed MFLOPs, SVD MFLOPs)}."""
    rows = []
    for part, (tb, ts, fb, fs) in parts_ms.items():
        rows.append(dict(method="uncompressed", part=part, counted_mflops=fb, op_time_ms=tb))
        rows.append(dict(method="SVD", part=part, counted_mflops=fs, op_time_ms=ts))
    return pd.DataFrame(rows)


def test_profile_diagnosis_names_the_machine_only_when_slower_matmuls_explain_the_gap():
    from ondevice.papers.autlearn import step_profile
    from ondevice.report.claims import Kind

    zero = (0.0, 0.0, 0.0, 0.0)
    # the matmuls lose 75% of their work but only 25% of their time; the other parts are negligible
    slow = dict.fromkeys(step_profile.TEXT_PARTS, zero) | {"softmax matmuls": (4.0, 3.0, 100.0, 25.0)}
    d = step_profile.diagnosis(profile_table(slow))
    assert d.kind == Kind.HARDWARE and "counted FLOPs predict 1.00 ms, measured 3.00" in d.text
    # the matmuls follow their work exactly; the cross-entropy (no counted FLOPs) keeps its 3 ms
    kept = slow | {"softmax matmuls": (4.0, 1.0, 100.0, 25.0), "cross-entropy": (3.0, 3.0, 0.0, 0.0)}
    d = step_profile.diagnosis(profile_table(kept))
    assert d.kind == Kind.OPEN and "2.25 ms is work SVD leaves" in d.text and d.section == step_profile.SECTION
    # at the paper scale's sizes the step follows the paper's +400%: within 3x of it names the scale
    d = step_profile.diagnosis(profile_table(kept), "SVD", (1.5, 3.0), 4.0)
    assert d.kind == Kind.SCALE and "the step's time changes +150% (+300% by FLOPs)" in d.text
    # +20% at the paper's sizes is more than 3x below +400%: the profile's own rule decides
    assert step_profile.diagnosis(profile_table(slow), "SVD", (0.2, 3.0), 4.0).kind == Kind.HARDWARE
    assert step_profile.diagnosis(profile_table(kept), "SVD", (-0.5, 3.0), 4.0).kind == Kind.OPEN


def test_step_profile_reads_each_part_of_real_steps_from_the_profiler_and_leaves_the_weights():
    from ondevice.models import svd_compression
    from ondevice.papers.autlearn import step_profile
    from ondevice.papers.autlearn.experiments import autlearn_cost as exp

    params = exp.Params.for_scale("smoke", 0, timing_repeats=2)
    base = small_lstm()
    svd = svd_compression.compress(base, 3)
    before = [m.get_weights() for m in (base, svd)]
    x = tokens(4, 6, 40)
    y = np.random.default_rng(5).integers(1, 30, x.shape).astype(np.int32)
    models = [("uncompressed", base, "softmax"), ("SVD", svd, "softmax")]
    table = step_profile.measure(params, models, [(x, y), (x[:2, :4], y[:2, :4])])
    assert list(table.part) == 2 * list(step_profile.TEXT_PARTS) and (table.step_wall_time_ms > 0).all()
    busy = table.pivot(index="part", columns="method", values="op_time_ms")
    # the profiler saw the ops of each named part of both steps, and named most of their time
    for part in ("LSTM layers", "softmax matmuls", "cross-entropy", "trained layer's gradient", "optimizer update"):
        assert (busy.loc[part] > 0).all(), part
    assert (busy.loc["other"] < 0.5 * busy.sum()).all()
    flops = table.pivot(index="part", columns="method", values="counted_mflops")
    assert flops.loc["LSTM layers", "SVD"] == flops.loc["LSTM layers", "uncompressed"] > 0
    # per position 2 x 12 x 30 against 2 x 3 x (12 + 30); 16 positions per step on average
    assert flops.loc["softmax matmuls", "uncompressed"] == pytest.approx(16 * 2 * 12 * 30 / 1e6)
    assert flops.loc["softmax matmuls", "SVD"] == pytest.approx(16 * 2 * 3 * 42 / 1e6)
    assert flops.loc["embedding", "SVD"] == flops.loc["cross-entropy", "SVD"] == 0
    for model, weights in zip((base, svd), before):
        assert all(np.array_equal(a, b) for a, b in zip(model.get_weights(), weights))


def test_a_mobilenet_step_is_profiled_into_its_parts():
    from ondevice.models import mobilenet_v1
    from ondevice.papers.autlearn import step_profile
    from ondevice.papers.autlearn.experiments import autlearn_cost as exp

    params = exp.Params.for_scale("smoke", 0, timing_repeats=1)
    base = pruning.flatten(mobilenet_v1.build(None, 0.25, 32, 62, seed=0))
    pruned = pruning.prune(base, "conv_pw_13", pruning.lowest_units(base.get_layer("conv_pw_13"), 200))
    rng = np.random.default_rng(0)
    x, y = rng.random((4, 28, 28, 1)).astype(np.float32), rng.integers(0, 62, 4)
    models = [("uncompressed", base, mobilenet_v1.HEAD), ("structured pruning", pruned, mobilenet_v1.HEAD)]
    table = step_profile.measure(params, models, [(x, y)], "image")
    busy = table.pivot(index="part", columns="method", values="op_time_ms")
    for part in ("input", "convolutions", "depthwise convolutions", "head and cross-entropy", "optimizer update"):
        assert (busy.loc[part] > 0).all(), part
    assert (busy.loc["other"] < 0.5 * busy.sum()).all()
    flops = table.pivot(index="part", columns="method", values="counted_mflops")
    # the last convolution's filters go, and with them the head's inputs: 256 -> 56 features into 62 classes
    assert flops.loc["convolutions", "structured pruning"] < flops.loc["convolutions", "uncompressed"]
    head = [4 * 2 * n * 62 / 1e6 for n in (256, 56)]  # 4 images
    assert flops.loc["head and cross-entropy", ["uncompressed", "structured pruning"]].tolist() == pytest.approx(head)


def test_the_paper_size_model_keeps_each_compressions_share_of_every_layer():
    from ondevice.models import svd_compression
    from ondevice.papers.autlearn import paper_size
    from ondevice.papers.autlearn.compression import Compressed

    base, wide = small_lstm(), lstm_lm.build(lstm_lm.LSTMConfig(40, 30, 16, 48, 2), seed=1)
    pruned = pruning.prune(base, "lstm_2", pruning.lowest_units(base.get_layer("lstm_2"), 9))  # 12 -> 3
    variant = Compressed("text", "structured pruning", pruned, "", 0.0, "softmax")
    like = paper_size.like(variant, base, wide)
    assert pruning.width(like.get_layer("lstm_2")) == 12 and pruning.width(like.get_layer("lstm_1")) == 48
    assert like.get_layer("softmax").input_shape[-1] == 12 and pruning.width(wide.get_layer("lstm_2")) == 48
    svd = Compressed("text", "SVD", svd_compression.compress(base, 3), "", 0.0, "softmax")  # rank 3 of 12
    assert paper_size.like(svd, base, wide).get_layer(svd_compression.PROJECTION).units == 12


def test_paper_size_changes_are_the_users_median_ratios_to_the_uncompressed_step():
    from ondevice.papers.autlearn import paper_size

    rows = []
    for user, (base, pruned) in {"a": (2.0, 1.0), "b": (3.0, 1.0), "c": (4.0, 1.0)}.items():
        rows += [dict(model="LSTM", batch=16, user=user, method="uncompressed", step_seconds=base, gflops=8.0)]
        rows += [dict(model="LSTM", batch=16, user=user, method="structured pruning", step_seconds=pruned, gflops=2.0)]
    table = paper_size.with_changes(pd.DataFrame(rows).sample(frac=1.0, random_state=0))
    assert (table[table.method == "uncompressed"][["time_change", "work_change"]] == 0).all().all()
    summary = paper_size.changes(table)
    assert paper_size.change_of(summary, "LSTM", "structured pruning") == pytest.approx((2.0, 3.0))
    assert paper_size.change_of(summary, "LSTM", "SVD") is None


def test_every_compression_row_and_the_energy_row_get_the_profiles_diagnosis():
    from ondevice.papers.autlearn import paper_size, step_profile
    from ondevice.report.claims import Kind

    zero = (0.0, 0.0, 0.0, 0.0)
    parts = dict.fromkeys(step_profile.TEXT_PARTS, zero) | {"softmax matmuls": (4.0, 1.0, 100.0, 25.0)}
    lstm = profile_table(parts | {"cross-entropy": (3.0, 3.0, 0.0, 0.0)})
    pruned = lstm[lstm.method == "SVD"].assign(method="structured pruning")
    images = profile_table(dict.fromkeys(step_profile.IMAGE_PARTS, zero) | {"convolutions": (2.0, 2.0, 10.0, 6.0)})
    images = images.replace({"SVD": "structured pruning"})
    ops = pd.concat(
        [pd.concat([lstm, pruned]).assign(model="LSTM", batch=16)]
        + [images.assign(model="MobileNet", batch=b) for b in (1, 16)]
    )
    rows = [
        dict(model="LSTM", batch=16, user="u", method=m, step_seconds=s, gflops=g)
        for m, s, g in (("uncompressed", 5.0, 4.0), ("SVD", 1.0, 1.0), ("structured pruning", 4.0, 1.0))
    ]
    cache = pd.DataFrame(
        [
            dict(model="MobileNet", user=u, forward_share_of_time=f, cache_time_change_full_backward=1 / (1 - f) - 1)
            for u, f in (("a", 0.3), ("b", 0.35), ("c", 0.99))
        ]
    )
    profile = step_profile.Profile(ops, paper_size.with_changes(pd.DataFrame(rows)), cache)
    claims = ["SVD shortens the LSTM's epoch", "structured pruning shortens the LSTM's epoch"]
    claims += [f"structured pruning shortens MobileNet's epoch (batch {b})" for b in (1, 16)]
    cached = "the inference cache shortens online updates (MobileNet)"
    effects = [*claims, step_profile.ENERGY, cached]
    flops = pd.DataFrame({"effect": effects, "paper change": [4.0, 4.0, 0.333, 0.333, 4.0, 0.538]})
    why = profile.diagnoses(flops)
    assert set(why) == set(effects)  # no LSTM rows in the cache table: no diagnosis for its row
    # the median user: the forward pass 35% of the full-backward step, so the cache saves 35% (+54%)
    assert why[cached].kind == Kind.READ_TWO_WAYS and "forward pass is 35% of the step" in why[cached].text
    assert "changes its time +54%" in why[cached].text and why[cached].section == step_profile.CACHE_SECTION
    assert why[claims[0]].kind == Kind.SCALE and "changes +400%" in why[claims[0]].text  # 5.0 / 1.0 - 1
    assert why[claims[1]].kind == Kind.OPEN and "changes +25%" in why[claims[1]].text  # 25% is below 400% / 3
    assert why[step_profile.ENERGY].text.endswith(why[claims[1]].text)
    # MobileNet has no paper-size rows here: its convolutions lose 40% of their work and none of their time
    assert why[claims[2]].kind == Kind.HARDWARE and "paper scale" not in why[claims[2]].text
    assert set(profile.tables()) == {"step_profile", "paper_size_time", "paper_size_changes", "cache_readings"}
    # a 99% forward share (ours) is far from the paper's saving: open
    assert step_profile.cache_diagnosis(98.0, 0.99, 0.538).kind == Kind.OPEN


def test_the_full_backward_step_computes_every_gradient_and_updates_the_last_layer_alone():
    from ondevice.papers.autlearn import cache_reading
    from ondevice.papers.autlearn.experiments import autlearn_cost as exp

    params = exp.Params.for_scale("smoke", 0)
    model = small_lstm()
    before = {w.name: w.numpy().copy() for w in model.weights}
    x = tokens(4, 6, 40)
    y = np.random.default_rng(5).integers(1, 30, x.shape).astype(np.int32)
    step = cache_reading.full_backward_step(params, "text", model, "softmax")
    assert np.isfinite(step(x, y))
    changed = {w.name for w in model.weights if not np.array_equal(w.numpy(), before[w.name])}
    assert changed == {w.name for w in model.get_layer("softmax").weights}
    forward = cache_reading.forward(model)
    forward(x, y)  # runs, copies nothing out, changes nothing
    assert all(np.array_equal(w.numpy(), before[w.name]) or w.name in changed for w in model.weights)


def test_profiled_ops_are_read_into_the_parts_of_the_step():
    from ondevice.papers.autlearn.step_profile import part_of

    known = {
        "deeptype_lstm_svd24/softmax_svd/Tensordot/MatMul:_MklMatMul": "softmax matmuls",
        "deeptype_lstm/softmax/BiasAdd:BiasAdd": "softmax bias",
        "gradient_tape/deeptype_lstm/softmax/BiasAdd/BiasAddGrad:BiasAddGrad": "softmax bias",
        "gradient_tape/deeptype_lstm/softmax/Tensordot/MatMul/MatMul_1:_MklMatMul": "trained layer's gradient",
        "gradient_tape/ReduceLogSumExp/BroadcastTo:BroadcastTo": "cross-entropy, backward",
        "ReduceLogSumExp/Exp:Exp": "cross-entropy",
        "SGD/mul_1:Mul": "optimizer update",
        "while_20/body/_1/while/MatMul:_MklMatMul": "LSTM layers",
        "deeptype_lstm/embedding/embedding_lookup:ResourceGather": "embedding",
        "NotEqual:NotEqual": "other",
    }
    assert {op: part_of(op) for op in known} == known
    images = {
        "mobilenet_v1/grey_to_rgb/concat:ConcatV2": "input",
        "mobilenet_v1/conv_pw_9_relu/Relu6:_MklNativeFusedConv2D": "convolutions",
        "mobilenet_v1/conv_dw_9/depthwise:_MklNativeDepthwiseConv2dNative": "depthwise convolutions",
        "mobilenet_v1/conv_dw_1_bn/FusedBatchNormV3:_MklNativeFusedBatchNormV3": "batch normalisation",
        "mobilenet_v1/conv_pad_2/Pad:Pad": "activations and padding",
        "mobilenet_v1/logits/BiasAdd:BiasAdd": "head and cross-entropy",
        "gradient_tape/mobilenet_v1/logits/MatMul/MatMul:_MklMatMul": "trained layer's gradient",
        "Adam/Sqrt:Sqrt": "optimizer update",
        "ReadVariableOp:ReadVariableOp": "other",
    }
    assert {op: part_of(op, "image") for op in images} == images


def toy_cloud():
    """A linear classifier trained to fit separable points, and a `retraining.Cloud` that re-trains it
    by real Adam steps on its training points and scores it on two held-out parts."""
    from ondevice.papers.autlearn.retraining import Cloud
    from ondevice.tasks.classification import ClassificationTask
    from ondevice.training.trainer import Trainer

    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 2)).astype(np.float32)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0.3).astype(np.int64)
    task, train = ClassificationTask((2,), 2), (x[:200], y[:200])
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2, kernel_initializer="zeros")])
    Trainer(model, task, 0.05, "adam").fit(train, 30, 16, np.random.default_rng(1))
    fit = lambda m, rate, tag="": Trainer(m, task, rate, "adam").fit(train, 1, 16, np.random.default_rng(2))
    top1 = lambda m, part: float((m(x[part]).numpy().argmax(-1) == y[part]).mean())
    judged, selection = slice(200, 300), slice(300, 400)
    return model, Cloud(lambda m: top1(m, judged), lambda m: (top1(m, judged), top1(m, selection)), fit)


def test_retraining_control_holds_at_the_chosen_rate_and_fails_at_a_destructive_one():
    from ondevice.papers.autlearn import retraining

    model, cloud = toy_cloud()
    base_acc, start = cloud.evaluate(model), model.get_weights()
    assert base_acc > 0.9
    rate, trials = retraining.choose_rate(model, cloud, [30.0, 1e-4], log=lambda *_: None)
    assert [t.rate for t in trials] == [1e-4, 30.0] and [t.chosen for t in trials] == [True, False]
    assert rate == 1e-4 and trials[0].selection_top1 > trials[1].selection_top1
    assert all(np.array_equal(a, b) for a, b in zip(start, model.get_weights()))  # trials re-train copies
    checks = retraining.control(model, cloud, rate, base_acc, 0.01, ("a", "b"), log=lambda *_: None)
    assert [(c.retraining, c.epochs) for c in checks] == [("SVD", 1), ("SVD", 2)]
    assert all(c.within_budget for c in checks)
    assert retraining.reference(base_acc, checks) == max(base_acc, *(c.val_top1 for c in checks))
    # the known answer catches a re-training that loses accuracy by itself
    failed = retraining.control(model, cloud, 30.0, base_acc, 0.01, ("a",), log=lambda *_: None)
    assert not failed[0].within_budget
    control = retraining.EpochControl(model, cloud, 30.0, base_acc, 0.01, log=lambda *_: None)
    assert control.reference(0) == base_acc and control.reference(2) == base_acc  # never below the model itself
    assert [c.within_budget for c in control.checks()] == [False, False]
    # ties go to the smaller rate
    flat = retraining.Cloud(lambda m: 0.5, lambda m: (0.5, 0.5), lambda m, rate, tag: None)
    assert retraining.choose_rate(model, flat, [0.3, 0.1, 0.2], log=lambda *_: None)[0] == 0.1


def test_a_stored_retraining_pass_replays_its_weights_and_any_other_input_trains_again(monkeypatch, tmp_path):
    """autlearn_cost resumes: a pass from the same weights, rate and tag is read back, not trained;
    other start weights (a pruned model), another rate or another tag (the epoch's draw) train."""
    from ondevice.papers.autlearn import cached_runs

    monkeypatch.setenv("ONDEVICE_MODEL_CACHE", str(tmp_path))
    passes = []

    def retrain(model, rate, tag=""):  # a real Adam epoch on fixed data, as the cloud's re-training
        passes.append((rate, tag))
        x, y = tokens(), tokens()
        model.compile(keras.optimizers.Adam(rate), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x, y % 30, epochs=1, verbose=0, shuffle=False)

    stored = cached_runs.stored_pass("retrain_test", {"kind": "text"}, ["data"], ("ondevice.streams",), retrain)
    model = small_lstm()
    start = model.get_weights()
    stored(model, 0.01, "epoch/1")
    trained = model.get_weights()
    model.set_weights(start)
    stored(model, 0.01, "epoch/1")
    assert passes == [(0.01, "epoch/1")] and all(np.array_equal(a, b) for a, b in zip(trained, model.get_weights()))
    assert not np.array_equal(trained[0], start[0])
    stored(model, 0.01, "epoch/2")  # from the trained weights, the next epoch's draw
    model.set_weights(start)
    stored(model, 0.02, "epoch/1")
    pruned = pruning.prune(small_lstm(), "lstm_2", [0, 1])
    stored(pruned, 0.01, "epoch/1")
    assert passes[1:] == [(0.01, "epoch/2"), (0.02, "epoch/1"), (0.01, "epoch/1")]
    assert len(list(tmp_path.glob("retrain_test-*"))) == 4
