"""AutLearn A5/A6: structured pruning, its stop rule, FLOP and parameter counts, and the compiler
paths (TensorFlow, XLA, TFLite) agreeing on the loss of the same step. Real TensorFlow throughout."""

import numpy as np
import pandas as pd
import pytest
import tf_keras as keras

from numerics import assert_close_float32, lstm_terms
from ondevice.models import lstm_lm
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


def test_search_stops_at_the_accuracy_budget():
    model = small_lstm()
    script = iter(
        [
            0.50,
            0.49,
            0.48,
            0.40,  # base; round 1 trials (embedding, lstm_1, lstm_2)
            0.495,  # round 1 after re-training: within 1%
            0.45,
            0.47,
            0.46,  # round 2 trials: lstm_1 is best
            0.485,
        ]
    )  # after re-training: 1.5% below the base, over the budget
    retrained = []
    best, rounds, base = pruning.search(
        model,
        lambda m: next(script),
        retrained.append,
        step=0.25,
        max_drop=0.01,
        layers=["embedding", "lstm_1", "lstm_2"],
        log=lambda *_: None,
    )
    assert base == 0.50 and [r.layer for r in rounds] == ["embedding", "lstm_1"]
    assert [r.within_budget for r in rounds] == [True, False] and len(retrained) == 2
    assert pruning.width(best.get_layer("embedding")) == 6 and pruning.width(best.get_layer("lstm_1")) == 12
    assert best is retrained[0]  # the last model within the budget, not the one that broke it
    first, rounds, _ = pruning.search(
        model, lambda m: 0.5 if m is model else 0.3, lambda m: None, layers=["lstm_1"], log=lambda *_: None
    )
    assert first is model and len(rounds) == 1 and not rounds[0].within_budget


def test_search_without_a_round_cap_goes_on_while_the_budget_allows():
    # accuracy never falls: with max_rounds = 0 rounds go on until the layer keeps one unit (12 -> 6 -> 3 ->
    # 1 at step 0.5), each re-trained; a cap of 1 stops after the first
    retrained = []
    best, rounds, _ = pruning.search(
        small_lstm(), lambda m: 0.5, retrained.append, step=0.5, max_rounds=0, layers=["lstm_2"], log=lambda *_: None
    )
    assert [r.width_after for r in rounds] == [6, 3, 1] and len(retrained) == 3
    assert all(r.within_budget for r in rounds) and pruning.width(best.get_layer("lstm_2")) == 1
    capped = pruning.search(small_lstm(), lambda m: 0.5, lambda m: None, step=0.5, max_rounds=1, layers=["lstm_2"])
    assert len(capped[1]) == 1


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
    slow = dict.fromkeys(step_profile.PARTS, zero) | {"softmax matmuls": (4.0, 3.0, 100.0, 25.0)}
    d = step_profile.diagnosis(profile_table(slow))
    assert d.kind == Kind.HARDWARE and "counted FLOPs predict 1.00 ms, measured 3.00" in d.text
    # the matmuls follow their work exactly; the cross-entropy (no counted FLOPs) keeps its 3 ms
    kept = slow | {"softmax matmuls": (4.0, 1.0, 100.0, 25.0), "cross-entropy": (3.0, 3.0, 0.0, 0.0)}
    d = step_profile.diagnosis(profile_table(kept))
    assert d.kind == Kind.OPEN and "2.25 ms is work SVD leaves" in d.text and d.section == step_profile.SECTION


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
    assert list(table.part) == 2 * list(step_profile.PARTS) and (table.step_wall_time_ms > 0).all()
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
