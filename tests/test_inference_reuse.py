"""Reuse of inference results (DeepType Sec. 5.5): the update from cached last-LSTM outputs is the
fine-tune update, step for step, and never touches the layers below the softmax."""

import numpy as np
import pytest

from numerics import assert_close_float32, assert_same_update
from ondevice.data.typing_samples import Vocabulary, build_samples, sentences
from ondevice.models import lstm_lm
from ondevice.params import ParameterError
from ondevice.tasks.next_word import NextWordTask
from ondevice.training import inference_reuse
from ondevice.training.fine_tune import FineTune
from ondevice.training.trainer import Trainer, seed_everything


@pytest.fixture(scope="module")
def setup():
    seed_everything(0)
    sents = sentences("To be, or not to be, that is the question. Whether 'tis nobler in the mind to suffer. " * 5)
    vocab = Vocabulary.from_sentences(sents, 20)
    samples = build_samples(sents, vocab, 4)
    config = lstm_lm.LSTMConfig(vocab.input_size, vocab.size, 8, 12)
    model = lstm_lm.build(config, seed=0)
    batches = [samples.padded(np.arange(i, i + 16)) for i in (0, 16, 32)]
    return model, config, NextWordTask(), batches


def test_features_are_the_last_lstm_outputs_and_give_the_logits(setup):
    model, _, _, batches = setup
    x = batches[0][0]
    features_model, head = inference_reuse.split(model)
    out = inference_reuse.infer_and_cache(features_model, head, x)
    lstm = model.get_layer("lstm_2")
    import tf_keras as keras

    # two graphs of the same layers: gate pre-activations sum 8 or 12 inputs + 12 recurrent + 1 terms (<= 25),
    # chained over the time steps of 2 LSTM layers, |features| < 1 (tanh); the logits add sums of 12 + 1
    # terms of magnitude sum_j |h_j w_jk| + |b_k|, which also bounds how the features' relative error
    # carries into them. A wrong layer or a missing bias moves them by >= 1e-2, 100x the tolerance.
    steps = 2 * x.shape[1]
    features = keras.Model(model.inputs, lstm.output)(x).numpy()
    assert_close_float32(out["features"].numpy(), features, terms=25, layers=steps, magnitude=1.0)
    kernel, bias = model.get_layer("softmax").get_weights()
    terms = (np.abs(features) @ np.abs(kernel) + np.abs(bias)).max()
    assert_close_float32(out["logits"].numpy(), model(x).numpy(), terms=25, layers=steps + 1, magnitude=terms)


def test_reuse_steps_equal_fine_tune_steps(setup):
    model, _, task, batches = setup
    start = model.get_weights()
    trainer = Trainer(model, task, 0.05, hooks=[FineTune()])
    trainer.reset(start)
    for x, y in batches:
        trainer.step(x, y)
    expected = model.get_weights()
    online = inference_reuse.OnlineTrainer(model, task, 0.05)
    online.reset(start)
    losses = []
    for x, y in batches:
        losses.append(float(online.train_from_cache(online.infer_and_cache(x)["features"], y)["loss"]))
    got = model.get_weights()
    # the softmax's gradient sums 12 features x (p - y) over the batch's 16 x length positions, from
    # features computed by two graphs (as above: 25 terms a step of 2 LSTM layers); errors of the
    # chained sums add up, over 3 steps. A wrong lr or a missing position changes the moves by > 0.5%,
    # 20x the tolerance (~2e-4 of the largest move).
    length = max(x.shape[1] for x, _ in batches)
    for a, b, s in zip(expected, got, start):
        assert_same_update(b, a, s, terms=3 * (25 * 2 * length + 13 + 16 * length))
    for a, b in zip(start[:-2], got[:-2]):  # below the softmax nothing moved
        np.testing.assert_array_equal(a, b)
    assert not np.allclose(start[-2], got[-2])
    assert all(np.isfinite(losses))
    model.set_weights(start)


def test_train_is_the_fine_tune_step(setup):
    model, _, task, batches = setup
    start = model.get_weights()
    online = inference_reuse.OnlineTrainer(model, task, 0.05)
    online.reset(start)
    x, y = batches[0]
    online.train(x, y)
    plain = online.head_weights()
    online.reset(start)
    online.train_from_cache(online.infer_and_cache(x)["features"], y)
    # one SGD step of the softmax from the same features computed by two graphs, as in the test above
    for a, b, s in zip(plain, online.head_weights(), start[-2:]):
        assert_same_update(b, a, s, terms=25 * 2 * x.shape[1] + 13 + x.size)
    model.set_weights(start)


def test_flops_without_reuse_grow_with_the_lstm_and_with_reuse_do_not(setup):
    _, config, _, _ = setup
    f = inference_reuse.flops_per_update
    assert f(config, 16, 30, False) == pytest.approx(15 * f(config, 16, 2, False))
    bigger = lstm_lm.LSTMConfig(config.input_vocab, config.output_vocab, 64, config.hidden_units, 3)
    assert f(bigger, 16, 10, True) == f(config, 16, 10, True)
    assert f(bigger, 16, 10, False) > f(config, 16, 10, False) > f(config, 16, 10, True)


def test_online_latency_parameters_are_checked():
    from ondevice.papers.deeptype.experiments import deeptype_online_latency as exp

    assert exp.Params.for_scale("smoke").lengths == (2, 10, 20, 30)
    with pytest.raises(ParameterError, match="lengths"):
        exp.Params.for_scale("smoke", lengths=(5,))
    with pytest.raises(ParameterError, match="repeats"):
        exp.Params.for_scale("smoke", repeats=0)


