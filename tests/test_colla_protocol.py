"""Colla's protocol pieces on hand-made data: a client update that really trains and reports its
steps, scores that count unknown places as misses, the baselines' answers on tiny sequences, and
the rule that picks the client learning rate."""

import numpy as np
import pandas as pd
import pytest

from ondevice.data import places
from ondevice.models import mrnn
from ondevice.models.markov import Markov
from ondevice.papers.colla import common, protocol
from ondevice.papers.colla.experiments import colla
from ondevice.training.trainer import Trainer

HISTORY = 3


def device(uid: str, current: list[int], following: list[int], part: list[int]) -> places.DeviceSamples:
    """Samples whose last step is at `current` (other features 0) and whose label is `following`."""
    X = np.zeros((len(current), HISTORY, 6), np.int32)
    X[:, -1, 0] = current
    return places.DeviceSamples(uid, X, np.array(following, np.int32), np.array(part, np.int8))


def devices_of(*samples: places.DeviceSamples, n_places: int = 6) -> common.Devices:
    rule = places.PlaceRule(history=HISTORY, cycles=1)
    return common.Devices(
        places.PlaceData(rule, {s.uid: s for s in samples}, n_places, []), pd.DataFrame(), "hand-made"
    )


def test_scores_count_labels_of_no_known_place_as_misses():
    y = np.array([1, 2, places.ELSEWHERE, places.ELSEWHERE])
    s = protocol.scores(y, np.array([1, 3, places.ELSEWHERE, 2]))
    assert s["accuracy"] == 0.25 and s["recall"] == 0.25  # predicting "elsewhere" for elsewhere scores nothing
    assert s["test_unknown_places"] == 2 and s["test_samples"] == 4


def test_baselines_give_the_hand_worked_answers():
    # home 1 -> work 2 -> home 1 -> gym 3 -> home 1 (cycle 1); another device goes 4 -> 5 -> 4 -> 5 (cycle 1)
    a = device("a", [1, 2, 1, 3], [2, 1, 3, 1], [1, 1, 1, 1])
    b = device("b", [4, 5, 4, 1], [5, 4, 5, 3], [1, 1, 1, 1])
    devices = devices_of(a, b)
    pooled_x, pooled_y = devices.pooled([1], known_by=1)
    pooled = Markov(pooled_x[:, -1, 0], pooled_y)
    test_x = np.zeros((3, HISTORY, 6), np.int32)
    test_x[:, -1, 0] = [1, 3, 4]
    got = protocol.baselines(devices, "a", 1, pooled, test_x)
    assert got[protocol.CONTEXT].tolist() == [1, 3, 4]
    assert got["most frequent place"].tolist() == [1, 1, 1]
    # device a: 1 -> 2 once and 1 -> 3 once (tie: the smaller id 2); 3 -> 1; 4 never seen here: overall mode 1
    assert got[protocol.MARKOV].tolist() == [2, 1, 1]
    # pooled: 1 -> {2, 3, 3}: 3; 3 -> 1; 4 -> 5 twice
    assert got["Markov (pooled)"].tolist() == [3, 1, 5]


def test_client_update_trains_for_real_and_reports_its_steps():
    params = colla.Params.for_scale(
        "smoke", history=HISTORY, device_slots=6, client_max_epochs=15, patience=4, device_learning_rate=0.02
    )
    n_places = 8
    rt = protocol.Runtime(params, devices_of(device("a", [1], [2], [1]), device("b", [1], [2], [1]), n_places=8))
    rng = np.random.default_rng(0)
    x = np.stack([rng.integers(0, k, (200, HISTORY)) for k in [n_places, 24, 60, 7, 144, 144]], -1).astype(np.int32)
    y = (1 + x[:, -1, 1] % 3).astype(np.int32)  # places 1..3, learnable from the hour of the next step
    init = mrnn.build(params.device_config(n_places), 3).get_weights()
    init[-1] = np.zeros_like(init[-1])
    start = protocol.DeviceState(init, np.full(params.device_slots, -1))
    state, fit = protocol.client_update(rt, rt.plain, start, x, y, None, 0, "test")
    assert sorted(state.slot_places[state.slot_places >= 0].tolist()) == [1, 2, 3]
    assert fit["epochs"] >= params.patience + 1 or fit["epochs"] == params.client_max_epochs
    assert fit["steps"] == fit["epochs"] * 5  # 160 training samples, batch 32
    assert 1 <= fit["best_epoch"] <= fit["epochs"] and fit["steps_to_best"] == fit["best_epoch"] * 5
    assert fit["validation_new_places"] == 0.0
    # the kept weights are the best epoch's: their validation loss is the best one recorded
    keep = common.to_slots(state.slot_places, y)
    _, val = common.split_latest(x, keep, params.validation_fraction)
    rt.device_model.set_weights(state.weights)
    # one code path: fit_until_plateau recorded this same function of the same (kept) weights
    assert common.mean_cross_entropy(rt.device_model, *val) == pytest.approx(fit["best_validation_loss"], rel=1e-5)
    rt.device_model.set_weights(common.grow(init, start.slot_places, y)[0])
    assert fit["best_validation_loss"] < common.mean_cross_entropy(rt.device_model, *val) - 0.1  # it moved


def test_a_warm_started_fit_whose_epochs_all_score_worse_keeps_its_start():
    params = colla.Params.for_scale("smoke", history=HISTORY, learning_rate=0.05, cloud_patience=3)
    model = mrnn.build(params.cloud_config(6), 4)
    trainer = Trainer(model, common.location_task(params, 6), params.learning_rate)
    rng = np.random.default_rng(0)
    x = np.stack([rng.integers(0, k, (96, HISTORY)) for k in [6, 24, 60, 7, 144, 144]], -1).astype(np.int32)
    start = model.get_weights()
    # training labels 1, validation labels 2 on the same inputs: every epoch raises the validation loss
    weights, history = common.fit_until_plateau(
        trainer, start, (x, np.full(96, 1, np.int32)), (x, np.full(96, 2, np.int32)), params, rng, 10, 3
    )
    assert history.best_epoch == 0 and len(history) == 4  # epochs 1..4, patience 3 after epoch 1
    assert all(h["validation_loss"] > history.start_loss for h in history)
    assert all((w == s).all() for w, s in zip(weights, start))
    assert protocol.training_row(history)["steps_to_best"] == 0 and protocol.training_row(history)["steps"] == 12
    # the same labels on both sides: an epoch beats the start and is kept
    weights, history = common.fit_until_plateau(
        trainer, start, (x, np.full(96, 1, np.int32)), (x, np.full(96, 1, np.int32)), params, rng, 10, 3
    )
    assert history.best_epoch >= 1 and history[history.best_epoch - 1]["validation_loss"] < history.start_loss


def test_each_fit_times_only_its_own_steps():
    # a run's trainers are shared by every fit: a timer kept across fits made each epoch's steady-state
    # median cost more the longer the run
    params = colla.Params.for_scale("smoke", history=HISTORY, learning_rate=0.05)
    model = mrnn.build(params.cloud_config(6), 4)
    trainer = Trainer(model, common.location_task(params, 6), params.learning_rate)
    rng = np.random.default_rng(0)
    x = np.stack([rng.integers(0, k, (96, HISTORY)) for k in [6, 24, 60, 7, 144, 144]], -1).astype(np.int32)
    data = (x, np.full(96, 1, np.int32))
    for _ in range(2):
        _, history = common.fit_until_plateau(trainer, model.get_weights(), data, data, params, rng, 3, 2)
        assert len(trainer.timer.durations) == protocol.training_row(history)["steps"]
