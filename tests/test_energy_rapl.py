"""RAPL through a temporary powercap tree: zones, deltas modulo max_energy_range_uj, the poller
thread for windows with several wraps, and a reason when the counters cannot be read."""

import os
import time
from pathlib import Path

import pytest

from ondevice.device.energy.base import MeterUnavailable
from ondevice.device.energy.rapl import POWERCAP, RaplMeter, find_zones

RANGE = 1_000_000  # uJ: a tiny range, so tests wrap often


def make_powercap(root: Path, package_uj: int = 0, dram_uj: int = 0) -> Path:
    """Like /sys/class/powercap: the control directory, package-0 with core/uncore/dram
    subzones (flat links and nested directories) and a psys zone."""
    (root / "intel-rapl").mkdir(parents=True)
    (root / "intel-rapl" / "enabled").write_text("1\n")
    zones = {
        "intel-rapl:0": ("package-0", package_uj),
        "intel-rapl:0/intel-rapl:0:0": ("core", 5),
        "intel-rapl:0/intel-rapl:0:1": ("uncore", 5),
        "intel-rapl:0/intel-rapl:0:2": ("dram", dram_uj),
        "intel-rapl:1": ("psys", 7),
    }
    for rel, (name, value) in zones.items():
        d = root / rel
        d.mkdir(parents=True)
        (d / "name").write_text(name + "\n")
        (d / "energy_uj").write_text(f"{value}\n")
        (d / "max_energy_range_uj").write_text(f"{RANGE}\n")
    for rel in ("intel-rapl:0:0", "intel-rapl:0:1", "intel-rapl:0:2"):  # the flat links sysfs also has
        os.symlink(root / "intel-rapl:0" / rel, root / rel)
    return root


def set_counter(root: Path, zone: str, value: int) -> None:
    path = root / ("intel-rapl:0" if zone == "package" else "intel-rapl:0/intel-rapl:0:2") / "energy_uj"
    path.write_text(f"{value % RANGE}\n")


def test_package_and_dram_zones_each_once(tmp_path):
    root = make_powercap(tmp_path / "powercap")
    zones = find_zones(str(root))
    assert sorted(z.name for z in zones) == ["dram", "package-0"]
    assert all(z.max_range_uj == RANGE for z in zones)
    ok, detail = RaplMeter(str(root)).status()
    assert ok and "package-0" in detail and "dram" in detail


def test_delta_is_taken_modulo_the_range_across_a_wrap(tmp_path):
    root = make_powercap(tmp_path / "powercap", package_uj=RANGE - 100, dram_uj=10)
    meter = RaplMeter(str(root), poll_s=None)
    meter.start()
    set_counter(root, "package", 400)  # wrapped: 100 + 400 = 500 uJ
    set_counter(root, "dram", 260)  # 250 uJ
    reading = meter.stop()
    assert reading.parts["package-0"] == pytest.approx(500e-6)
    assert reading.joules == pytest.approx(750e-6)
    assert reading.label == "measured" and reading.samples == 2


def test_polling_keeps_count_over_several_wraps(tmp_path):
    root = make_powercap(tmp_path / "powercap")
    meter = RaplMeter(str(root), poll_s=None)
    meter.start()
    total = 0
    for _ in range(5):  # 0.7 of the range between reads: five wraps in all
        total += 700_000
        set_counter(root, "package", total)
        meter.poll()
    reading = meter.stop()
    assert reading.parts["package-0"] == pytest.approx(total * 1e-6)
    assert reading.samples == 7
    # without the polls the same window would have lost every whole wrap
    lost = RaplMeter(str(root), poll_s=None)
    lost.start()
    set_counter(root, "package", total + 3_500_000)
    assert lost.stop().parts["package-0"] == pytest.approx(0.5)


def test_poller_thread_reads_during_the_window(tmp_path):
    root = make_powercap(tmp_path / "powercap")
    meter = RaplMeter(str(root), poll_s=0.01)
    meter.start()
    total = 0
    for _ in range(4):
        seen = meter._samples
        total += 600_000
        set_counter(root, "package", total)
        deadline = time.time() + 10
        while meter._samples < seen + 2 and time.time() < deadline:  # two polls: the new value was read
            time.sleep(0.005)
    reading = meter.stop()
    assert reading.parts["package-0"] == pytest.approx(total * 1e-6)
    assert meter._thread is None


def test_unreadable_or_absent_counters_give_a_reason(tmp_path, monkeypatch):
    ok, why = RaplMeter(str(tmp_path / "absent")).status()
    assert not ok and "absent" in why
    root = make_powercap(tmp_path / "powercap")

    def denied(zone):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(RaplMeter, "_read", staticmethod(denied))
    ok, why = RaplMeter(str(root)).status()
    assert not ok and "root" in why
    with pytest.raises(MeterUnavailable):
        RaplMeter(str(root)).start()


@pytest.mark.skipif(not Path(POWERCAP).is_dir(), reason="no /sys/class/powercap on this machine (no RAPL)")
def test_real_rapl_counts_energy():
    meter = RaplMeter()
    ok, why = meter.status()
    if not ok:
        pytest.skip(f"RAPL present but not usable: {why}")
    meter.start()
    sum(i * i for i in range(2_000_000))
    reading = meter.stop()
    assert reading.joules > 0 and reading.seconds > 0
