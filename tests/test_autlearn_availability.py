"""AutLearn availability (A7): finishing inside availability windows, FLASH's phone layer times,
device profiles, and training across windows through the trainable TFLite file (real interpreter)."""

import json
import math

import numpy as np
import pytest

from ondevice.device import availability as av
from ondevice.device import device_profile, tflite
from ondevice.models import lstm_lm
from ondevice.papers.autlearn import traces
from ondevice.papers.autlearn.experiments import autlearn_availability as ex
from ondevice.params import ParameterError
from ondevice.tasks.next_word import NextWordTask
from ondevice.training.step import Step

WINDOWS = np.array([[0.0, 100.0], [200.0, 260.0], [1000.0, 2000.0]])


@pytest.mark.parametrize(
    "t0,need,step,overhead,expected",
    [
        (0, 100, 10, 0, 100),  # fills the first window exactly
        (0, 150, 10, 0, 250),  # 100 s in the first, 50 s into the second
        (0, 150, 10, 10, 1015),  # overhead: 9 + 5 steps in the first two windows, then 5 s restore + 1 step
        (50, 30, 10, 0, 30),  # starts inside a window
        (150, 30, 10, 0, 80),  # starts between windows: waits for the next
        (0, 120, 30, 0, 230),  # whole steps: 3 fit the first window (10 s lost), the 4th runs in the second
        (0, 0, 10, 0, 0),
        (0, 5000, 10, 0, math.inf),  # the windows run out
        (2500, 10, 10, 0, math.inf),
    ],
)
def test_finish_seconds(t0, need, step, overhead, expected):
    assert av.finish_seconds(WINDOWS, t0, need, step, overhead) == expected


def _finish_by_walking(windows, t0, need, step, overhead):
    """The same rule, one window at a time."""
    left = math.ceil(need / step - 1e-9)
    if left <= 0:
        return 0.0
    for a, b in windows:
        if b <= t0:
            continue
        a = max(a, t0)
        fits = math.floor(max(b - a - overhead, 0) / step)
        if fits >= left:
            return a + overhead / 2 + left * step - t0
        left -= fits
    return math.inf


def test_finish_seconds_for_many_start_times_matches_walking_the_windows():
    rng = np.random.default_rng(2)
    for _ in range(50):
        edges = np.sort(rng.uniform(0, 1e5, 2 * int(rng.integers(1, 12))))
        windows = edges.reshape(-1, 2)
        t0 = rng.uniform(-100, 1.1e5, 40)
        need, step, overhead = rng.uniform(0, 3e4), rng.uniform(1, 500), rng.choice([0.0, 30.0])
        got = av.finish_seconds(windows, t0, need, step, overhead)
        want = [_finish_by_walking(windows, t, need, step, overhead) for t in t0]
        np.testing.assert_allclose(got, want, rtol=1e-12)
    assert av.finish_seconds(np.zeros((0, 2)), 0.0, 10, 1) == math.inf


def test_finish_seconds_rejects_bad_steps():
    with pytest.raises(ValueError, match="step must be positive"):
        av.finish_seconds(WINDOWS, 0, 10, 0)


def test_fit_recovers_a_known_linear_layer_time():
    rng = np.random.default_rng(0)
    X = rng.choice(np.linspace(0.05, 1, 20), size=(400, 4))
    X[:, 2], X[:, 3] = rng.choice(np.arange(1, 11) / 10, 400), rng.choice([0.2, 0.4, 0.6, 0.8, 1.0], 400)
    coef = {
        "embedding": np.array([0.02, 0.001, 0.3, 0.0]),
        "lstm": np.array([0.3, 0.004, 0.001, 0.01]),
        "output": np.array([0.05, 0.0005, 0.0, 0.03]),
    }
    data = {layer: (X, av._work(layer, *av._denormalise(layer, X)) @ c) for layer, c in coef.items()}
    times = av.fit_layer_times("redmi_note8", data)
    for layer, c in coef.items():
        np.testing.assert_allclose(times.coef[layer], c, atol=1e-9)
    assert all(f["r2"] > 0.999999 and f["median_rel_error_seq_8_10_from_seq_le_6"] < 1e-6 for f in times.fit)


