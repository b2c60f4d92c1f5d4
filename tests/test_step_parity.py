"""One training step in three forms give the same step: TensorFlow (`training.step.Step`), the Flex
export (the Step converted as it is, run by TensorFlow's interpreter) and the builtin-op export
(the Step written out by hand, run by LiteRT), for one model per family (LSTM LM, a MobileNet-style
conv head, the Colla M-RNN) and for the online path with reuse of inference results.

Tolerances (tests/numerics.py). Losses: the runtimes sum each matrix product's terms in another
order and with their own exp/tanh/log, so a loss differs by at most the float32 rounding of the
chained sums that make it (`assert_close_float32` with the terms counted per model below); earlier
steps' rounding moves the weights by lr x that relative error of the gradient, negligible on the
loss. Builtin weights after Adam steps: Adam divides by sqrt(v) + 1e-7, which for a gradient near
zero magnifies its absolute rounding by up to lr / 1e-7, though a step never moves a weight by more
than ~lr; so weights are compared to rtol 1e-4 with atol 1e-4 x the tensor's largest weight. Seen:
losses <= 1.3e-7 relative; weights <= 5e-7 of the tensor's largest, except Adam on the M-RNN's
embeddings, <= 1.5e-5 of it (1.5e-6 absolute): 7x inside.
"""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from numerics import assert_close_float32, float32_sum_tolerance, keras_terms, lstm_terms
from ondevice.data.places import FEATURES
from ondevice.device import builtin_export as be
from ondevice.device import litert, parity, tflite, tflite_reuse
from ondevice.models import lstm_lm, mrnn
from ondevice.models.svd_compression import compress
from ondevice.tasks.classification import ClassificationTask
from ondevice.tasks.next_word import NextWordTask
from ondevice.training import inference_reuse
from ondevice.training.fine_tune import FineTune
from ondevice.training.step import Hook, Step
from ondevice.training.trainer import seed_everything

RTOL = 1e-4


def step(model, task, lr, optimizer="adam", train=be.TRAIN_ALL, clip_norm=0.0) -> Step:
    """The Step that trains everything, or (`train="head"`) the last layer only."""
    hooks = [FineTune(model.layers[-1].name)] if train == be.TRAIN_HEAD else []
    return Step(model, task, lr, optimizer, hooks, clip_norm)


def lm_terms(length: int, batch_positions: int) -> int:
    """Float32 terms along the small LM's loss: 2 LSTM layers (8 inputs, 12 units), the softmax's
    12 + 1, the 20-word log-sum-exp and the mean over the batch's positions."""
    return lstm_terms(length, 8, 12) + 13 + 20 + batch_positions


def assert_parity(check: dict, start: dict, terms: int) -> None:
    """Same losses (to the float32 rounding of `terms` chained terms) and weights in TensorFlow and
    LiteRT, and the weights really moved."""
    assert_close_float32(check["litert"], check["tensorflow"], terms=terms)
    assert set(check["weights_litert"]) == set(check["weights_tensorflow"])
    moved = 0
    for key, expected in check["weights_tensorflow"].items():
        scale = float(np.abs(expected).max()) or 1.0
        np.testing.assert_allclose(check["weights_litert"][key], expected, rtol=RTOL, atol=RTOL * scale, err_msg=key)
        moved += not np.array_equal(expected, start[key])
    trained = check["module"].trained_keys
    assert moved == len(trained), f"only {moved} of {trained} changed"


def assert_builtin_only(flatbuffer: bytes) -> None:
    assert litert.custom_operators(flatbuffer) == []  # every operator code is a builtin one
    assert not any(op.startswith("Flex") for op in litert.operators(flatbuffer))
    assert tflite_reuse.flex_ops(flatbuffer) == []
    assert {"VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE"} <= set(litert.operators(flatbuffer))


def text_batches(rng, n_batches: int, vocab: int, outputs: int, longest: int = 8):
    """Right-padded next-word batches of different sizes and lengths, as Samples.padded makes them."""
    batches = []
    for b in range(n_batches):
        lengths = rng.integers(2, longest + 1, size=3 + b)
        x = np.zeros((len(lengths), lengths.max()), np.int32)
        y = np.zeros_like(x)
        for row, n in enumerate(lengths):
            x[row, :n], y[row, :n] = rng.integers(2, vocab, n), rng.integers(2, outputs, n)
        batches.append((x, y))
    return batches


