"""Device-state trace readers (FLASH, FedScale) on hand-written fixtures, their errors on malformed
input, the synthetic FLASH-format generator, and the trace manifests (declared, not offline)."""

import atexit
import json
import pickle
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
import yaml

from ondevice.data import device_traces as dt
from ondevice.data import manifests

# Hand-written traces in the two formats, written to files as the readers expect them.
FLASH_TRACE = {
    "1": {
        "guid": "fixture-1",
        "model": "Redmi Note 8",
        "messages": (
            "2021-03-01 00:00:00\twifi\n"
            "2021-03-01 00:00:00\tscreen_on\n"
            "2021-03-01 01:00:00\tbattery_charged_on\n"
            "2021-03-01 01:00:00\t55%\n"
            "2021-03-01 01:30:00\tscreen_off\n"
            "2021-03-01 01:30:05\tscreen_lock\n"
            "2021-03-01 03:30:00\t4g\n"
            "2021-03-01 04:30:00\tscreen_on\n"
            "2021-03-01 04:30:01\tscreen_unlock\n"
            "2021-03-01 05:00:00\tbattery_charged_off\n"
            "2021-03-02 00:00:00\tscreen_off\n"
        ),
    },
    "2": {
        "guid": "fixture-2",
        "model": "Nexus 6",
        "messages": (
            "2021-03-01 00:00:00\tscreen_off\n"
            "2021-03-01 22:00:00\tbattery_charged_on\n"
            "2021-03-01 20:00:00\tWIFI\n"
            "2021-03-02 02:00:00\tphone_off\n"
            "2021-03-02 03:00:00\tphone_on\n"
            "2021-03-02 06:00:00\tbattery_charged_off\n"
            "\n"
            "2021-03-03 00:00:00\tbattery_okay\n"
        ),
    },
}
FEDSCALE_TRACE = {
    1: {
        "duration": 5400,
        "inactive": [7200, 12600],
        "finish_time": 86400,
        "active": [3600, 10800],
        "model": "Redmi Note 8",
    },
    7: {"duration": 0, "inactive": [], "finish_time": 172800, "active": [], "model": "SM-N970F"},
}
FIXTURES = Path(tempfile.mkdtemp(prefix="ondevice-trace-fixtures-"))
atexit.register(shutil.rmtree, FIXTURES, True)
FLASH = FIXTURES / "flash_state_traces.json"
FLASH.write_text(json.dumps(FLASH_TRACE, indent=1))
FEDSCALE = FIXTURES / "fedscale_client_behave_trace.pkl"
FEDSCALE.write_bytes(pickle.dumps(FEDSCALE_TRACE, protocol=0))
H = 3600.0


def minutes(windows) -> float:
    return float((windows[:, 1] - windows[:, 0]).sum()) / 60


def test_flash_fixture_screen_off_rule():
    one, two = dt.read_flash(FLASH)
    assert (one.device, one.model, two.model) == ("1", "Redmi Note 8", "Nexus 6")
    assert one.days == 1.0 and two.days == 2.0
    # device 1: charging 01:00-05:00, screen off 01:30-04:30, Wi-Fi until 03:30
    assert minutes(one.windows[dt.CHARGING]) == 240
    assert minutes(one.windows[dt.AUTONOMOUS]) == 180
    np.testing.assert_array_equal(one.windows[dt.FEDERATED] - one.start, [[1.5 * H, 3.5 * H]])
    assert one.minutes_per_day(dt.FEDERATED) == 120
    # device 2: the out-of-order Wi-Fi line takes its place by time; phone_off 02:00-03:00 stops charging
    assert minutes(two.windows[dt.CHARGING]) == 7 * 60
    assert two.minutes_per_day(dt.AUTONOMOUS) == two.minutes_per_day(dt.FEDERATED) == 210
    np.testing.assert_array_equal(two.windows[dt.FEDERATED] - two.start, [[22 * H, 26 * H], [27 * H, 30 * H]])