def test_on_device_experiments_train_with_the_personal_fields_not_the_global_optimizer(setup):
    """D6, D8 and D9 build their personal/online trainers from `personal_*` (protocol), so changing
    the global model's optimizer or rate moves none of them; their presets keep Adam at the rates
    they always used."""
    from types import SimpleNamespace

    from ondevice.papers.deeptype import protocol
    from ondevice.papers.deeptype.experiments import deeptype_ondevice_opt as d6
    from ondevice.papers.deeptype.experiments import deeptype_online_latency as d8
    from ondevice.papers.deeptype.experiments import energy_governors as d9

    model, _, task, _ = setup
    for exp, rate in ((d6, 3e-4), (d8, 5e-4), (d9, 3e-4)):
        params = exp.Params.for_scale("smoke")
        assert (params.personal_optimizer, params.personal_learning_rate) == ("adam", rate)
    params = d8.Params.for_scale("smoke", optimizer="sgd", global_learning_rate=0.5, personal_learning_rate=0.01)
    _, _, _, online = d8._online(params, SimpleNamespace(model=model, weights={params.seed: model.get_weights()}))
    trainer = protocol.personal_trainer(params, model, task)
    for optimizer in (online.optimizer, trainer.optimizer):
        assert type(optimizer).__name__ == "Adam" and float(optimizer.learning_rate) == pytest.approx(0.01)


def test_cost_readings_count_each_reading_of_the_two_steps():
    """A model with one LSTM layer: 4 gates of (3 + 2) x 2 MACs per position, a 2 x 10 softmax;
    per position 80 and 40 FLOPs, so the readings are (80 + 80) / 80, (80 + 80) / 40, 3 (80 + 40) / 40."""
    config = lstm_lm.LSTMConfig(12, 10, 3, 2, 1)
    assert inference_reuse.forward_flops(config, 1) == (80.0, 40.0)
    readings = list(inference_reuse.cost_readings(config, batch=16, length=5).values())
    assert readings == pytest.approx([2.0, 4.0, 9.0])
    ours = inference_reuse.flops_per_update(config, 16, 5, False) / inference_reuse.flops_per_update(
        config, 16, 5, True
    )
    assert readings[0] == pytest.approx(ours)  # the first reading is the step the notebook times


def test_reuse_is_timed_on_a_users_own_batches_both_readings_and_leaves_the_weights_as_they_were(setup):
    """`reuse_time`: each way trains (the model moves while it is timed) and the weights come back;
    the paired seconds and the readings' ratios are what the effect and its diagnosis read."""
    import pandas as pd

    from ondevice.papers.deeptype import reuse_time
    from ondevice.papers.deeptype.experiments import deeptype_online_latency as d8
    from ondevice.papers.deeptype.reuse_compressed import COMPRESSED, UNCOMPRESSED

    model, _, _, batches = setup
    params = d8.Params.for_scale("smoke")
    start = model.get_weights()
    seconds = reuse_time.time_user(*reuse_time.trainers(params, model), batches[:2], repeats=2)
    assert set(seconds) == set(reuse_time.WAYS) and all(s > 0 for s in seconds.values())
    assert all(np.array_equal(a, b) for a, b in zip(start, model.get_weights()))
    assert reuse_time.sampled(list(range(10)), 3) == [0, 4, 9] and reuse_time.sampled([1, 2], 3) == [1, 2]
    # two users whose updates take 4 / 8 ms without reuse (fine-tune / full) against 1 ms with it
    ways = {reuse_time.FINE_TUNE: 4e-3, reuse_time.FULL: 8e-3, reuse_time.REUSE: 1e-3, reuse_time.AGAIN: 1e-3}
    ways[reuse_time.TWICE] = 1.6e-3
    rows = [
        dict(model=m, user=u, way=w, seconds=s)
        for m in (COMPRESSED, UNCOMPRESSED)
        for u in "ab"
        for w, s in ways.items()
    ]
    table = pd.DataFrame(rows)
    without, with_reuse = reuse_time.pairs(table, COMPRESSED)
    assert without.shape == (1, 2) and np.allclose(without, 4e-3) and np.allclose(with_reuse, 1e-3)
    assert reuse_time.ratios(table).ratio.tolist() == pytest.approx([4, 8, 1, 1.6, 4, 8, 1, 1.6])
    flops = pd.DataFrame({COMPRESSED: [3.0, 15.0], UNCOMPRESSED: [1.2, 2.0]})
    assert reuse_time.diagnosis(table, flops, 6.0, "s").kind.value == "paper read two ways"
    above = reuse_time.diagnosis(table, flops, 10.0, "s")
    assert above.kind.value == "open" and above.text.endswith("the paper's 10x is above both")
    assert "the timing control (the reuse update timed again, known 1x) measures 1.00x (passes)" in above.text
    assert "two reuse updates back to back take 1.60x one" in above.text
    slow = table.assign(seconds=np.where(table.way == reuse_time.AGAIN, 1.5e-3, table.seconds))
    failed = reuse_time.diagnosis(slow, flops, 6.0, "s")  # between the readings, but the control reads 1.5x
    assert failed.kind.value == "open" and "measures 1.50x (FAILS)" in failed.text