@pytest.fixture(scope="module")
def lm():
    seed_everything(0)
    model = lstm_lm.build(lstm_lm.LSTMConfig(input_vocab=30, output_vocab=20, embedding_dim=8, hidden_units=12), seed=0)
    return model, text_batches(np.random.default_rng(0), 4, 30, 20)


@pytest.mark.parametrize("train,optimizer,lr", [(be.TRAIN_ALL, "adam", 0.01), (be.TRAIN_HEAD, "sgd", 0.5)])
def test_lstm_lm_trains_in_litert_as_in_tensorflow(lm, train, optimizer, lr):
    """Full training (Adam) and DeepType's fine-tune / AutLearn's last layer (SGD)."""
    model, batches = lm
    assert len({x.shape for x, _ in batches}) == len(batches)  # padded to the file's length 8 on the way
    check = parity.compare_builtin(step(model, NextWordTask(), lr, optimizer, train), batches, 8)
    module = check["module"]
    start = module.keras_weights(model)
    assert_builtin_only(check["flatbuffer"])
    assert_parity(check, start, lm_terms(8, 8 * len(batches) + 3))
    expected = {
        be.TRAIN_ALL: [
            "embedding_embeddings",
            "lstm_1_kernel",
            "lstm_1_recurrent_kernel",
            "lstm_1_bias",
            "lstm_2_kernel",
            "lstm_2_recurrent_kernel",
            "lstm_2_bias",
            "softmax_kernel",
            "softmax_bias",
        ],
        be.TRAIN_HEAD: ["softmax_kernel", "softmax_bias"],
    }[train]
    assert module.trained_keys == module.keys == expected
    # the LSTM gradient is written out: no While/TensorList, and only the full model has segment sums
    ops = set(litert.operators(check["flatbuffer"]))
    assert not ops & {"WHILE", "UNIDIRECTIONAL_SEQUENCE_LSTM"}
    assert ("UNSORTED_SEGMENT_SUM" in ops) == (train == be.TRAIN_ALL)


@pytest.mark.parametrize("train", [be.TRAIN_ALL, be.TRAIN_HEAD])
def test_svd_compressed_lm_trains_in_litert_as_in_tensorflow(lm, train):
    """DeepType's layer compression: the softmax as a bias-free projection then the softmax; the
    projection trains with the rest ("all") and is a constant when only the head trains."""
    model, batches = lm
    compressed = compress(model, rank=4)
    check = parity.compare_builtin(step(compressed, NextWordTask(), 0.01, "adam", train), batches, 8)
    assert_builtin_only(check["flatbuffer"])
    assert_parity(check, check["module"].keras_weights(compressed), lm_terms(8, 8 * len(batches) + 3) + 5)
    assert ("softmax_svd_kernel" in check["module"].trained_keys) == (train == be.TRAIN_ALL)
    assert "softmax_svd_bias" not in check["module"].keys


def test_get_and_set_weights_round_trip_exactly_and_infer_matches_keras(lm):
    model, batches = lm
    module = be.BuiltinTrainable(step(model, NextWordTask(), 0.01), sequence_length=8)
    flatbuffer = be.convert(module)
    trained = litert.interpreter(flatbuffer)
    x, y = batches[1]
    padded = be.feed(module, x)["tokens"]
    # LiteRT vs TensorFlow logits: the 2 LSTM layers' gate sums over the padded length, then 12 + 1 terms
    assert_close_float32(
        trained.get_signature_runner("infer")(tokens=padded)["logits"][:, : x.shape[1]],
        model(x).numpy(),
        terms=lstm_terms(padded.shape[1], 8, 12) + 13,
    )
    be.train_on_device(trained, module, batches[:2])
    weights = trained.get_signature_runner("get_weights")()
    assert set(weights) == set(module.keys)
    fresh = litert.interpreter(flatbuffer)
    assert not np.array_equal(fresh.get_signature_runner("get_weights")()["softmax_kernel"], weights["softmax_kernel"])
    fresh.get_signature_runner("set_weights")(**weights)
    again = fresh.get_signature_runner("get_weights")()
    for key, value in weights.items():
        np.testing.assert_array_equal(again[key], value, err_msg=key)
    infer = [i.get_signature_runner("infer")(tokens=padded)["logits"] for i in (trained, fresh)]
    np.testing.assert_array_equal(infer[0], infer[1])
    # set_weights resets the optimizer (a fresh start, as Trainer.reset): both now train alike
    trained.get_signature_runner("set_weights")(**weights)
    after = [i.get_signature_runner("train")(**be.feed(module, x, y))["loss"] for i in (trained, fresh)]
    assert after[0] == after[1]
    np.testing.assert_array_equal(
        trained.get_signature_runner("get_weights")()["lstm_1_kernel"],
        fresh.get_signature_runner("get_weights")()["lstm_1_kernel"],
    )