def test_flash_fixture_locked_rule():
    one, two = dt.read_flash(FLASH, idle="locked")
    assert minutes(one.windows[dt.AUTONOMOUS]) == pytest.approx(180 - 4 / 60)  # locked 01:30:05-04:30:01
    assert minutes(one.windows[dt.FEDERATED]) == pytest.approx(120 - 5 / 60)
    assert minutes(two.windows[dt.AUTONOMOUS]) == 0 and len(two.windows[dt.AUTONOMOUS]) == 0
    with pytest.raises(ValueError, match="idle rule"):
        dt.read_flash(FLASH, idle="asleep")


def test_fedscale_fixture():
    one, seven = dt.read_fedscale(FEDSCALE)
    assert (one.device, one.model, seven.model) == ("1", "Redmi Note 8", "SM-N970F")
    assert list(one.windows) == [dt.CHARGING]
    np.testing.assert_array_equal(one.windows[dt.CHARGING], [[3600, 7200], [10800, 12600]])
    assert one.days == 1.0 and one.minutes_per_day(dt.CHARGING) == 90
    assert seven.days == 2.0 and seven.minutes_per_day(dt.CHARGING) == 0


def _flash_with(tmp_path, messages, uid="9"):
    path = tmp_path / "state_traces.json"
    path.write_text(json.dumps({uid: {"guid": "g", "model": "m", "messages": messages}}))
    return path


@pytest.mark.parametrize(
    "line,message",
    [
        ("2021-03-01 00:00:00 wifi", "expected 'YYYY-mm-dd HH:MM:SS<TAB>state'"),
        ("2021-13-01 00:00:00\twifi", "timestamp '2021-13-01 00:00:00'"),
        ("2021-03-01 25:00:00\twifi", "timestamp"),
        ("2021-03-01 00:00:00\tscreen_sideways", "unknown state 'screen_sideways'"),
        ("2021-03-01 00:00:00\t150%", "battery level '150%'"),
        ("2021-03-01 00:00:00\tx%", "battery level 'x%'"),
    ],
)
def test_flash_malformed_line_names_file_device_and_line(tmp_path, line, message):
    path = _flash_with(tmp_path, f"2021-03-01 00:00:00\twifi\n\n{line}\n", uid="dev7")
    with pytest.raises(dt.TraceError, match=message) as err:
        dt.read_flash(path)
    assert f"{path}: device dev7: line 3:" in str(err.value)


@pytest.mark.parametrize(
    "doc,message",
    [
        ([1, 2], "expected a JSON object"),
        ({"5": "text"}, "device 5: expected an object with a 'messages' string"),
        ({"5": {"model": "m", "messages": ["a"]}}, "device 5: expected an object"),
        ({"5": {"model": "m", "messages": "\n\n"}}, "device 5: no events"),
    ],
)
def test_flash_malformed_structure(tmp_path, doc, message):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(dt.TraceError, match=message) as err:
        dt.read_flash(path)
    assert str(path) in str(err.value)


def test_flash_not_json(tmp_path):
    path = tmp_path / "t.json"
    path.write_text('{"1": {"messages": "x"')
    with pytest.raises(dt.TraceError, match=r"not valid JSON \(line 1"):
        dt.read_flash(path)


GOOD = {"duration": 10, "active": [0, 20], "inactive": [5, 25], "finish_time": 100, "model": "m"}


@pytest.mark.parametrize(
    "change,message",
    [
        ({"finish_time": None, "model": None}, "expected a dict with keys"),
        ({"active": [0]}, "equal length"),
        ({"active": [6, 20]}, "entry 0: need 0 <= active <= inactive"),
        ({"inactive": [5, 125]}, "entry 1: need 0 <= active <= inactive <= finish_time"),
        ({"active": [0, 4], "inactive": [5, 25]}, "entry 1: starts at 4, before the previous period ends"),
        ({"finish_time": 0}, "finish_time must be positive"),
        ({"active": ["a", 20]}, "must hold numbers"),
    ],
)
def test_fedscale_malformed_entry_names_file_client_and_entry(tmp_path, change, message):
    entry = {**GOOD, **change}
    entry = {k: v for k, v in entry.items() if v is not None}
    path = tmp_path / "client_behave_trace"
    path.write_bytes(pickle.dumps({3: GOOD, 42: entry}))
    with pytest.raises(dt.TraceError, match=message) as err:
        dt.read_fedscale(path)
    assert f"{path}: client 42" in str(err.value)


