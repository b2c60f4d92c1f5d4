"""The energy experiment at smoke scale on a machine that looks like one with RAPL and writable
cpufreq (temporary sysfs trees): it measures under each governor for real, restores the
governors, labels every number, and takes its headline from the measured meter."""

import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from ondevice.device.energy import study
from ondevice.device.energy.study import hardware_note
from ondevice.papers.deeptype.experiments import energy_governors as exp
from ondevice.params import ParameterError
from smoke_runs import reading
from test_energy_governors import make_tree, settings
from test_energy_rapl import make_powercap

WATTS = 10.0


class FakePackage:
    """Advances the package counter as a 10 W CPU would, until stopped."""

    def __init__(self, root: Path):
        self.path = root / "intel-rapl:0" / "energy_uj"
        for f in root.rglob("max_energy_range_uj"):
            f.write_text(f"{2**40}\n")
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    max_gap = 0.0  # the longest time between two updates: how far a reading can lag the clock

    def run(self):
        start = last = time.monotonic()
        tmp = self.path.with_name("energy_uj.tmp")
        while not self.stop.wait(0.002):  # replaced whole, as a sysfs read never sees half a value
            now = time.monotonic()
            self.max_gap, last = max(self.max_gap, now - last), now
            tmp.write_text(f"{int((now - start) * WATTS * 1e6)}\n")
            os.replace(tmp, self.path)


@pytest.fixture(scope="module", params=reading("energy_governors"))
def measured_run(request, smoke_runs, speeches, tmp_path_factory):
    """A run of its own on the fake hardware (the notebook's smoke run measures what this machine
    has), with the global and SVD models of the notebook's one smoke run (a copy of its model cache,
    tests/smoke_runs.py): none trains here."""
    tmp = tmp_path_factory.mktemp("energy")
    shutil.copytree(smoke_runs(request.param).models, tmp / "models")
    cpu, powercap = make_tree(tmp / "cpu"), make_powercap(tmp / "powercap")
    before = settings(cpu)
    package = FakePackage(powercap)
    package.thread.start()
    params = exp.Params.for_scale("smoke", seeds=1, meters=("rapl",), cpufreq_root=str(cpu), rapl_root=str(powercap))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ONDEVICE_MODEL_CACHE", str(tmp / "models"))
        try:
            result = exp.run(params, speeches=speeches, log=lambda _: None)
        finally:
            package.stop.set()
    result.notes["fake_counter_max_gap_s"] = package.max_gap
    return result, cpu, before


def test_measures_under_each_governor_and_restores_them(measured_run):
    result, cpu, before = measured_run
    assert settings(cpu) == before
    cpufreq = result.notes["cpufreq"]
    assert cpufreq["usable"] and [s["governor"] for s in cpufreq["settings"]] == ["default", "powersave"]
    assert all(s["restored"] for s in cpufreq["settings"])
    assert cpufreq["settings"][0]["set"]["policy0"]["governor"] == "schedutil"
    assert cpufreq["settings"][1]["set"]["policy1"]["governor"] == "powersave"
    assert result.notes["measured_on_hardware"] == ["cpufreq", "rapl"] and result.notes["primary_meter"] == "rapl"
    assert all(result.notes["global_models_from_cache"].values())


