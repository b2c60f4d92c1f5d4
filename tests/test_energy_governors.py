"""Governor control on temporary cpufreq sysfs trees: read, set, and always restore every policy,
also after an exception, SIGINT, SIGTERM, and (through the recovery file) after SIGKILL."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ondevice import REPO_ROOT
from ondevice.device.energy.governors import CpuFreq, CpuFreqError, LocalFiles, PolicyState, Setting

FREQS = (300000, 1000000, 2000000)
START = {"scaling_governor": "schedutil", "scaling_min_freq": "300000", "scaling_max_freq": "2000000"}


def make_tree(
    root: Path, policies: int = 2, governors: str = "performance powersave schedutil", per_cpu: bool = False
) -> Path:
    """A cpufreq tree like /sys/devices/system/cpu: policyN directories (or old cpuN/cpufreq)."""
    for i in range(policies):
        d = root / (f"cpu{i}/cpufreq" if per_cpu else f"cpufreq/policy{i}")
        d.mkdir(parents=True)
        files = {
            "affected_cpus": str(i),
            "related_cpus": str(i),
            "scaling_driver": "acpi-cpufreq",
            "scaling_available_governors": governors,
            "scaling_available_frequencies": " ".join(map(str, FREQS)),
            "cpuinfo_min_freq": str(FREQS[0]),
            "cpuinfo_max_freq": str(FREQS[-1]),
            **START,
        }
        for name, value in files.items():
            (d / name).write_text(value + "\n")
    return root


def settings(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_text().strip() for p in sorted(root.rglob("scaling_*_freq"))} | {
        str(p.relative_to(root)): p.read_text().strip() for p in sorted(root.rglob("scaling_governor"))
    }


@pytest.fixture
def tree(tmp_path):
    return make_tree(tmp_path / "cpu")


def cpufreq(tree, tmp_path, **kw):
    return CpuFreq(str(tree), recovery_file=tmp_path / "restore.json", **kw)


def test_reads_policies_governors_and_frequencies(tree, tmp_path):
    cf = cpufreq(tree, tmp_path)
    policies = cf.policies()
    assert [p.name for p in policies] == ["policy0", "policy1"]
    assert policies[1].cpus == (1,) and policies[0].frequencies_khz == FREQS
    assert policies[0].state == PolicyState("schedutil", 300000, 2000000)
    assert cf.status()[0] and cf.performance_governor() == "schedutil"
    assert cf.table()[0]["governors"] == "performance powersave schedutil"


def test_old_kernel_layout_with_per_cpu_directories(tmp_path):
    root = make_tree(tmp_path / "cpu", per_cpu=True)
    cf = cpufreq(root, tmp_path)
    assert [p.name for p in cf.policies()] == ["cpu0", "cpu1"]
    before = settings(root)
    with cf.use(Setting.parse("powersave")):
        assert (root / "cpu1/cpufreq/scaling_governor").read_text() == "powersave"
    assert settings(root) == before


def test_set_for_a_run_then_restore_every_policy(tree, tmp_path):
    cf = cpufreq(tree, tmp_path)
    before = settings(tree)
    with cf.use(Setting.parse("powersave")) as record:
        assert all((tree / f"cpufreq/policy{i}/scaling_governor").read_text() == "powersave" for i in range(2))
        assert (tmp_path / "restore.json").is_file()  # written before anything was changed
    assert settings(tree) == before
    assert record["restored"] and record["set"]["policy0"]["governor"] == "powersave"
    assert record["before"]["policy1"]["governor"] == "schedutil"
    assert not (tmp_path / "restore.json").exists()


class OrderedFiles(LocalFiles):
    """Rejects a write that would leave scaling_min_freq above scaling_max_freq, as the kernel does."""

    def write(self, path, value):
        d = Path(path).parent
        lo, hi = int((d / "scaling_min_freq").read_text()), int((d / "scaling_max_freq").read_text())
        if (
            path.endswith("scaling_min_freq")
            and int(value) > hi
            or path.endswith("scaling_max_freq")
            and int(value) < lo
        ):
            raise OSError(22, "Invalid argument", path)
        super().write(path, value)


def test_frequency_limits_are_written_in_an_order_the_kernel_accepts(tree, tmp_path):
    cf = CpuFreq(str(tree), OrderedFiles(), recovery_file=False)
    before = settings(tree)
    with cf.use(Setting.parse("lowest")):
        assert (tree / "cpufreq/policy0/scaling_max_freq").read_text() == "300000"
    assert settings(tree) == before
    with cf.use(Setting.parse("khz:2000000")):
        assert (tree / "cpufreq/policy1/scaling_min_freq").read_text() == "2000000"
    assert settings(tree) == before


def test_restore_after_an_exception(tree, tmp_path):
    cf, before = cpufreq(tree, tmp_path), settings(tree)
    with pytest.raises(ZeroDivisionError):
        with cf.use(Setting.parse("performance")):
            _ = 1 / 0
    assert settings(tree) == before


def test_restore_after_sigint(tree, tmp_path):
    cf, before = cpufreq(tree, tmp_path), settings(tree)
    with pytest.raises(KeyboardInterrupt):
        with cf.use(Setting.parse("powersave")):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # the handler interrupts this
    assert settings(tree) == before


def test_a_governor_not_offered_fails_and_changes_nothing(tree, tmp_path):
    cf, before = cpufreq(tree, tmp_path), settings(tree)
    with pytest.raises(CpuFreqError, match="interactive"):
        with cf.use(Setting.parse("interactive")):
            pass
    assert settings(tree) == before


def test_absent_or_read_only_sysfs_says_so(tmp_path, tree):
    ok, why = CpuFreq(str(tmp_path / "nothing")).status()
    assert not ok and "no cpufreq policies" in why

    class ReadOnly(LocalFiles):
        def writable(self, path):
            return False

    ok, why = CpuFreq(str(tree), ReadOnly()).status()
    assert not ok and "read-only" in why
    with pytest.raises(CpuFreqError):
        with CpuFreq(str(tmp_path / "nothing")).use(Setting.parse("powersave")):
            pass


CHILD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from ondevice.device.energy.governors import CpuFreq, Setting
    cf = CpuFreq(sys.argv[1], recovery_file=Path(sys.argv[2]))
    with cf.use(Setting.parse("powersave")):
        Path(sys.argv[3]).write_text("ready")
        time.sleep(60)
""")