class _Payload:
    def __reduce__(self):
        return (print, ("this must never run",))


def test_fedscale_pickle_with_code_or_garbage_is_refused(tmp_path):
    path = tmp_path / "evil"
    path.write_bytes(pickle.dumps({1: _Payload()}))
    with pytest.raises(dt.TraceError, match="refusing to load builtins.print"):
        dt.read_fedscale(path)
    path.write_bytes(pickle.dumps([1, 2]))
    with pytest.raises(dt.TraceError, match="expected a dict"):
        dt.read_fedscale(path)
    path.write_bytes(FEDSCALE.read_bytes()[:40])
    with pytest.raises(dt.TraceError, match="not a FedScale client_behave_trace pickle"):
        dt.read_fedscale(path)


def test_fedscale_numpy_scalars_are_plain_data(tmp_path):
    path = tmp_path / "np"
    path.write_bytes(pickle.dumps({1: {**GOOD, "active": [np.int64(0), np.int64(20)], "finish_time": np.float64(100)}}))
    (one,) = dt.read_fedscale(path)
    assert one.minutes_per_day(dt.CHARGING) == pytest.approx(10 / 60 / (100 / 86400))


def test_synthetic_trace_round_trips_and_is_deterministic(tmp_path):
    model = dt.SyntheticModel()
    doc = dt.synthetic_flash(12, 3, np.random.default_rng(5), model)
    assert doc == dt.synthetic_flash(12, 3, np.random.default_rng(5), model)
    assert doc != dt.synthetic_flash(12, 3, np.random.default_rng(6), model)
    path = tmp_path / "state_traces.json"
    path.write_text(json.dumps(doc))
    devices = dt.read_flash(path)
    assert len(devices) == 12 and {d.model for d in devices} <= set(model.models)
    for d in devices:
        assert 2.5 <= d.days < 4.5  # the last night ends the trace when the phone charges overnight
        fed, auto, charge = (d.minutes_per_day(c) for c in (dt.FEDERATED, dt.AUTONOMOUS, dt.CHARGING))
        assert 0 <= fed <= auto <= charge < 24 * 60
    assert np.median([d.minutes_per_day(dt.AUTONOMOUS) for d in devices]) > 0
    # habits move the minutes: no overnight charging, no daytime top-ups -> nothing to train in
    never = dt.SyntheticModel(night_charge_a=1e-3, night_charge_b=1e3, day_charges=0.0)
    idle = dt.flash_devices(dt.synthetic_flash(5, 2, np.random.default_rng(0), never))
    assert all(d.minutes_per_day(dt.CHARGING) < 1 for d in idle)


def test_trace_manifests_declare_official_locations_and_refuse_to_fetch_unchecked(tmp_path, monkeypatch):
    monkeypatch.setenv("ONDEVICE_DATA_CACHE", str(tmp_path / "cache"))
    for name, host in (("flash_traces", "PKU-Chengxu/FLASH"), ("fedscale_traces", "SymbioticLab/FedScale")):
        m = manifests.load(name)
        assert m.available_offline is False and m.scales == ()
        assert host in m.artifacts[0].sources[0]["url"]
        with pytest.raises(manifests.DataError, match="declared without a checksum") as err:
            manifests.resolve(m, "trace")
        assert host in str(err.value) and str(m.path) in str(err.value)
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.*"))


def test_unchecked_artifact_needs_available_offline_false(tmp_path):
    doc = yaml.safe_load((manifests.MANIFEST_DIR / "flash_traces.yaml").read_text())
    doc["available_offline"] = True
    path = tmp_path / "x.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(manifests.DataError, match="sha256 may be null only with available_offline: false"):
        manifests.load(path)
