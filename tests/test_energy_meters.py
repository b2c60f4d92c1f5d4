"""NVML and Zeus against fakes (and on real hardware when there is any), an external meter's CSV
matched by timestamp, windows over several meters, and discovery with reasons."""

import numpy as np
import pandas as pd
import pytest

from ondevice.device.energy import meters
from ondevice.device.energy.base import Meter, MeterUnavailable, Reading, measuring
from ondevice.device.energy.external import ExternalCsvMeter, PowerLog, unit_scale, window_energies
from ondevice.device.energy.nvml import NvmlMeter, import_nvml
from ondevice.device.energy.zeus_meter import ZeusMeter, import_monitor


class FakeNvml:
    """The few pynvml calls the meter makes; counters in mJ advance by `step_mj` per read."""

    class NVMLError(Exception):
        pass

    def __init__(self, count=2, supported=True, step_mj=1500):
        self.count, self.supported, self.step_mj = count, supported, step_mj
        self.counters = {i: 10_000 * (i + 1) for i in range(count)}
        self.open = 0

    def nvmlInit(self):
        self.open += 1

    def nvmlShutdown(self):
        self.open -= 1

    def nvmlDeviceGetCount(self):
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        return b"Fake V100"

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        if not self.supported:
            raise self.NVMLError("Not Supported")
        self.counters[h] += self.step_mj
        return self.counters[h]


def test_nvml_energy_from_the_total_energy_counter():
    nv = FakeNvml()
    clock = iter([0.0, 2.5])
    meter = NvmlMeter(nvml=nv, clock=lambda: next(clock))
    ok, detail = meter.status()
    assert ok and "GPU 1 Fake V100" in detail and nv.open == 0
    meter.start()
    reading = meter.stop()
    assert reading.parts == {"gpu0": 1.5, "gpu1": 1.5} and reading.joules == pytest.approx(3.0)
    assert reading.seconds == 2.5 and reading.note == "" and nv.open == 0


def test_nvml_short_window_is_flagged_and_old_gpus_are_refused():
    clock = iter([0.0, 0.2])
    meter = NvmlMeter(nvml=FakeNvml(count=1), clock=lambda: next(clock))
    meter.start()
    assert "shorter than 1.0 s" in meter.stop().note
    ok, why = NvmlMeter(nvml=FakeNvml(supported=False)).status()
    assert not ok and "Volta" in why
    ok, why = NvmlMeter(nvml=FakeNvml(count=0)).status()
    assert not ok and "no NVIDIA GPU" in why


def test_real_nvml_when_installed_and_a_gpu_is_present():
    try:
        import_nvml()
    except MeterUnavailable as exc:
        pytest.skip(str(exc))
    meter = NvmlMeter()
    ok, why = meter.status()
    if not ok:
        pytest.skip(why)
    import time

    meter.start()
    time.sleep(1.2)
    assert meter.stop().joules > 0


class FakeMeasurement:
    def __init__(self):
        self.time, self.gpu_energy, self.cpu_energy, self.dram_energy = 2.0, {0: 5.0}, {0: 7.0}, None


class FakeMonitor:
    windows = []

    def __init__(self, gpu_indices=None, cpu_indices=None):
        pass

    def begin_window(self, key, sync_execution=True):
        self.windows.append(("begin", key, sync_execution))

    def end_window(self, key, sync_execution=True, cancel=False):
        self.windows.append(("end", key, cancel))
        return FakeMeasurement()


def test_zeus_cross_check_sums_gpu_cpu_and_dram():
    meter = ZeusMeter(monitor_class=FakeMonitor)
    assert meter.status()[0]
    meter.start()
    reading = meter.stop()
    assert reading.joules == 12.0 and reading.parts == {"gpu0": 5.0, "cpu0": 7.0} and reading.label == "measured"
    assert FakeMonitor.windows[0] == ("begin", "ondevice", False)


def test_zeus_absent_is_a_reason_not_an_error():
    try:
        import_monitor()
    except MeterUnavailable as exc:
        assert "pip install zeus" in str(exc)
        assert not ZeusMeter().status()[0]
    else:
        pytest.skip("zeus is installed here")


