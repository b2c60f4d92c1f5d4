"""What this machine offers for energy measurement, and recovery of cpufreq settings.

python -m ondevice.device.energy            # meters and cpufreq policies
python -m ondevice.device.energy --restore  # undo the settings of a killed run
"""

from __future__ import annotations

import argparse
import sys

from . import meters
from .governors import CpuFreq, CpuFreqError


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ondevice.device.energy", description=__doc__.splitlines()[0])
    parser.add_argument("--restore", action="store_true", help="restore cpufreq settings left by a killed run")
    args = parser.parse_args(argv)
    cpufreq = CpuFreq()
    if args.restore:
        try:
            states = cpufreq.recover()
        except CpuFreqError as exc:
            print(exc, file=sys.stderr)
            return 1
        print("nothing to restore" if states is None else f"restored {', '.join(states)}")
        return 0
    for b in meters.discover():
        print(f"{b.name:16} {b.label:9} {'yes' if b.available else 'no ':3}  {b.detail}")
    ok, why = cpufreq.status()
    print(f"{'cpufreq':16} {'':9} {'yes' if ok else 'no ':3}  {why}")
    for row in cpufreq.table() if ok or cpufreq.policies() else []:
        print("   ", row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