def conv_model(classes: int) -> keras.Model:
    """MobileNet/YAMNet in small: a conv, a depthwise-separable block (each with batch norm and
    ReLU), global pooling and a Dense head, as mobilenet_v1/v2 and yamnet end."""
    x = inputs = keras.Input((16, 16, 1), name="image")
    x = keras.layers.Conv2D(8, 3, 2, padding="same", use_bias=False, name="conv")(x)
    x = keras.layers.ReLU(6.0)(keras.layers.BatchNormalization(name="conv_bn")(x))
    x = keras.layers.DepthwiseConv2D(3, padding="same", use_bias=False, name="depthwise")(x)
    x = keras.layers.ReLU(6.0)(keras.layers.BatchNormalization(name="depthwise_bn")(x))
    x = keras.layers.Conv2D(16, 1, use_bias=False, name="pointwise")(x)
    x = keras.layers.ReLU(6.0)(keras.layers.BatchNormalization(name="pointwise_bn")(x))
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(classes, name="predictions")(x))


def test_conv_head_trains_in_litert_as_in_tensorflow():
    """MoIL's LF(1) / AutLearn's last layer on a MobileNet-style model: the frozen part (conv,
    depthwise, batch norm on its moving statistics) is constants in the file, the head trains.
    (The real MobileNetV1/V2 and YAMNet heads: `python -m ondevice.device.builtin_export`.)"""
    seed_everything(0)
    rng = np.random.default_rng(1)
    model = conv_model(4)
    for layer in model.layers:  # moving statistics that are not the initial 0 and 1
        if isinstance(layer, keras.layers.BatchNormalization):
            n = layer.moving_mean.shape[0]
            layer.set_weights(
                [rng.uniform(0.5, 1.5, n), rng.normal(0, 0.1, n), rng.normal(0, 0.1, n), rng.uniform(0.5, 1.5, n)]
            )
    batches = [(rng.random((n, 16, 16, 1), np.float32), rng.integers(0, 4, n).astype(np.int32)) for n in (6, 4, 6)]
    check = parity.compare_builtin(
        step(model, ClassificationTask((16, 16, 1), 4), 0.01, "adam", be.TRAIN_HEAD), batches
    )
    assert_builtin_only(check["flatbuffer"])
    assert check["module"].trained_keys == ["predictions_kernel", "predictions_bias"]
    assert {"CONV_2D", "DEPTHWISE_CONV_2D"} <= set(litert.operators(check["flatbuffer"]))
    # the conv chain (`keras_terms`), the 4-class log-sum-exp and the batch mean of 6
    assert_parity(check, check["module"].keras_weights(model), keras_terms(model) + 4 + 6)
    with pytest.raises(ValueError, match="no builtin kernels"):
        be.BuiltinTrainable(step(model, ClassificationTask((16, 16, 1), 4), 0.01))


def test_colla_device_mrnn_trains_in_litert_as_in_tensorflow():
    """The customised device M-RNN: embeddings, LSTM and FC train; slot switches are kept and
    exchanged, a switched-off slot gets no gradient on either side."""
    seed_everything(0)
    rng = np.random.default_rng(2)
    config = mrnn.MRNNConfig(locations=12, outputs=8, embedding_dim=4, hidden_units=8, history=4, slots=True)
    model = mrnn.build(config, seed=0)
    model.get_layer("slots").set_weights([(np.arange(8) < 5).astype(np.float32)])
    counts = config.id_counts()

    def batch(n):
        steps = np.stack([rng.integers(0, counts[i], (n, config.history)) for i in range(len(FEATURES))], -1)
        return steps.astype(np.int32), rng.integers(0, 5, n).astype(np.int32)

    task = ClassificationTask((config.history, len(FEATURES)), 8, input_dtype=tf.int32)
    check = parity.compare_builtin(step(model, task, 0.01), [batch(8), batch(5), batch(8)])
    assert_builtin_only(check["flatbuffer"])
    module = check["module"]
    assert module.keys == module.trained_keys + ["slots_active"]
    assert len(module.trained_keys) == len(FEATURES) + 5  # six tables, LSTM kernel/recurrent/bias, FC kernel/bias
    start = module.keras_weights(model)
    # one LSTM layer over 4 steps of six 4-wide embeddings, the FC's 8 + 1, 8 classes, the batch mean of 8
    assert_parity(check, start, lstm_terms(4, 6 * 4, 8, layers=1) + 9 + 8 + 8)
    np.testing.assert_array_equal(check["weights_litert"]["slots_active"], start["slots_active"])
    np.testing.assert_array_equal(check["weights_litert"]["fc_kernel"][:, 5:], start["fc_kernel"][:, 5:])


