"""A phone over adb, driven by a fake phone behind the injectable runner: battery power sampled
and integrated, governors set and restored as root, services held, the job run."""

import fnmatch
import shlex
import shutil

import pytest

from ondevice.device.energy.android import Adb, AndroidBatteryMeter, phone_cpufreq, run_job, services_held
from ondevice.device.energy.governors import Setting


class FakePhone:
    """Answers the adb commands the suite sends, from an in-memory sysfs; records every call."""

    def __init__(self, root=True, battery=((-500_000, 4_000_000),)):
        self.root, self.battery, self.calls = root, list(battery), []
        self.files = {}
        for i in range(4):  # the Nexus 6's kernel: one cpufreq directory per CPU
            d = f"/sys/devices/system/cpu/cpu{i}/cpufreq"
            self.files.update(
                {
                    f"{d}/affected_cpus": str(i),
                    f"{d}/scaling_governor": "interactive",
                    f"{d}/scaling_available_governors": "interactive ondemand userspace powersave performance",
                    f"{d}/scaling_available_frequencies": "300000 1497600 2649600",
                    f"{d}/cpuinfo_min_freq": "300000",
                    f"{d}/cpuinfo_max_freq": "2649600",
                    f"{d}/scaling_min_freq": "300000",
                    f"{d}/scaling_max_freq": "2649600",
                }
            )

    def __call__(self, argv):
        self.calls.append(argv)
        assert argv[0] == "adb"
        if argv[1:] == ["devices"]:
            return "List of devices attached\nZX1G22ABC\tdevice\n\n"
        assert argv[1:3] == ["-s", "ZX1G22ABC"] and argv[3] == "shell"
        return self.shell(argv[4])

    def shell(self, command):
        words = shlex.split(command)
        if words[:2] == ["su", "-c"]:
            if not self.root:
                return "su: not found"
            inner = shlex.split(words[2])
            if inner == ["id"]:
                return "uid=0(root) gid=0(root)"
            if inner[0] == "echo" and inner[2] == ">":
                if inner[3] not in self.files:
                    return f"sh: {inner[3]}: No such file or directory"
                self.files[inner[3]] = inner[1]
                return ""
            if inner[0] in ("stop", "start"):
                return ""
        if words[0] == "cat" and words[1].endswith("current_now"):
            current, voltage = self.battery.pop(0) if len(self.battery) > 1 else self.battery[0]
            return f"{current}\n{voltage}\n"
        if words[0] == "cat":
            return self.files.get(words[1], f"cat: {words[1]}: No such file or directory")
        if words[:2] == ["ls", "-d"]:
            dirs = sorted({f.rsplit("/", 1)[0] for f in self.files})
            return "\n".join(d for d in dirs if fnmatch.fnmatch(d, words[2]))
        if words[0] == "sh":
            return "job done"
        raise AssertionError(f"unexpected command {command!r}")


def test_adb_status_with_and_without_a_phone():
    assert Adb("ZX1G22ABC", runner=FakePhone()).status() == (True, "phone ZX1G22ABC")
    none = Adb(runner=lambda argv: "List of devices attached\n\n")
    assert none.status() == (False, "no phone attached (adb devices lists none)")
    if shutil.which("adb") is None:
        assert "not installed" in Adb().status()[1]


def test_battery_power_integrated_over_the_window():
    # -500 mA at 4.0 V (2 W), then 1000 mA at 4.0 V (4 W), sampled at t = 0, 1, 3
    phone = FakePhone(battery=[(-500_000, 4_000_000), (1_000_000, 4_000_000), (1_000_000, 4_000_000)])
    times = iter([0.0, 1.0, 3.0])
    meter = AndroidBatteryMeter(Adb("ZX1G22ABC", runner=phone), interval_s=None, clock=lambda: next(times))
    meter.start()
    meter.sample()
    reading = meter.stop()
    # trapezoid: (2 + 4) / 2 * 1 + 4 * 2 = 11 J over 3 s
    assert reading.joules == pytest.approx(11.0) and reading.seconds == 3.0 and reading.samples == 3
    assert reading.label == "measured" and "whole phone" in reading.note


def test_battery_sampler_thread():
    meter = AndroidBatteryMeter(Adb("ZX1G22ABC", runner=FakePhone()), interval_s=0.01)
    ok, detail = meter.status()
    assert ok and "2.00 W" in detail
    meter.start()
    import time

    time.sleep(0.1)
    reading = meter.stop()
    assert reading.samples > 3 and reading.joules == pytest.approx(2.0 * reading.seconds)


def test_governor_set_over_adb_and_restored():
    phone = FakePhone()
    cpufreq = phone_cpufreq(Adb("ZX1G22ABC", runner=phone))
    assert cpufreq.status()[0]
    assert [p.name for p in cpufreq.policies()] == ["cpu0", "cpu1", "cpu2", "cpu3"]
    assert cpufreq.performance_governor() == "interactive"
    before = dict(phone.files)
    with pytest.raises(RuntimeError):
        with cpufreq.use(Setting.parse("powersave")) as record:
            assert all(
                phone.files[f"/sys/devices/system/cpu/cpu{i}/cpufreq/scaling_governor"] == "powersave" for i in range(4)
            )
            raise RuntimeError("job failed")
    assert phone.files == before and record["restored"]
    assert any("su -c" in " ".join(c) for c in phone.calls)


def test_without_root_governors_cannot_be_set():
    cpufreq = phone_cpufreq(Adb("ZX1G22ABC", runner=FakePhone(root=False)))
    ok, why = cpufreq.status()
    assert not ok and "needs root" in why


def test_services_held_and_the_job_run():
    phone = FakePhone()
    adb = Adb("ZX1G22ABC", runner=phone)
    with services_held(adb, ("mpdecision",)):
        assert run_job(adb, "sh /data/local/tmp/train.sh fine_tune") == "job done"
        assert run_job(adb, lambda: 42) == 42
    commands = [c[4] for c in phone.calls if len(c) > 4]
    assert commands[0] == "su -c 'stop mpdecision'" and commands[-1] == "su -c 'start mpdecision'"
