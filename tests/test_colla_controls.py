"""Colla's known-answer controls on planted data: devices that walk a first-order Markov chain, so
a model that learns the chain reaches the chain's table and an untrained one does not; the
patience conversion; and how many devices a split of days with data keeps."""

import dataclasses

import numpy as np
import pandas as pd
import pytest

from ondevice.data import places
from ondevice.models import mrnn
from ondevice.papers.colla import common, controls, protocol
from ondevice.papers.colla.experiments import colla

HISTORY = 3
N_PLACES = 7  # ids 1..6 are places, 0 is "elsewhere"
NEXT = {1: 2, 2: 3, 3: 1, 4: 5, 5: 6, 6: 4}  # the planted chain's likeliest next place


def walk(uid: str, n: int, rng: np.random.Generator, p_follow: float = 0.85) -> places.DeviceSamples:
    """`n` samples per part (parts 0, 1, 2) of a walk that follows NEXT with `p_follow`, else jumps
    to another place; time features are noise, so the last place is all there is to learn."""
    steps = [int(rng.integers(1, N_PLACES))]
    for _ in range(3 * n + HISTORY):
        here = steps[-1]
        others = [p for p in range(1, N_PLACES) if p not in (here, NEXT[here])]
        steps.append(NEXT[here] if rng.random() < p_follow else int(rng.choice(others)))
    seq = np.array(steps)
    X = np.zeros((3 * n, HISTORY, 6), np.int32)
    for i in range(3 * n):
        X[i, :, 0] = seq[i : i + HISTORY]
    for k, size in enumerate((24, 60, 7, 144, 144), start=1):
        X[..., k] = rng.integers(0, size, X.shape[:2])
    y = seq[HISTORY : 3 * n + HISTORY].astype(np.int32)
    return places.DeviceSamples(uid, X, y, np.repeat(np.arange(3), n).astype(np.int8))


def planted(n_devices: int = 3, n: int = 120, seed: int = 0) -> common.Devices:
    rng = np.random.default_rng(seed)
    rule = places.PlaceRule(history=HISTORY, cycles=1, bootstrap_days=2, cycle_days=2)
    samples = {f"d{i}": walk(f"d{i}", n, rng) for i in range(n_devices)}
    return common.Devices(places.PlaceData(rule, samples, N_PLACES, [], None, {}), pd.DataFrame(), "planted")


def params(**overrides) -> colla.Params:
    fields = dict(
        history=HISTORY,
        cycles=1,
        cloud_embedding=8,
        cloud_hidden=16,
        device_embedding=4,
        device_hidden=16,
        device_slots=8,
        learning_rate=0.02,
        device_learning_rate=0.02,
        ct_max_epochs=40,
        cloud_patience=5,
        client_max_epochs=60,
        patience=5,
        patience_steps=0,
        control_devices=2,
    )
    return colla.Params.for_scale("smoke", **(fields | overrides))


def test_ct_model_reaches_the_planted_chains_table_and_an_untrained_one_does_not():
    devices, p = dataclasses.replace(planted(), inputs=common.INPUTS[1]), params()
    trained = controls.ct_control(p, devices, 0)
    # the table on 80% of 2 x 3 x 120 samples finds NEXT: about p_follow = 0.85 of the test labels
    assert trained["Markov accuracy"] > 0.75
    assert trained["verdict"] == "passes", trained
    assert trained["model accuracy"] >= trained["Markov accuracy"] - p.control_tolerance
    assert trained["steps_to_best"] > 0
    untrained = mrnn.build(p.cloud_config(devices.places), 5).get_weights()
    fresh = controls.ct_control(p, devices, 0, run_ct=(untrained, 7))
    assert fresh["verdict"] == "fails" and fresh["model accuracy"] < 0.5
    assert fresh["steps_to_best"] == 7 and fresh["inputs"] == common.INPUTS[1]