def test_operator_codes_name_flex_ops_of_a_flex_file():
    """The op list reads the flatbuffer's operator codes: a Select TF op shows as Flex<op>."""
    dense = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    flex = tflite.convert(Step(dense, ClassificationTask((4,), 3), 0.1), ("infer", "save"))
    assert litert.custom_operators(flex) == ["FlexSave"] and "FULLY_CONNECTED" in litert.operators(flex)


def test_reuse_signatures_train_the_head_from_cached_features_as_train_does(lm):
    """DeepType's online path in builtin mode: infer_and_cache then train_from_cache gives the same
    losses and weights as `train` on the same batches (and `train` matches TensorFlow, above)."""
    model, batches = lm
    module = be.BuiltinTrainable(step(model, NextWordTask(), 0.01, train=be.TRAIN_HEAD), sequence_length=8, reuse=True)
    flatbuffer = be.convert(module)
    assert_builtin_only(flatbuffer)
    plain, reusing = litert.interpreter(flatbuffer), litert.interpreter(flatbuffer)
    cache, from_cache = (
        reusing.get_signature_runner("infer_and_cache"),
        reusing.get_signature_runner("train_from_cache"),
    )
    for x, y in batches:
        fed = be.feed(module, x, y)
        cached = cache(tokens=fed["tokens"])
        # other signatures, so other graphs of the same kernels: the LSTM chain then 12 + 1 terms; the loss
        # adds the 20-word log-sum-exp and the mean over the batch's positions
        forward = lstm_terms(fed["tokens"].shape[1], 8, 12) + 13
        infer = plain.get_signature_runner("infer")(tokens=fed["tokens"])["logits"]
        assert_close_float32(cached["logits"], infer, terms=forward)
        labels = NextWordTask().signature.labels.name
        loss_reuse = from_cache(features=cached["features"], **{labels: fed[labels]})["loss"]
        loss_plain = plain.get_signature_runner("train")(**fed)["loss"]
        assert_close_float32(loss_reuse, loss_plain, terms=forward + 20 + fed["tokens"].size)
    w_plain, w_reuse = plain.get_signature_runner("get_weights")(), reusing.get_signature_runner("get_weights")()
    for key in w_plain:  # Adam: as the module docstring derives, to RTOL and RTOL x the tensor's largest weight
        scale = float(np.abs(w_plain[key]).max()) or 1.0
        np.testing.assert_allclose(w_reuse[key], w_plain[key], rtol=RTOL, atol=RTOL * scale, err_msg=key)
    with pytest.raises(be.NotExportable, match="head only"):
        be.BuiltinTrainable(step(model, NextWordTask(), 0.01), sequence_length=8, reuse=True)