def test_every_number_is_labelled_and_the_headline_is_measured(measured_run):
    result, _, _ = measured_run
    energy = result.tables["energy"]
    assert set(zip(energy.meter, energy.label)) == {("rapl", "measured"), ("modelled", "modelled")}
    rapl = energy[energy.meter == "rapl"]
    assert set(rapl.governor) == {"default", "powersave"} and (rapl.energy_j > 0).all()
    # a constant 10 W: energy is power x window, up to the counter's lag at either end of the window
    # (its updating thread can be starved on a loaded machine) and 20% for the window's own timing
    lag = 2 * result.notes["fake_counter_max_gap_s"]
    assert ((rapl.energy_j - WATTS * rapl.seconds).abs() <= WATTS * (lag + 0.2 * rapl.seconds)).all()
    assert set(result.tables["summary"].label) == {"measured", "modelled"}
    effects = result.tables["effects"]
    assert effects["meter"].iloc[0] == "measured: rapl"
    # the energy row is the combined variant's (all four optimisations); it quotes the fine-tuning row's change
    combined = f"all four optimisations combined change energy {effects['our change'][0]:+.0%} here"
    tune = f"fine-tuning alone changes training time {effects['our change'][1]:+.0%} (the paper's Table 2: "
    assert effects.diagnosis[0].startswith(combined) and tune in effects.diagnosis[0]
    assert effects["diagnosis kind"][0] in ("open", "hardware") and effects["diagnosis kind"][1] == ""
    assert set(result.tables["direction_claims"].meter) == {"rapl", "modelled"}
    backends = result.tables["backends"].set_index("meter")
    assert (
        backends.loc["rapl", "used for"] == "headline" and backends.loc["modelled", "used for"] == "reported beside it"
    )
    assert "Ran on real hardware in this run**: cpufreq, rapl" in hardware_note(result)
    accuracy = result.tables["accuracy"]
    assert len(accuracy) == 2 and accuracy.top_k_eff_fine_tune.between(0, 1).all()
    assert accuracy.top_k_eff_combined.between(0, 1).all()
    runs = result.tables["runs"]  # the combined variant trains the softmax of its user's own words only
    trained = {v: runs[runs.variant == v].trained_parameters.to_numpy() for v in ("fine_tune", "combined")}
    assert (trained["combined"] < trained["fine_tune"]).all()


def test_parameters_that_cannot_work_stop_before_any_work():
    with pytest.raises(ParameterError, match="governors"):
        exp.Params.for_scale("smoke", governors=("powersave",))
    with pytest.raises(ParameterError, match="governors"):
        exp.Params.for_scale("smoke", governors=("default", "khz:123"))
    with pytest.raises(ParameterError, match="energy_users"):
        exp.Params.for_scale("smoke", energy_users=5)
    with pytest.raises(ParameterError, match="primary_meter"):
        exp.Params.for_scale("smoke", primary_meter="rapl")  # not among the smoke preset's meters
    params = exp.Params.for_scale("smoke", meters=("rapl",), primary_meter="rapl", rapl_root="/nonexistent")
    with pytest.raises(ParameterError, match="cannot run here"):
        study.setup(params, log=lambda _: None)


def test_phone_job_under_each_governor_set_over_adb(monkeypatch):
    from ondevice.device.energy import study
    from ondevice.device.energy.android import Adb
    from test_energy_android import FakePhone

    class SlowJobPhone(FakePhone):
        def shell(self, command):
            if command.startswith("sh "):
                self.jobs.append(command)
                time.sleep(0.05)
            return super().shell(command)

    phone = SlowJobPhone(battery=((-500_000, 4_000_000),))
    phone.jobs = []
    before = dict(phone.files)
    monkeypatch.setattr(study, "Adb", lambda serial=None: Adb("ZX1G22ABC", runner=phone))
    params = exp.Params.for_scale(
        "smoke",
        meters=("android-battery",),
        android_serial="ZX1G22ABC",
        android_job="sh /data/local/tmp/train.sh {variant} {governor}",
    )
    env = study.setup(params, log=lambda _: None)
    assert env.phone[0] and env.backends_table().set_index("meter").loc["android-battery (phone job)", "available"]
    table = exp.measure_phone(params, env, log=lambda _: None)
    assert phone.jobs == [
        "sh /data/local/tmp/train.sh full interactive",
        "sh /data/local/tmp/train.sh fine_tune interactive",
        "sh /data/local/tmp/train.sh combined interactive",
        "sh /data/local/tmp/train.sh full powersave",
        "sh /data/local/tmp/train.sh fine_tune powersave",
        "sh /data/local/tmp/train.sh combined powersave",
    ]
    assert phone.files == before  # every CPU's governor put back
    assert (table.label == "measured").all() and (table.energy_j > 0).all()
    assert (table.energy_j / table.seconds).between(1.9, 2.1).all()  # the fake battery draws 2 W
    assert [s["governor"] for s in table.attrs["settings"]] == ["default", "powersave"]
    assert all(s["restored"] for s in table.attrs["settings"])
    fig = exp.plot_energy(table.assign(seed=0, user="phone job", note="").iloc[:0], table)
    assert fig.axes