def test_device_model_on_the_top_devices_reaches_their_tables():
    devices, p = planted(n_devices=3, n=150), params()
    devices.data.devices["d2"] = dataclasses.replace(
        devices.data.devices["d2"], part=np.where(devices.data.devices["d2"].part == 1, 0, 2).astype(np.int8)
    )  # d2 has no cycle-1 data: never a top device
    assert controls.top_devices(p, devices) == ["d0", "d1"]
    rt = protocol.Runtime(p, devices)
    got = controls.device_control(p, dataclasses.replace(devices, inputs=common.INPUTS[1]), rt, 0)
    assert got["devices"] == 2 and got["Markov accuracy"] > 0.75
    assert got["verdict"] == "passes", got


def test_last_place_only_keeps_the_tables_input_and_nothing_else():
    x = np.arange(2 * HISTORY * 6, dtype=np.int32).reshape(2, HISTORY, 6) + 1
    out = common.last_place_only(x)
    assert out[:, -1, 0].tolist() == x[:, -1, 0].tolist()
    assert out.sum() == x[:, -1, 0].sum()


def test_a_devices_view_gives_every_sample_with_the_inputs_it_names():
    paper = planted()
    table = dataclasses.replace(paper, inputs=common.INPUTS[1])
    for parts in ([0], [1, 2]):
        (x, y), (tx, ty) = paper.samples("d1", parts, 2), table.samples("d1", parts, 2)
        assert (ty == y).all() and (tx == common.last_place_only(x)).all()
        assert (x[:, :-1] != 0).any()  # the paper's view keeps the other steps and features
    pooled_x, _ = table.pooled([0, 1], 1)
    assert pooled_x[:, :-1].sum() == 0 and pooled_x[:, -1, 1:].sum() == 0


def choice_table(paper: list[tuple[float, float, float]], markov: float = 0.27, table_input: float = 0.26):
    """An input_choice table: the paper's inputs at (dropout, decay, accuracy) each, then the last place only."""
    rows = [(common.INPUTS[0], d, w, a) for d, w, a in paper] + [(common.INPUTS[1], 0.0, 0.0, table_input)]
    frame = pd.DataFrame(rows, columns=["inputs", "feature_dropout", "weight_decay", "held-out accuracy"])
    return frame.assign(**{"Markov held-out accuracy": markov})


def test_the_regularization_rule_takes_the_highest_held_out_accuracy_ties_to_the_earlier():
    grid = [(0.0, 0.0, 0.20), (0.0, 1e-4, 0.23), (0.5, 0.0, 0.255), (0.5, 1e-4, 0.255)]
    assert controls.chosen_regularization(choice_table(grid)) == (0.5, 0.0)
    assert controls.chosen_regularization(choice_table(grid[:2])) == (0.0, 1e-4)


def test_the_input_rule_keeps_the_papers_inputs_unless_their_held_out_control_fails():
    # the paper's inputs even below the last place only, while within the tolerance of the table
    assert controls.chosen_inputs(choice_table([(0.0, 0.0, 0.20), (0.5, 0.0, 0.255)]), 0.02) == common.INPUTS[0]
    assert controls.chosen_inputs(choice_table([(0.5, 0.0, 0.251)]), 0.02) == common.INPUTS[0]  # 0.019 below
    assert controls.chosen_inputs(choice_table([(0.0, 0.0, 0.20), (0.5, 0.0, 0.24)]), 0.02) == common.INPUTS[1]


def test_the_held_out_split_is_each_devices_latest_fifth_of_its_training_parts():
    devices, p = planted(n=50), params()
    (tx, ty), (vx, vy) = controls.held_out_split(p, devices)
    n = 2 * 50  # parts 0..cycles = 0, 1; the test period (part 2) is never read
    assert len(ty) + len(vy) == 3 * n and len(vy) == 3 * 20
    x, y = devices.samples("d0", [0, 1], 1)
    assert (vx[:20] == x[-20:]).all() and (vy[:20] == y[-20:]).all()


