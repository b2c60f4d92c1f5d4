"""Power profiles in both power_profile.xml forms, the modelled meter against hand-computed
cases, and the shipped Nexus 6 profile."""

import pytest

from ondevice.device.energy import profiles
from ondevice.device.energy.modelled import GovernorModel, ModelledMeter

OLD = """<?xml version="1.0" encoding="utf-8"?>
<device name="Android">
  <item name="cpu.awake">2</item>
  <item name="cpu.idle">1</item>
  <array name="cpu.speeds"><value>100000</value><value>200000</value></array>
  <array name="cpu.active"><value>10</value><value>30</value></array>
  <item name="battery.capacity">1000</item>
</device>"""

NEW = """<?xml version="1.0" encoding="utf-8"?>
<device name="Android">
  <item name="cpu.suspend">1</item>
  <item name="cpu.idle">2</item>
  <item name="cpu.active">4</item>
  <array name="cpu.clusters.cores"><value>2</value><value>2</value></array>
  <item name="cpu.cluster_power.cluster0">3</item>
  <item name="cpu.cluster_power.cluster1">6</item>
  <array name="cpu.core_speeds.cluster0"><value>300000</value><value>600000</value></array>
  <array name="cpu.core_power.cluster0"><value>5</value><value>12</value></array>
  <array name="cpu.core_speeds.cluster1"><value>500000</value><value>1000000</value></array>
  <array name="cpu.core_power.cluster1"><value>20</value><value>50</value></array>
</device>"""


def test_old_form_hand_computed():
    p = profiles.parse(OLD)
    assert p.form == profiles.PRE_81 and p.speeds() == (100000, 200000)
    assert (p.awake_ma, p.suspend_ma, p.battery_mah) == (2, 1, 1000)
    # 2 s at 100 MHz and 1 s at 200 MHz: 10*2 + 30*1 running, + 2 mA awake for 3 s = 56 mA*s; at 4 V: 0.224 J
    assert p.charge_mas({100000: 2.0, 200000: 1.0}) == pytest.approx(56.0)
    assert p.energy_j({100000: 2.0, 200000: 1.0}, voltage=4.0) == pytest.approx(0.224)
    # awake for a longer wall time, two busy cores: 2*(10*2 + 30*1) + 2*5 = 110 mA*s
    assert p.charge_mas({100000: 2.0, 200000: 1.0}, wall_s=5.0, cores=2) == pytest.approx(110.0)
    assert p.energy_j({100000: 2.0}, 4.0, include_awake=False) == pytest.approx(0.08)


def test_new_form_hand_computed():
    p = profiles.parse(NEW)
    assert p.form == profiles.POST_81 and len(p.clusters) == 2
    assert (p.active_ma, p.awake_ma, p.suspend_ma) == (4, 2, 1)
    # cluster 0 at 600 MHz for 2 s, one core: (4 + 3 + 12) * 2 = 38
    # cluster 1 at 500 MHz for 1 s, two cores: (4 + 6 + 2 * 20) * 1 = 50
    assert p.charge_mas({(0, 600000): 2.0}, include_awake=False) == pytest.approx(38.0)
    assert p.charge_mas({(1, 500000): 1.0}, cores=2, include_awake=False) == pytest.approx(50.0)
    # both, awake (cpu.idle = 2 mA) over 3 s: 38 + (4 + 6 + 20) + 6 = 74 mA*s; at 3.7 V: 0.2738 J
    assert p.energy_j({(0, 600000): 2.0, (1, 500000): 1.0}, voltage=3.7) == pytest.approx(74 * 3.7 / 1000)


def test_malformed_profiles_are_rejected():
    with pytest.raises(ValueError, match="not a CPU power profile"):
        profiles.parse('<device name="Android"><item name="screen.on">100</item></device>')
    with pytest.raises(ValueError, match="2 speeds but 1"):
        profiles.parse(OLD.replace("<value>30</value>", ""))
    with pytest.raises(ValueError, match="not a speed"):
        profiles.parse(OLD).running_ma(150000)


def test_shipped_nexus6_profile():
    dev = profiles.device("nexus6")
    p = dev.profile()
    assert dev.default_governor == "interactive" and dev.nominal_voltage > 0 and "shamu" in dev.source
    assert p.form == profiles.PRE_81 and len(p.speeds()) == 18
    assert p.speeds()[0] == 300000 and p.speeds()[-1] == 2649600
    assert p.clusters[0].core_ma[0] == 71 and p.clusters[0].core_ma[-1] == 414
    assert (p.awake_ma, p.suspend_ma, p.battery_mah) == (8, 6, 3220)
    assert len(p.sha256) == 64
    with pytest.raises(ValueError, match="unknown device"):
        profiles.device("pixel")


def test_modelled_meter_hand_computed_on_the_nexus6():
    p = profiles.device("nexus6").profile()
    model = GovernorModel(p)
    default = ModelledMeter(model, "interactive", voltage=3.8).reading_for(10.0)
    # 10 s at 2649.6 MHz: (414 + 8) mA x 10 s x 3.8 V = 16.036 J
    assert default.joules == pytest.approx(422 * 10 * 3.8 / 1000) and default.seconds == pytest.approx(10.0)
    assert default.label == "modelled" and "2649.6 MHz" in default.note
    # powersave: the same cycles at 300 MHz take 10 x 2649.6 / 300 = 88.32 s at (71 + 8) mA
    slow = ModelledMeter(model, "powersave", voltage=3.8).reading_for(10.0)
    assert slow.seconds == pytest.approx(88.32)
    assert slow.joules == pytest.approx(79 * 88.32 * 3.8 / 1000)
    # half the work compute-bound: 10 x (0.5 x 8.832 + 0.5) = 49.16 s
    half = GovernorModel(p, compute_bound=0.5)
    assert ModelledMeter(half, "powersave").reading_for(10.0).seconds == pytest.approx(49.16)
    # a fixed speed, and the awake current left out
    fixed = ModelledMeter(model, "khz:883200", voltage=3.8, include_awake=False).reading_for(3.0)
    assert fixed.seconds == pytest.approx(3.0 * 2649.6 / 883.2)
    assert fixed.joules == pytest.approx(115 * 9.0 * 3.8 / 1000)


def test_modelled_meter_window_uses_process_cpu_time():
    p = profiles.parse(OLD)
    cpu, wall = iter([0.0, 4.0]), iter([10.0, 12.0])
    meter = ModelledMeter(
        GovernorModel(p), "performance", voltage=4.0, cpu_clock=lambda: next(cpu), clock=lambda: next(wall)
    )
    meter.start()
    reading = meter.stop()
    # 2 s wall, 4 s CPU: two busy cores at 200 MHz: (2 x 30) x 2 + 2 x 2 awake = 124 mA*s at 4 V
    assert reading.joules == pytest.approx(124 * 4 / 1000)


def test_unknown_governor_or_speed_is_an_error():
    p = profiles.parse(OLD)
    with pytest.raises(ValueError, match="no model for governor"):
        ModelledMeter(GovernorModel(p), "conservative")
    with pytest.raises(ValueError, match="not a speed"):
        GovernorModel(p, powersave_khz=123)


def test_efficiency_per_cycle_of_the_nexus6_favours_a_middle_speed():
    rows = profiles.device("nexus6").profile().efficiency(3.8)
    best = min(rows, key=lambda r: r["uj_per_mcycle"])
    assert best["khz"] == 883200
    assert rows[0]["uj_per_mcycle"] > rows[-1]["uj_per_mcycle"]  # 300 MHz costs more per cycle than the top