@pytest.fixture(scope="module")
def flash_times():
    return av.load_layer_times()


def test_flash_layer_times_fit_and_extrapolate_sensibly(flash_times):
    assert set(flash_times) == set(av.PHONES)
    config = lstm_lm.LSTMConfig(5027, 5000, 96, 160)
    for times in flash_times.values():
        assert all(f["measurements"] == 20000 and f["r2"] > 0.6 for f in times.fit)
        seconds = times.batch_seconds(config, 16, np.array([5.0, 10.0, 20.0]))
        assert (seconds > 0).all() and (np.diff(seconds) > 0).all()  # longer sequences take longer
        bigger = times.batch_seconds(lstm_lm.LSTMConfig(20027, 20000, 400, 400), 16, 10.0)
        assert bigger > seconds[1]
        assert times.outside_grid(config, 16, 8.0) == [] and times.outside_grid(config, 16, 20.0) == ["sequence length"]
    # the papers' phones differ (AutLearn: up to 2x between phones)
    per_phone = {p: float(t.batch_seconds(config, 16, 10.0)) for p, t in flash_times.items()}
    assert max(per_phone.values()) / min(per_phone.values()) > 1.2


def test_device_profile_is_a_runner_log_the_extrapolation_reads(flash_times, tmp_path):
    config = lstm_lm.LSTMConfig(827, 800, 32, 48)
    profile = av.device_profile(flash_times["redmi_note8"], config, 16, 8.0)
    path = tmp_path / "redmi.json"
    path.write_text(json.dumps(profile))
    loaded = device_profile.load_device_profile(path)
    e = device_profile.extrapolate_seconds(loaded, 100, 16.0)
    assert e["label"] == "extrapolated" and e["device"] == "Xiaomi Redmi Note 8"
    assert e["seconds"] == pytest.approx(100 * 2 * profile["steady_step_seconds"])


def test_phone_of_trace_models():
    assert av.phone_of("Redmi Note 8 Pro", "nexus6") == "redmi_note8"
    assert av.phone_of("SM-N970F", "nexus6") == "sumsung_note10"
    assert av.phone_of("CPH1801", "nexus6") == "nexus6"


def _module_and_batches(optimizer: str, steps: int = 6):
    model = lstm_lm.build(lstm_lm.LSTMConfig(40, 30, 8, 12), seed=3)
    task = NextWordTask(3)
    rng = np.random.default_rng(1)
    batches = [
        (rng.integers(1, 40, (4, n), dtype=np.int32), rng.integers(1, 30, (4, n), dtype=np.int32))
        for n in rng.integers(3, 8, steps)
    ]
    return model, task, tflite.convert(Step(model, task, 0.5, optimizer)), batches


@pytest.fixture(scope="module")
def sgd():
    return _module_and_batches("sgd")


def test_training_interrupted_at_window_edges_equals_uninterrupted(sgd, tmp_path):
    """SGD: the checkpoint (weights) is the whole training state, so resuming is exact."""
    model, task, flatbuffer, batches = sgd
    start = model.get_weights()
    whole = av.train_across_windows(flatbuffer, task, batches, [6], tmp_path / "whole")
    parts = av.train_across_windows(flatbuffer, task, batches, [2, 1, 3], tmp_path / "parts")
    a, b = av.checkpoint_weights(tmp_path / "whole", model), av.checkpoint_weights(tmp_path / "parts", model)
    assert whole == parts
    assert max(float(np.abs(x - y).max()) for x, y in zip(a, b)) == 0.0
    assert max(float(np.abs(x - s).max()) for x, s in zip(a, start)) > 1e-3  # training moved the weights
    # without restoring, the second window would start from the initial weights again
    lost = av.train_across_windows(flatbuffer, task, batches[2:], [4], tmp_path / "lost")
    assert lost != parts[2:]


