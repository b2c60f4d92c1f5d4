"""Fetch and verify every data set a scale needs: python -m ondevice.data --scale default"""

import argparse
import sys

from ..params import SCALES
from . import manifests


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--scale", default="default", choices=SCALES)
    ap.add_argument(
        "--refetch",
        action="store_true",
        help="discard cached copies and fetch them again, e.g. after a checksum error in the cache",
    )
    args = ap.parse_args(argv)
    try:
        needed = [m for m in manifests.all_manifests() if args.scale in m.scales]
        for m in needed:
            root = manifests.fetch(m, refetch=args.refetch)
            print(f"[data] {m.name}: verified ({len(m.artifacts)} artifact(s)) in {root}")
    except manifests.DataError as exc:
        print(f"[data] error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