def test_colla_distillation_trains_in_litert_as_the_distillation_hook_in_tensorflow():
    """Colla's client update (Eq. 2) in builtin mode: the teacher's probabilities come in as an
    input; losses and weights match TensorFlow's Trainer with the DistillationHook."""
    from ondevice.papers.colla.techniques.distillation import DistillationHook, FullTeacher
    from ondevice.training.trainer import Trainer

    seed_everything(0)
    rng = np.random.default_rng(0)
    config = mrnn.MRNNConfig(locations=20, outputs=12, embedding_dim=4, hidden_units=8, history=5, slots=False)
    student, teacher = mrnn.build(config, seed=0), mrnn.build(config, seed=1)
    task = ClassificationTask((config.history, len(FEATURES)), 12, input_dtype=tf.int32)
    batches = [
        (
            np.stack([rng.integers(0, n, (6, config.history)) for n in config.id_counts()], axis=-1).astype(np.int32),
            rng.integers(0, 12, 6).astype(np.int32),
        )
        for _ in range(4)
    ]
    lam = 0.5
    twin = keras.models.clone_model(student)
    twin.set_weights(student.get_weights())
    trainer = Trainer(twin, task, 0.01, "adam", hooks=[DistillationHook(FullTeacher(teacher), lam)])
    tf_losses = [trainer.step(x, y) for x, y in batches]
    module = be.BuiltinTrainable(Step(student, task, 0.01), distill=lam)
    flatbuffer = be.convert(module)
    assert_builtin_only(flatbuffer)
    interp = litert.interpreter(flatbuffer)
    step = interp.get_signature_runner("train_distill")
    sig = task.signature
    lite_losses = [
        float(
            step(
                **{sig.inputs.name: x, sig.labels.name: y, "teacher": tf.nn.softmax(teacher(x, training=False)).numpy()}
            )["loss"]
        )
        for x, y in batches
    ]
    check = {
        "tensorflow": tf_losses,
        "litert": lite_losses,
        "module": module,
        "weights_tensorflow": module.keras_weights(trainer.model),
        "weights_litert": interp.get_signature_runner("get_weights")(),
    }
    # as the M-RNN above (5 steps of history, 12 classes, batch 6); the teacher's q enters as a constant
    assert_parity(check, module.keras_weights(student), lstm_terms(5, 6 * 4, 8, layers=1) + 9 + 12 + 6)


def test_the_ptb_regime_trains_in_litert_as_in_tensorflow(lm):
    """DeepType's PTB regime: SGD on the loss summed over a sample's positions, gradients clipped to a
    global norm small enough that every step is clipped, in LiteRT as in TensorFlow's Trainer."""
    model, batches = lm
    task = NextWordTask(loss_per="sample")
    check = parity.compare_builtin(step(model, task, 1.0, "sgd", clip_norm=0.05), batches, 8)
    assert check["module"].optimizer.clip_norm == 0.05
    assert_builtin_only(check["flatbuffer"])
    # the loss sums over a sample's positions: the same chain, averaged over samples instead of positions
    assert_parity(check, check["module"].keras_weights(model), lm_terms(8, 8 * len(batches) + 3))
    moved = np.sqrt(
        sum(np.sum((check["weights_litert"][k] - v) ** 2) for k, v in check["module"].keras_weights(model).items())
    )
    assert moved <= 0.05 * len(batches) * (1 + 1e-4)  # each step at most lr x clip_norm


# --- the Flex export against TensorFlow, and the table that puts the three side by side ----------


@pytest.mark.slow(reason="a Flex-mode conversion of the training signatures, then steps in both runtimes")
def test_flex_training_matches_tensorflow_and_really_trains(lm):
    model, batches = lm
    x = batches[0][0]
    before = model(x).numpy()
    result = parity.compare_flex(model, NextWordTask(), 0.05, [batches[0]] * 4)  # the loss falls only if it trains
    terms = lm_terms(x.shape[1], x.size)
    assert_close_float32(result["tflite"], result["tensorflow"], terms=terms)
    assert all(b < a for a, b in zip(result["tflite"], result["tflite"][1:]))
    # the outputs after 4 steps differ by the forward error plus each step's gradient error (as long a
    # chain again) on how far training moved them, > 1e-3 (below): another lr changes them 10x the tolerance
    outputs = result["outputs_tensorflow"]
    moved = np.abs(outputs - before).max()
    atol = float32_sum_tolerance(terms, np.abs(outputs).max()) + float32_sum_tolerance(4 * terms, moved)
    np.testing.assert_allclose(result["outputs_tflite"], outputs, rtol=0, atol=atol)
    assert not np.allclose(result["outputs_tflite"], before, atol=1e-3)
    np.testing.assert_array_equal(model(x).numpy(), before)  # the model itself is untouched


def test_a_classification_step_with_a_hook_trains_in_flex_as_in_tensorflow():
    """An image classifier: float images in, class ids as labels; a hook trains only the last layer."""
    seed_everything(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 8, 8, 1)).astype("float32")
    y = rng.integers(0, 3, size=8).astype("int32")
    model = keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(4, 3, name="conv"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(3, name="head"),
        ]
    )

    class HeadOnly(Hook):
        def trainable(self, m, variables):
            return list(m.get_layer("head").trainable_variables)

    task = ClassificationTask((8, 8, 1), 3)
    result = parity.compare_flex(model, task, 0.1, [(x, y)] * 3, "sgd", [HeadOnly()])
    # a 3x3 convolution (9 terms), the mean of its 6 x 6 outputs, the head's 4 + 1 terms, the 3-class
    # log-sum-exp and the batch mean of 8
    assert_close_float32(result["tflite"], result["tensorflow"], terms=9 + 36 + 5 + 3 + 8)
    assert result["tflite"][-1] < result["tflite"][0]
    inputs = tflite.interpreter(result["flatbuffer"]).get_signature_runner("train").get_input_details()
    assert set(inputs) == {"inputs", "labels"}


