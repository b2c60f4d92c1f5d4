"""Every paper folder has a README.md (lib/ondevice/papers/<paper>/README.md) that names each of
its modules and links each experiment's notebook and results page, and every link resolves."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAPERS = sorted(p for p in (ROOT / "lib" / "ondevice" / "papers").iterdir() if p.is_dir() and p.name[0] not in "_.")


@pytest.mark.parametrize("paper", PAPERS, ids=[p.name for p in PAPERS])
def test_the_readme_names_every_module_and_links_every_notebook_and_results_page(paper):
    text = (paper / "README.md").read_text(encoding="utf-8")
    modules = [m.relative_to(paper).as_posix() for m in sorted(paper.rglob("*.py")) if m.name != "__init__.py"]
    assert not [m for m in modules if f"`{m}`" not in text], f"{paper.name}/README.md does not name these modules"
    links = re.findall(r"\]\(([^)]+)\)", text)
    assert not [a for a in links if not (paper / a).resolve().is_file()], f"{paper.name}/README.md: broken links"
    for nb in sorted((ROOT / "notebooks" / paper.name).glob("*.ipynb")):
        assert f"notebooks/{paper.name}/{nb.name}" in text, nb.stem
        if (ROOT / "results" / "default" / nb.stem).is_dir():
            assert f"results/default/{nb.stem}/README.md" in text, nb.stem
        else:  # a new notebook before its first default run: the row says so instead of a broken link
            assert re.search(rf"\[{nb.stem}\]\([^)]+\) \| not yet run at default \|", text), nb.stem
