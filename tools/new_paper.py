"""Start a new paper from the skeleton: `make new-paper NAME=mypaper` (or `python tools/new_paper.py
mypaper`) copies lib/ondevice/papers/_template/ and notebooks/_template/ to the paper's folders,
naming the example experiment `<name>_example`; then edit paper.toml, the module and the notebook
(docs/adding-a-paper.md). An existing folder or a name that is not a Python identifier is an error,
and nothing is written."""

from __future__ import annotations

import argparse
import keyword
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE, EXAMPLE = "_template", "template_example"


def create(name: str, root: Path = ROOT) -> list[Path]:
    """Copy the skeleton for paper `name` under `root`; returns the files written."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name) or keyword.iskeyword(name):
        raise ValueError(f"paper name must be a lower-case Python identifier, got {name!r}")
    sources = {root / "lib/ondevice/papers" / TEMPLATE: root / "lib/ondevice/papers" / name}
    sources[root / "notebooks" / TEMPLATE] = root / "notebooks" / name
    taken = [str(d) for d in sources.values() if d.exists()]
    if taken:
        raise FileExistsError(f"already there: {', '.join(taken)}")
    written = []
    for src, dst in sources.items():
        for f in sorted(p for p in src.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
            target = dst / f.relative_to(src).as_posix().replace(EXAMPLE, f"{name}_example")
            text = f.read_text(encoding="utf-8").replace(EXAMPLE, f"{name}_example")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text.replace(f"papers.{TEMPLATE}", f"papers.{name}"), encoding="utf-8")
            written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("name", help="the paper's folder name, e.g. mypaper")
    args = parser.parse_args(argv)
    try:
        files = create(args.name)
    except (ValueError, FileExistsError) as exc:
        print(f"new-paper: {exc}", file=sys.stderr)
        return 2
    print("\n".join(str(f.relative_to(ROOT)) for f in files))
    print(f"next: edit lib/ondevice/papers/{args.name}/paper.toml, then docs/adding-a-paper.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