def test_input_choice_trains_for_real_and_prefers_the_table_input_on_noise_features():
    # time features are noise in the planted walk: the last place is all there is to learn
    devices, p = planted(n=120), params()
    p = dataclasses.replace(p, feature_dropout_grid=(0.0, 0.5), weight_decay_grid=(0.0,))
    choice = controls.input_choice(p, devices, log=lambda *a: None)
    assert choice.inputs.tolist() == [common.INPUTS[0]] * 2 + [common.INPUTS[1]]
    assert choice.feature_dropout.tolist() == [0.0, 0.5, 0.0]
    assert (choice.steps_to_best > 0).all()
    table_input = choice.set_index("inputs").loc[common.INPUTS[1]]
    assert table_input["held-out accuracy"] >= table_input["Markov held-out accuracy"] - p.control_tolerance


def test_control_summary_judges_the_means_over_seeds_with_the_tolerance():
    rows = [
        controls.row("(1) CT vs pooled Markov", "x", s, m, 0.30, 0.02)
        for s, m in enumerate((0.27, 0.29))  # mean 0.28: exactly the tolerance below
    ] + [controls.row("(2) device model vs its Markov", "x", 0, 0.25, 0.30, 0.02)]
    frame = pd.DataFrame(rows)
    assert frame.verdict.tolist() == ["fails", "passes", "fails"]
    summary = controls.summary(frame)
    assert summary.verdict.tolist() == ["passes", "fails"]
    assert summary.seeds.tolist() == [2, 1]
    assert summary["model accuracy"].iloc[0] == pytest.approx(0.28)


def test_patience_in_steps_converts_the_papers_device():
    p = params(patience=20, patience_steps=160, batch_size=32)
    assert common.client_patience(p, 234) == 20  # the paper's device: 8 steps an epoch x 20
    assert common.client_patience(p, 20) == 160  # one step an epoch: 160 epochs
    assert common.client_patience(p, 64) == 80
    assert common.client_patience(params(patience=20, patience_steps=0), 20) == 20


def test_qualification_counts_devices_with_the_days_each_split_needs():
    rule = places.PlaceRule(bootstrap_days=6, cycle_days=5, cycles=3)
    data = places.PlaceData(rule, {}, 1, [], None, {"a": 26, "b": 50, "c": 110, "d": 25})
    table = common.Devices(data, pd.DataFrame(), "hand-made").qualification(3).set_index("split")
    assert table.loc["this run", "days_needed"] == 26 and table.loc["this run", "devices_qualifying"] == 3
    assert table.loc["paper: first month, T = 20 days", "days_needed"] == 110
    assert table.loc["paper: first month, T = 20 days", "devices_qualifying"] == 1
    assert table.loc["10-day bootstrap and cycles", "devices_qualifying"] == 2
    assert (table.devices_read == 4).all()


def test_client_update_stops_on_the_validation_places_its_training_part_has():
    p = params(patience=3, client_max_epochs=10)
    devices = planted()
    rt = protocol.Runtime(p, devices)
    rng = np.random.default_rng(1)
    x = np.zeros((50, HISTORY, 6), np.int32)
    x[:, -1, 0] = rng.integers(1, 4, 50)
    y = np.array([NEXT[c] for c in x[:, -1, 0]], np.int32)
    y[-4:] = 6  # the latest samples go to a place the training part never has
    init = mrnn.build(p.device_config(N_PLACES), 3).get_weights()
    init[-1] = np.zeros_like(init[-1])
    state, fit = protocol.client_update(
        rt, rt.plain, protocol.DeviceState(init, np.full(p.device_slots, -1)), x, y, None, 0, "t"
    )
    keep = common.to_slots(state.slot_places, y)
    _, (vx, vy) = common.split_latest(x, keep, p.validation_fraction)
    assert fit["validation_new_places"] == pytest.approx(4 / 10)
    rt.device_model.set_weights(state.weights)
    learnable = vy != keep[-1]
    assert common.mean_cross_entropy(rt.device_model, vx[learnable], vy[learnable]) == pytest.approx(
        fit["best_validation_loss"], rel=1e-5
    )