def test_units_come_from_column_names():
    assert unit_scale("Time(ms)", "s") == 1e-3 and unit_scale("Main(mA)", "a") == 1e-3
    assert unit_scale("Main Voltage(V)", "v") == 1.0 and unit_scale("power_mW", "w") == 1e-3
    assert unit_scale("time", "s") == 1.0 and unit_scale("current [uA]", "a") == 1e-6


def write_monsoon(path, seconds=5.0, rate=100):
    t = np.arange(0, seconds * 1000 + 1e-9, 1000 / rate)  # ms since the capture began
    current = np.where(t < 2000, 250.0, 500.0)  # mA: a step at t = 2 s
    pd.DataFrame({"Time(ms)": t, "Main(mA)": current, "Main Voltage(V)": 4.0}).to_csv(path, index=False)


def test_external_csv_matched_by_timestamp(tmp_path):
    path = tmp_path / "monsoon.csv"
    write_monsoon(path)
    origin = 1_700_000_000.0  # epoch second of Time(ms) = 0
    log = PowerLog.read_csv(path, ("Time(ms)", "Main(mA)", "Main Voltage(V)"), time_origin=origin)
    # 1 s at 1 W then 1 s at 2 W (the step is linear between two samples 10 ms apart)
    joules, samples = log.energy_between(origin + 1.0, origin + 3.0)
    assert joules == pytest.approx(3.0, abs=0.01) and samples == 199
    clock = iter([origin + 2.5, origin + 4.5])
    meter = ExternalCsvMeter(path, ("Time(ms)", "Main(mA)", "Main Voltage(V)"), origin, clock=lambda: next(clock))
    assert meter.status()[0]
    meter.start()
    reading = meter.stop()
    assert reading.joules == pytest.approx(4.0) and reading.seconds == pytest.approx(2.0)
    windows = pd.DataFrame(
        {"start_epoch_s": [origin + 0.5, origin + 4.0], "stop_epoch_s": [origin + 1.5, origin + 9.0]}
    )
    out = window_energies(log, windows)
    assert out.energy_j.iloc[0] == pytest.approx(1.0) and np.isnan(out.energy_j.iloc[1])


def test_external_csv_with_a_power_column_and_missing_columns(tmp_path):
    path = tmp_path / "log.csv"
    pd.DataFrame({"time_s": [10.0, 11.0, 12.0], "power_W": [2.0, 2.0, 4.0]}).to_csv(path, index=False)
    log = PowerLog.read_csv(path, ("time_s", "power_W"))
    assert log.energy_between(10.0, 12.0)[0] == pytest.approx(5.0)
    with pytest.raises(ValueError, match="outside the log"):
        log.energy_between(9.0, 11.0)
    with pytest.raises(ValueError, match="no column"):
        PowerLog.read_csv(path, ("t", "power_W"))


class Counting(Meter):
    name, label = "counting", "measured"

    def __init__(self, fail=False):
        self.started = self.stopped = self.aborted = 0
        self.fail = fail

    def start(self):
        if self.fail:
            raise MeterUnavailable("cannot")
        self.started += 1

    def stop(self):
        self.stopped += 1
        return Reading(self.name, self.label, 1.0, 1.0, 2)

    def abort(self):
        self.aborted += 1


def test_measuring_opens_one_window_of_every_meter_and_aborts_on_errors():
    a = Counting()
    with measuring([a]) as readings:
        pass
    assert readings["counting"].joules == 1.0 and a.stopped == 1
    b = Counting()
    with pytest.raises(RuntimeError):
        with measuring([b]):
            raise RuntimeError("training failed")
    assert b.aborted == 1 and b.stopped == 0
    c, d = Counting(), Counting(fail=True)
    with pytest.raises(MeterUnavailable):
        with measuring([c, d]):
            pass
    assert c.aborted == 1


def test_discovery_gives_every_meter_a_reason(tmp_path):
    backends = {b.name: b for b in meters.discover(rapl_root=str(tmp_path / "none"))}
    assert set(backends) == set(meters.MEASURED_METERS)
    assert not backends["rapl"].available and "absent" in backends["rapl"].detail
    assert not backends["external-csv"].available and "external_csv" in backends["external-csv"].detail
    assert all(b.detail for b in backends.values())
    assert all(b.label == "measured" for b in backends.values())
