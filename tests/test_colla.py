"""Colla's model and techniques: M-RNN sizes and its stacked twin, dual distillation, the cloud's
client ensemble, model grouping, the customised FC, and the device/cloud privacy boundary."""

import numpy as np
import pandas as pd
import pytest
import tensorflow as tf

from numerics import assert_close_float32, float32_sum_tolerance, lstm_terms
from ondevice.data import places
from ondevice.models import mrnn
from ondevice.papers.colla import common, protocol
from ondevice.papers.colla.experiments import colla
from ondevice.papers.colla.techniques import grouping
from ondevice.papers.colla.techniques.boundary import Boundary, Download, Upload
from ondevice.papers.colla.techniques.cloud_update import ClientEnsemble
from ondevice.papers.colla.techniques.distillation import CloudTeacher, DistillationHook, FullTeacher
from ondevice.tasks.classification import ClassificationTask
from ondevice.training import model_cache
from ondevice.training.trainer import Trainer

HISTORY = 4
# An M-RNN's probabilities from two implementations: the LSTM's gate sums of 6 x 4 embedded inputs + 16
# recurrent + 1 over HISTORY steps, the FC's 16 + 1 terms and the softmax's sum over <= 30 outputs. A
# probability's relative error is its logit's absolute error (|logits| ~ 1 here), so the tolerance is
# that many eps of the largest probability; a slot switched on or off wrongly moves it by >= 1/30.
MRNN_TERMS = lstm_terms(HISTORY, 24, 16, layers=1) + 17 + 30
MRNN8_TERMS = lstm_terms(HISTORY, 48, 16, layers=1) + 17 + 30  # the same with 8-wide embeddings (6 x 8 inputs)