def test_a_random_client_split_is_reproducible_and_the_controls_table_holds_out_the_same_samples():
    p = params(client_split="random")
    x = np.arange(50 * HISTORY * 6, dtype=np.int32).reshape(50, HISTORY, 6)
    y = np.arange(50, dtype=np.int32)
    (tx, ty), (vx, vy) = common.client_split(p, x, y, 0, "control/d0")
    (_, ty2), (_, vy2) = common.client_split(p, x, y, 0, "control/d0")
    assert ty.tolist() == ty2.tolist() and vy.tolist() == vy2.tolist() and len(vy) == 10
    assert sorted(ty.tolist() + vy.tolist()) == y.tolist()
    assert vy.tolist() != y[-10:].tolist()  # not the latest fifth
    assert common.client_split(p, x, y, 1, "control/d0")[1][1].tolist() != vy.tolist()
    latest = common.client_split(params(), x, y, 0, "control/d0")[1][1]
    assert latest.tolist() == y[-10:].tolist()


def test_the_loss_readings_and_the_random_accuracy_reading_train_the_device_model_to_its_planted_table():
    # the latest fifth watched by accuracy is left out: on this walk its 48 held-out samples reach
    # their best accuracy after 24 steps, while the model is at 0.59 on the test against the table's
    # 0.87, and a tie never replaces the epoch kept; that is what stop_choice measures on real data
    devices = dataclasses.replace(planted(n_devices=2, n=150), inputs=common.INPUTS[1])
    for split, monitor in (("latest", "loss"), ("random", "loss"), ("random", "accuracy")):
        p = params(client_split=split, client_monitor=monitor)
        got = controls.device_control(p, devices, protocol.Runtime(p, devices), 0)
        assert got["verdict"] == "passes" and got["steps_to_best"] > 0, (split, monitor, got)


def test_the_setting_choice_reads_no_test_period_and_its_rule_takes_the_most_accurate_triple():
    devices, p = planted(n_devices=2, n=60), params(seeds=1, rate_grid=(0.02, 0.2))
    before = {u: d.part.copy() for u, d in devices.data.devices.items()}
    for d in devices.data.devices.values():  # the test period (part 2) is unreadable: its labels become -5
        d.y[d.part == 2] = -5
    choice = controls.setting_choice(p, devices, log=lambda *a: None)
    assert len(choice) == 2 * len(common.CLIENT_SPLITS) * len(common.CLIENT_MONITORS)
    assert choice["model accuracy"].between(0, 1).all() and (choice["Markov accuracy"] > 0.6).all()
    assert all((d.part == before[u]).all() for u, d in devices.data.devices.items())
    # the rate is what the fits ran with: a tenfold rate moves the model (same seed, same data)
    by_rate = choice.set_index(["split", "monitor", "rate"])["steps_to_best"]
    assert (by_rate.xs(0.02, level="rate") != by_rate.xs(0.2, level="rate")).any()
    frame = lambda accs: pd.DataFrame(  # noqa: E731
        {
            "rate": [0.01] * 4 + [0.1] * 4,
            "split": ["latest", "latest", "random", "random"] * 2,
            "monitor": ["loss", "accuracy"] * 4,
            "model accuracy": accs,
        }
    )
    assert controls.chosen_setting(frame([0.25, 0.27, 0.26, 0.2, 0.2, 0.2, 0.29, 0.2])) == (0.1, "random", "loss")
    assert controls.chosen_setting(frame([0.2, 0.2, 0.2, 0.28, 0.28, 0.2, 0.2, 0.2])) == (0.01, "random", "accuracy")
    ties = frame([0.27, 0.27, 0.26, 0.2, 0.27, 0.2, 0.2, 0.2])
    assert controls.chosen_setting(ties) == (0.01, "latest", "loss")  # ties: the earlier