def test_adam_state_is_not_in_the_checkpoint(tmp_path):
    """The limit of `save`/`restore`: weights only, so Adam's moments restart after a window edge."""
    model, task, flatbuffer, batches = _module_and_batches("adam", 4)
    av.train_across_windows(flatbuffer, task, batches, [4], tmp_path / "whole")
    av.train_across_windows(flatbuffer, task, batches, [2, 2], tmp_path / "parts")
    a, b = av.checkpoint_weights(tmp_path / "whole", model), av.checkpoint_weights(tmp_path / "parts", model)
    assert max(float(np.abs(x - y).max()) for x, y in zip(a, b)) > 1e-4


def test_train_across_windows_checks_the_schedule(sgd, tmp_path):
    model, task, flatbuffer, batches = sgd
    with pytest.raises(ValueError, match="hold 5 steps for 6 batches"):
        av.train_across_windows(flatbuffer, task, batches, [2, 3], tmp_path / "x")


@pytest.mark.parametrize(
    "override,name",
    [
        ({"variant": "half"}, "variant"),
        ({"epochs_grid": (1, 2)}, "epochs_grid"),
        ({"trace_source": "csv"}, "trace_source"),
        ({"trace": {"home_wifi": 1.5}}, r"trace\.home_wifi"),
        ({"resume_schedule": (3,)}, "resume_schedule"),
        ({"trace": {"model_weights": (1.0,)}}, r"trace\.model_weights"),
        ({"trace": {"bedtime": "late"}}, r"trace\.bedtime"),
        ({"trace": {"home_wif": 0.5}}, r"\['home_wif'\] in 'trace'"),
        ({"trace_home_wifi": 0.5}, r"\['trace_home_wifi'\]"),
        ({"unknown_phone": "pixel"}, "unknown_phone"),
        ({"trace_source": "flash", "trace_file": "/no/such/file"}, "trace_file"),
    ],
)
def test_bad_parameters_name_themselves(override, name):
    with pytest.raises(ParameterError, match=name):
        ex.Params.for_scale("smoke", **override)


def test_finish_within_day_on_a_hand_made_trace():
    import pandas as pd

    from ondevice.data.device_traces import AUTONOMOUS, FEDERATED, DeviceWindows
    from ondevice.papers.autlearn.traces import Trace

    day = 86400.0
    # one window 01:00-03:00 on each of two days; federated only on the second
    auto = np.array([[1 * 3600, 3 * 3600], [day + 3600, day + 3 * 3600]])
    device = DeviceWindows("d", "Nexus 6", 0.0, 3 * day, {AUTONOMOUS: auto, FEDERATED: auto[1:]})
    trace = Trace([device], "hand-made", True, (AUTONOMOUS, FEDERATED), {}, 0)
    params = ex.Params.for_scale("smoke", start_hours=(0, 2, 12), epochs_grid=(1, 5), window_overhead_s=0.0)
    phones = pd.DataFrame(
        [
            {"user": "u", "phone": "nexus6", "variant": v, "phone_step_seconds": 60.0, "phone_minutes_per_epoch": 10.0}
            for v in ex.VARIANTS
        ]
    )
    table = traces.finish_within_day(params, trace, phones).set_index(["condition", "variant", "epochs"])
    one = table.loc[(AUTONOMOUS, "fine_tune", 1)]
    # 10 min needed: from 00:00 done 01:10, from 02:00 done 02:10, from 12:00 done next day 01:10
    assert one.share_within_horizon == 1.0 and one.median_hours_to_finish == pytest.approx(1 + 10 / 60)
    five = table.loc[(AUTONOMOUS, "fine_tune", 5)]  # 50 min: from 02:00 only 60 min left that night -> 02:50
    assert five.share_within_horizon == 1.0
    fed = table.loc[(FEDERATED, "fine_tune", 1)]  # first window the next day: 25.17 h, 23.17 h, 13.17 h
    assert fed.share_within_horizon == pytest.approx(2 / 3)
    assert table.loc[(AUTONOMOUS, "full", 5)].training_minutes_needed == 50.0
    assert (AUTONOMOUS, "full", 1) not in table.index  # the other variant only at personal_epochs