def ids(config: mrnn.MRNNConfig, n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.stack([rng.integers(0, k, (n, config.history)) for k in config.id_counts()], -1).astype(np.int32)


def slot_model(places_: int, slots: int, on: int, seed: int):
    model = mrnn.build(mrnn.MRNNConfig(places_, slots, 4, 16, HISTORY, slots=True), seed)
    w = model.get_weights()
    w[-1] = (np.arange(slots) < on).astype(np.float32)
    model.set_weights(w)
    return model


def test_parameter_counts_match_keras_and_the_papers_device_model():
    light, heavy = mrnn.MRNNConfig(368, 368, 4, 16, 6), mrnn.MRNNConfig(368, 368, 32, 128, 6)
    assert mrnn.parameter_count(light)["total"] == 11_868 == mrnn.build(light, 0).count_params()  # Sec. 3.2
    assert mrnn.parameter_count(heavy)["total"] == mrnn.build(heavy, 0).count_params()
    custom = mrnn.MRNNConfig(368, 50, 4, 16, 6, slots=True)
    assert mrnn.parameter_count(custom, 20)["fc"] == 17 * 20
    assert mrnn.inference_flops(light, 184) < mrnn.inference_flops(light)


def test_stacked_models_give_the_same_probabilities_as_keras():
    models = [slot_model(30, 12, 5 + k, seed=k) for k in range(3)]
    x = ids(mrnn.MRNNConfig(30, 12, 4, 16, HISTORY), 7)
    stacked = mrnn.stacked_probabilities([tf.constant(w) for w in mrnn.stack([m.get_weights() for m in models])], x)
    for k, m in enumerate(models):
        p = tf.nn.softmax(m(x)).numpy()
        assert_close_float32(stacked[k].numpy(), p, terms=MRNN_TERMS)
        assert np.all(p[:, 5 + k :] < 1e-12)  # switched-off slots get nothing


def test_distillation_loss_is_equation_2_exactly():
    teacher_model = mrnn.build(mrnn.MRNNConfig(30, 30, 8, 16, HISTORY), 3)
    student = mrnn.build(mrnn.MRNNConfig(30, 30, 4, 16, HISTORY), 4)
    task = ClassificationTask((HISTORY, 6), 30, input_dtype=tf.int32)
    x, y = ids(mrnn.MRNNConfig(30, 30, 4, 16, HISTORY), 9), np.arange(9, dtype=np.int32)
    lam = 0.3
    hook = DistillationHook(FullTeacher(teacher_model), lam)
    logits = student(x)
    total = float(task.loss(y, logits) + hook.extra_loss(x, y, logits))
    log_p = tf.nn.log_softmax(logits).numpy()
    q = tf.nn.softmax(teacher_model(x)).numpy()
    expected = lam * -log_p[np.arange(9), y].mean() + (1 - lam) * -(q * log_p).sum(-1).mean()
    # the same logits and teacher probabilities; TensorFlow's sparse cross-entropy (its own 30-word log-sum-exp)
    # and reductions vs NumPy's: 30 + 30 terms, the means of 9 and the 3-term mix of the positive parts.
    # Swapping lambda and 1 - lambda moves the total by ~3e-4 of it, 30x the tolerance.
    assert total == pytest.approx(expected, rel=float32_sum_tolerance(30 + 30 + 9 + 3, 1.0))
    with pytest.raises(ValueError, match="lambda"):
        DistillationHook(FullTeacher(teacher_model), 1.5)


def test_cloud_teacher_is_restricted_to_the_device_places_and_renormalised():
    cloud = mrnn.build(mrnn.MRNNConfig(30, 30, 8, 16, HISTORY), 5)
    teacher = CloudTeacher(cloud, slots=6)
    slot_places = np.array([7, 2, 19, -1, 0, -1])
    teacher.assign(cloud.get_weights(), slot_places)
    x = ids(mrnn.MRNNConfig(30, 30, 8, 16, HISTORY), 5)
    q = teacher(x).numpy()
    p = tf.nn.softmax(cloud(x)).numpy()
    assert_close_float32(q.sum(-1), np.ones(len(q)), terms=6 + 6 + 1)  # renormalised: two sums of 6 and a division
    assert np.all(q[:, [3, 5]] == 0)
    on = [0, 1, 2, 4]
    expected = p[:, slot_places[on]] / p[:, slot_places[on]].sum(-1, keepdims=True)
    np.testing.assert_allclose(
        q[:, on], expected, rtol=float32_sum_tolerance(MRNN8_TERMS + 13, 1.0)
    )  # and renormalised


def test_client_ensemble_averages_zero_padded_outputs_of_its_members():
    n_places = 25
    models = [slot_model(n_places, 8, 3 + k, seed=10 + k) for k in range(3)]
    slot_places = np.full((3, 8), -1)
    slot_places[0, :3] = [1, 2, 3]
    slot_places[1, :4] = [3, 4, 5, 6]
    slot_places[2, :5] = [0, 1, 10, 11, 12]
    ensemble = ClientEnsemble(models[0].get_weights(), max_clients=4, slots=8, places=n_places)
    ensemble.assign([m.get_weights() for m in models], slot_places)
    x = ids(mrnn.MRNNConfig(n_places, 8, 4, 16, HISTORY), 6)
    padded = np.zeros((3, 6, n_places))
    for k, m in enumerate(models):
        p = tf.nn.softmax(m(x)).numpy()
        on = slot_places[k] >= 0
        padded[k][:, slot_places[k][on]] = p[:, on]
    assert_close_float32(ensemble(x).numpy(), padded.mean(0), terms=MRNN_TERMS + 3)  # and the mean of 3
    ensemble.use([0, 2])
    assert_close_float32(ensemble(x).numpy(), padded[[0, 2]].mean(0), terms=MRNN_TERMS + 2)
    assert np.all(ensemble(x).numpy()[:, [4, 5, 6, 20]] == 0)  # no member holds these places


def test_grouping_finds_clear_groups_and_keeps_few_clients_together():
    rng = np.random.default_rng(0)
    centres = np.array([[0.0, 0.0], [10.0, 0.0]])
    points = np.concatenate([c + rng.normal(0, 0.5, (5, 2)) for c in centres])  # 10 clients
    distances = np.linalg.norm(points[:, None] - points[None], axis=-1)
    labels, table = grouping.choose_groups(distances, (2, 3, 5, 10), seed=0)
    assert len(np.unique(labels)) == 2 and len(set(labels[:5])) == 1 and len(set(labels[5:])) == 1
    assert table.loc[table.chosen, "K"].tolist() == [2]
    assert not table.set_index("K").loc[10, "reached"]  # K must be below the number of clients
    one, _ = grouping.choose_groups(distances[:2, :2])
    assert list(one) == [0, 0]


def test_output_distances_are_symmetric_with_a_zero_diagonal():
    models = [slot_model(20, 6, 4, seed=k) for k in (0, 0, 7)]  # two identical models, one other
    slot_places = np.tile(np.array([1, 2, 3, 4, -1, -1]), (3, 1))
    ensemble = ClientEnsemble(models[0].get_weights(), 3, 6, 20)
    ensemble.assign([m.get_weights() for m in models], slot_places)
    d = grouping.output_distances(ensemble, ids(mrnn.MRNNConfig(20, 6, 4, 16, HISTORY), 40), 3)
    np.testing.assert_allclose(d, d.T)
    assert np.all(np.diag(d) == 0) and d[0, 1] < d[0, 2]


def test_customised_fc_grows_with_new_places_up_to_its_capacity():
    config = mrnn.MRNNConfig(30, 4, 4, 16, HISTORY, slots=True)
    pulled = mrnn.build(mrnn.MRNNConfig(30, 30, 4, 16, HISTORY), 1).get_weights()
    weights = common.customise(pulled, mrnn.build(config, 2).get_weights())
    assert weights[-1].sum() == 0
    weights, slots = common.grow(weights, np.full(4, -1), np.array([9, 3, 9, 5]), (pulled[-2], pulled[-1]))
    assert slots.tolist() == [9, 3, 5, -1] and weights[-1].tolist() == [1, 1, 1, 0]
    np.testing.assert_array_equal(weights[-3][:, 1], pulled[-2][:, 3])
    weights, slots = common.grow(weights, slots, np.array([3, 8, 12]))
    assert slots.tolist() == [9, 3, 5, 8]  # 12 finds no free slot
    assert common.to_slots(slots, np.array([8, 12, 9])).tolist() == [3, -1, 0]


def test_client_update_with_dual_distillation_trains_and_stops_early():
    n_places, slots = 30, 8
    model = slot_model(n_places, slots, 5, seed=1)
    teacher = CloudTeacher(mrnn.build(mrnn.MRNNConfig(n_places, n_places, 8, 16, HISTORY), 2), slots)
    teacher.assign(teacher.model.get_weights(), np.array([1, 2, 3, 4, 5, -1, -1, -1]))
    params = colla.Params.for_scale("smoke", client_max_epochs=30, patience=3, learning_rate=0.05)
    trainer = Trainer(
        model,
        ClassificationTask((HISTORY, 6), slots, input_dtype=tf.int32),
        params.learning_rate,
        hooks=[DistillationHook(teacher, params.lam)],
    )
    x = ids(mrnn.MRNNConfig(n_places, slots, 4, 16, HISTORY), 80)
    y = (x[:, -1, 1] % 5).astype(np.int32)  # learnable from the hour feature
    train, val = common.split_latest(x, y, 0.25)
    start = model.get_weights()
    before = trainer.task.evaluate(model, val)["loss"]
    weights, history = common.fit_until_plateau(trainer, start, train, val, params, np.random.default_rng(0), 30)
    model.set_weights(weights)
    assert trainer.task.evaluate(model, val)["loss"] < before
    # the kept epoch's validation loss (SciPy's log-softmax and NumPy's mean) vs the task's (TensorFlow's): the
    # M-RNN's chain (6 x 4 embedded inputs + 16 + 1 over HISTORY steps, then 16 + 1) in another compiled
    # function, the 8-slot log-sum-exp and the mean over the validation samples
    terms = lstm_terms(HISTORY, 24, 16, layers=1) + 17 + slots + len(val[1])
    assert min(h["validation_loss"] for h in history) == pytest.approx(
        trainer.task.evaluate(model, val)["loss"], rel=float32_sum_tolerance(terms, 1.0)
    )
    assert len(history) <= 30


def test_the_boundary_lets_only_parameters_and_slot_maps_cross():
    boundary = Boundary()
    up = boundary.up(Upload("a", [np.ones(3, np.float32)], np.array([2, -1])))
    assert up.size == 3 and boundary.log[0][0] == "up"
    with pytest.raises(TypeError, match="float32"):
        Upload("a", [np.arange(6, dtype=np.int32)], np.array([1]))  # integer arrays are not parameters
    with pytest.raises(TypeError, match="only an Upload"):
        boundary.up(("a", np.zeros((2, 4, 6), np.int32)))
    with pytest.raises(TypeError, match="only a Download"):
        boundary.down("a", np.zeros(3, np.float32))


# --- the privacy invariant on a whole Colla run ------------------------------------------------


def _synthetic_devices(n_devices: int, rule: places.PlaceRule, n_places: int) -> common.Devices:
    rng = np.random.default_rng(42)
    devices = {}
    for k in range(n_devices):
        n = 60
        X = np.stack([rng.integers(0, c, (n, rule.history)) for c in [n_places, 24, 60, 7, 144, 144]], -1).astype(
            np.int32
        )
        y = rng.integers(1 + 3 * k, 5 + 3 * k, n).astype(np.int32)  # each device its own places
        part = np.repeat(np.arange(rule.cycles + 2), n // (rule.cycles + 2)).astype(np.int8)
        devices[f"d{k}"] = places.DeviceSamples(f"d{k}", X, y, part)
    data = places.PlaceData(rule, devices, n_places, [])
    return common.Devices(data, pd.DataFrame(), "synthetic")


def _arrays(obj, seen=None):
    """Every NumPy array and tf.Variable value reachable from obj's attributes and containers."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        yield obj
    elif isinstance(obj, tf.Variable):
        yield obj.numpy()
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _arrays(v, seen)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _arrays(v, seen)
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        for v in vars(obj).values():
            yield from _arrays(v, seen)


def leaked_rows(private: np.ndarray, arrays) -> int:
    """How many of the private sample rows appear, as values, in any of the arrays (cast to int)."""
    rows = {r.tobytes() for r in private.reshape(len(private), -1).astype(np.int64)}
    width = private.reshape(len(private), -1).shape[1]
    found = 0
    for a in arrays:
        flat = np.asarray(a).ravel()
        if flat.size < width or not np.all(np.isfinite(flat)) or not np.all(flat == np.round(flat)):
            continue
        windows = np.lib.stride_tricks.sliding_window_view(flat.astype(np.int64), width)
        found += sum(w.tobytes() in rows for w in windows)
    return found


def test_no_device_sample_reaches_the_cloud_side():
    params = colla.Params.for_scale(
        "smoke", history=3, cycles=2, client_max_epochs=2, patience=1, cloud_embedding=4, cloud_hidden=8, device_slots=8
    )
    n_places = 16
    rule = places.PlaceRule(history=3, cycles=2)
    devices = _synthetic_devices(3, rule, n_places)
    cloud_w = mrnn.build(params.cloud_config(n_places), 0).get_weights()
    pull_w = mrnn.build(params.device_config(n_places, customised=False), 0).get_weights()
    entry = lambda w: model_cache.Entry("k", None, w, {"history": []}, True)
    boot = common.Bootstrapped({params.seed: entry(cloud_w)}, {params.seed: entry(pull_w)})
    rt = protocol.Runtime(params, devices)
    run = protocol.run_seed(params, devices, boot, rt, params.seed, log=lambda *a: None)
    crossings = run.boundary.log
    assert {c[0] for c in crossings} == {"up", "down"}
    assert all(isinstance(c[2], Upload if c[0] == "up" else Download) for c in crossings)
    assert sum(c[0] == "up" for c in crossings) == 3 * params.cycles
    # the device samples the cloud must never see: every part after the bootstrap data
    private = np.concatenate([d.take(list(range(1, rule.cycles + 2)))[0] for d in devices.data.devices.values()])
    payloads = [a for c in crossings for a in c[2].parameters]
    assert leaked_rows(private, payloads) == 0
    # nor does anything the cloud side holds (its runtime included) contain a private sample
    cloud = protocol.Cloud(rt, cloud_w, devices.cloud_data(), params.seed)
    cloud.update([c[2] for c in crossings if c[0] == "up"][-3:], cycle=9)
    assert leaked_rows(private, list(_arrays(cloud))) == 0
    # the check is not blind: a payload smuggling samples as floats is found
    smuggled = Upload("d0", [private[:2].astype(np.float32)], np.array([1]))
    assert leaked_rows(private, smuggled.parameters) >= 2


def test_customization_can_remove_at_most_the_fc_share_of_a_prediction():
    """The FLOP claim's diagnosis: the FC over every place is what Customization can trim, a share
    that falls with the history the LSTM reads; whether a history reaches the paper's +100% decides the kind."""
    import json
    from pathlib import Path

    from ondevice.papers.colla import fc_share
    from ondevice.papers.colla.experiments import colla_cost

    params = colla_cost.Params.for_scale("smoke")
    same = params.device_config(40, customised=False)
    full, lstm_only = mrnn.inference_flops(same), mrnn.inference_flops(same, 0)
    assert full - lstm_only == 2 * same.hidden_units * 40 + 40  # the FC's products and biases
    costs = pd.DataFrame({"cycle": [1, 2, 2, 2], "places_held": [1, 3, 5, 9]})
    table = fc_share.curve(params, 40, costs)
    assert list(table.history) == list(range(1, 13)) and table.ours.sum() == 1
    ours = table[table.ours].iloc[0]
    assert ours.history == params.history and ours["fc share of Same"] == pytest.approx((full - lstm_only) / full)
    assert ours[fc_share.CHANGE] == pytest.approx(full / mrnn.inference_flops(same, 5) - 1)
    assert (np.diff(table["fc share of Same"]) < 0).all() and (np.diff(table[fc_share.CHANGE]) < 0).all()
    note = fc_share.diagnosis(table)  # 40 places: no history reaches +100%, the places alone keep ours
    assert f"a median 5 in its last cycle, {ours[fc_share.CHANGE]:+.1%}" in note.text and note.kind.value == "data"
    assert "reached at no history in 1..12" in note.text
    wide = fc_share.diagnosis(fc_share.curve(params, 400, costs))  # short histories reach it: the reading decides
    assert wide.kind.value == "paper read two ways" and "step(s) or fewer" in wide.text
    notebook = json.loads((Path(__file__).parents[1] / "notebooks/colla/colla_cost.ipynb").read_text())
    assert f"## {note.section}" in {"".join(c["source"]).split("\n")[0] for c in notebook["cells"]}