@pytest.mark.slow(reason="two conversions (Flex and builtin) of the training graph, then steps in each")
def test_parity_table_has_a_column_per_export_mode(lm):
    """The one parity table: TensorFlow, the Flex export and the builtin export on the same steps."""
    model, batches = lm
    table, flatbuffer = parity.parity_table(model, NextWordTask(), 0.05, batches, "sgd")
    assert len(table) == len(batches) and flatbuffer
    assert (table.builtin == "all").all()
    terms = max(lm_terms(8, x.size) for x, _ in batches)  # the builtin file pads every batch to length 8
    assert_close_float32(table.loss_builtin, table.loss_tensorflow, terms=terms)
    assert_close_float32(table.loss_tflite, table.loss_tensorflow, terms=terms)
    assert table.max_weight_difference_builtin.iloc[0] < 1e-4


def test_parity_table_says_why_a_step_has_no_builtin_form():
    """A conv layer that trains has no builtin gradient kernel: the Flex columns stay, the builtin
    ones are empty and say why."""
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(4, 6, 6, 1)).astype("float32"), rng.integers(0, 2, size=4).astype("int32")
    model = keras.Sequential(
        [
            keras.Input((6, 6, 1)),
            keras.layers.Conv2D(2, 3, name="conv"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(2, name="head"),
        ]
    )
    table, _ = parity.parity_table(model, ClassificationTask((6, 6, 1), 2), 0.1, [(x, y)] * 2, "sgd")
    assert table.loss_builtin.isna().all() and table.loss_tflite.notna().all()
    assert table.builtin.iloc[0].startswith("no builtin form:") and "conv" in table.builtin.iloc[0]


# --- online training with reuse of inference results: TensorFlow against the Flex file -----------


@pytest.fixture(scope="module")
def online(lm):
    model, batches = lm
    flatbuffer = tflite.convert(inference_reuse.OnlineTrainer(model, NextWordTask(), 0.05), tflite.REUSE_SIGNATURES)
    return model, batches, flatbuffer


def test_train_from_cache_losses_match_tensorflow(online):
    model, batches, flatbuffer = online
    start = model.get_weights()
    trainer = inference_reuse.OnlineTrainer(model, NextWordTask(), 0.05)
    same = [batches[0]] * 4  # the loss on a repeated batch falls only if the weights change
    tf_losses = [float(trainer.train_from_cache(trainer.infer_and_cache(x)["features"], y)["loss"]) for x, y in same]
    model.set_weights(start)
    interp = tflite.interpreter(flatbuffer)
    cache, train = interp.get_signature_runner("infer_and_cache"), interp.get_signature_runner("train_from_cache")
    lite = [float(train(features=cache(tokens=x)["features"], labels=y)["loss"]) for x, y in same]
    x = same[0][0]
    assert_close_float32(lite, tf_losses, terms=lm_terms(x.shape[1], x.size))
    assert all(b < a for a, b in zip(lite, lite[1:]))


def test_flex_reuse_step_equals_its_train_step(online):
    _, batches, flatbuffer = online
    x, y = batches[1]
    a, b = tflite.interpreter(flatbuffer), tflite.interpreter(flatbuffer)
    before = a.get_signature_runner("infer")(tokens=x)["logits"]
    a.get_signature_runner("train")(tokens=x, labels=y)
    b.get_signature_runner("train_from_cache")(
        features=b.get_signature_runner("infer_and_cache")(tokens=x)["features"], labels=y
    )
    after_a = a.get_signature_runner("infer")(tokens=x)["logits"]
    # the two signatures' graphs differ (one step through the cache): the LSTM chain, the softmax's sums and
    # the step's gradient sum over the batch's positions; the step moves the logits by > 1e-4 (below)
    assert_close_float32(
        b.get_signature_runner("infer")(tokens=x)["logits"], after_a, terms=lm_terms(x.shape[1], x.size)
    )
    assert not np.allclose(before, after_a, atol=1e-4)