def _child_under_powersave(tree: Path, tmp_path: Path) -> subprocess.Popen:
    ready = tmp_path / "ready"
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT / "lib"))
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tree), str(tmp_path / "restore.json"), str(ready)], env=env
    )
    deadline = time.time() + 60
    while not ready.exists():
        assert child.poll() is None and time.time() < deadline, "child did not start"
        time.sleep(0.05)
    assert (tree / "cpufreq/policy0/scaling_governor").read_text() == "powersave"
    return child


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_restore_when_another_process_is_stopped_by_a_signal(tree, tmp_path, sig):
    before = settings(tree)
    child = _child_under_powersave(tree, tmp_path)
    child.send_signal(sig)
    child.wait(timeout=30)
    assert settings(tree) == before
    assert not (tmp_path / "restore.json").exists()


def test_recovery_file_undoes_a_killed_run(tree, tmp_path):
    before = settings(tree)
    child = _child_under_powersave(tree, tmp_path)
    child.kill()  # SIGKILL: nothing can restore in the process itself
    child.wait(timeout=30)
    assert settings(tree) != before
    states = cpufreq(tree, tmp_path).recover()
    assert set(states) == {"policy0", "policy1"} and settings(tree) == before
    assert cpufreq(tree, tmp_path).recover() is None  # nothing left to do


def test_the_papers_governors_by_name(tree, tmp_path):
    cf = cpufreq(tree, tmp_path)
    assert cf.setting_for("default") == Setting("schedutil", name="default")
    assert cf.setting_for("powersave") == Setting.parse("powersave")
    for f in tree.rglob("scaling_driver"):
        f.write_text("intel_pstate\n")
    lowest = cf.setting_for("powersave")  # intel_pstate's own powersave is dynamic: pin max to the minimum
    assert lowest.governor == "powersave" and lowest.max_khz == "min"
    with cf.use(lowest):
        assert (tree / "cpufreq/policy0/scaling_max_freq").read_text() == "300000"
