"""Energy of on-device training: meters (measured and modelled) behind one interface, CPU
governor control through cpufreq sysfs, and device power profiles.

`meters.py` lists the meters; `governors.py` sets a governor for a run and always restores it;
`profiles.py` reads Android power_profile.xml files (the Nexus 6's ships in `profiles/`);
`modelled.py` turns CPU time into modelled joules; `workload.py` counts a training step's work.
`python -m ondevice.device.energy` reports what this machine offers; `--restore` undoes the
cpufreq settings of a run that was killed before it could restore them.
"""
