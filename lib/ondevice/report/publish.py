"""Publish results/<scale>/ as a static site that works offline, and a cross-paper SUMMARY.md.

Nothing is executed: each stored executed notebook is re-rendered to HTML with nbconvert's lab
template minus its CDN scripts (require.js, MathJax, Mermaid, widgets), so the site opens from disk
with no network. Every result directory with a run.json is published, whatever it lacks: a missing
field, table or notebook shows as "-", never as a crash. Each result is read once into a content
model (pages/content.py) that Jinja2 templates (pages/templates/) render as Markdown and HTML.

    python -m ondevice.report.publish --scale default [--results DIR] [--out DIR] [--summary PATH]
                                       [--screenshot docs/site-index.png [--screenshot-of NAME]]

Layout of the site: index.html (every claimed effect as a forest plot, the experiments, every
effect in numbers), SUMMARY.md, style.css and one folder per result: index.html (effects, headline
numbers, figures, data, parameters, environment), notebook.html, the executed .ipynb, run.json,
figures/ and tables/. Beside each result in results/<scale>/ goes its README.md page, and
SUMMARY.md beside them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

from ondevice import REPO_ROOT
from ondevice.report import facts
from ondevice.report.pages.content import Experiment, load
from ondevice.report.pages.render import TEMPLATES, Pages
from ondevice.report.record import atomic_write

RESULTS = Path(os.environ.get("ONDEVICE_RESULTS") or REPO_ROOT / "results")
SITE = REPO_ROOT / "site"


def _copy_files(e: Experiment, dest: Path) -> None:
    """run.json, the figures (PNG and SVG) and the tables of one result into its site folder."""
    shutil.copy2(e.path / "run.json", dest / "run.json")
    figures = [f"{f.name}.png" for f in e.figures] + [p.name for p in (e.path / "figures").glob("*.svg")]
    for sub, names in (("figures", figures), ("tables", [t.name for t in e.tables])):
        if names:
            (dest / sub).mkdir()
        for name in names:
            shutil.copy2(e.path / sub / name, dest / sub / name)


def _write_site(entries: list[Experiment], staging: Path, scale: str, summary: str, pages: Pages, log) -> None:
    """Every file of the site into the (empty) staging folder. A notebook that cannot be rendered
    costs its own page, not the site, and no page links into it."""
    (staging / "style.css").write_text(pages.css(), encoding="utf-8")
    (staging / "SUMMARY.md").write_text(summary, encoding="utf-8")
    exporter = None
    for e in entries:
        dest = staging / e.slug
        dest.mkdir()
        _copy_files(e, dest)
        if e.notebook is not None:
            exporter = exporter or pages.notebook_exporter()
            try:
                (dest / "notebook.html").write_text(pages.notebook_html(e, scale, exporter), encoding="utf-8")
                shutil.copy2(e.notebook, dest / f"{e.slug}.ipynb")
            except Exception as exc:  # an unreadable notebook costs its page, not the site
                log(f"[publish] {e.slug}: could not render {e.notebook.name}: {type(exc).__name__}: {exc}")
                e.lose_notebook()
        (dest / "index.html").write_text(pages.experiment_html(e, scale), encoding="utf-8")
    (staging / "index.html").write_text(pages.index_html(entries, scale), encoding="utf-8")


def build(
    results_dir: Path,
    out_dir: Path,
    summary_path: Path | None = None,
    scale: str | None = None,
    papers_dir: Path = facts.PAPERS,
    log=print,
    pages_dir: Path | None = None,
    templates: Path = TEMPLATES,
) -> list[Experiment]:
    """Write the site into out_dir (replaced whole, via a staging directory), SUMMARY.md
    (atomically) to summary_path, default results_dir/SUMMARY.md, and each result's README.md page
    to pages_dir/<name>/ (default: the result's own folder)."""
    results_dir, out_dir = Path(results_dir), Path(out_dir)
    scale = scale or results_dir.name
    if not results_dir.is_dir():
        raise FileNotFoundError(f"no results directory {results_dir} (run `make reproduce SCALE={scale}` first)")
    pages = Pages(templates)
    entries = load(results_dir, papers_dir)
    summary = pages.summary_markdown(entries, scale)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = out_dir.with_name(f".staging-{out_dir.name}-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        _write_site(entries, staging, scale, summary, pages, log)
        old = out_dir.with_name(f".old-{out_dir.name}-{os.getpid()}")
        if out_dir.exists():
            os.replace(out_dir, old)
        os.replace(staging, out_dir)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    summary_path = Path(summary_path) if summary_path else results_dir / "SUMMARY.md"
    atomic_write(summary_path, lambda p: p.write_text(summary, encoding="utf-8"))
    for e in entries:
        page = pages.experiment_markdown(e, scale)
        atomic_write(Path(pages_dir or results_dir) / e.slug / "README.md", lambda p, t=page: p.write_text(t, "utf-8"))
    return entries


def screenshot(page: Path, dest: Path, width: int = 1280, height: int = 900, full_page: bool = False) -> None:
    """A PNG of a built page as a reader first sees it, `width` x `height` (the pictures of the site
    beside the README: docs/site-index.png, docs/site-experiment.png), or the whole page, taken with
    the same system Chromium the browser test uses (ONDEVICE_CHROMIUM, default /usr/bin/chromium)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=os.environ.get("ONDEVICE_CHROMIUM") or "/usr/bin/chromium")
        try:
            view = browser.new_page(viewport={"width": width, "height": height})
            view.goto(Path(page).resolve().as_uri(), wait_until="load")
            png = view.screenshot(full_page=full_page)
        finally:
            browser.close()
    atomic_write(Path(dest), lambda p: p.write_bytes(png))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", default="default")
    ap.add_argument("--results", type=Path, help="results directory (default: results/<scale>)")
    ap.add_argument("--out", type=Path, help="site directory (default: site/<scale>)")
    ap.add_argument("--summary", type=Path, help="where SUMMARY.md goes (default: <results>/SUMMARY.md)")
    ap.add_argument("--screenshot", type=Path, help="also save a PNG of the index's first screen (docs/site-index.png)")
    ap.add_argument(
        "--screenshot-of", metavar="NAME", help="... of this experiment's page instead (docs/site-experiment.png)"
    )
    args = ap.parse_args(argv)
    results_dir = args.results or RESULTS / args.scale
    out = args.out or SITE / args.scale
    start = time.perf_counter()
    try:
        entries = build(results_dir, out, args.summary, args.scale)
    except FileNotFoundError as exc:
        print(f"[publish] {exc}", file=sys.stderr)
        return 1
    effects = sum(len(e.effects) for e in entries)
    print(
        f"[publish] {len(entries)} result(s), {effects} claimed effect(s) from {results_dir} -> {out}/index.html "
        f"and {args.summary or results_dir / 'SUMMARY.md'} in {time.perf_counter() - start:.1f}s"
    )
    if args.screenshot:
        page = out / args.screenshot_of / "index.html" if args.screenshot_of else out / "index.html"
        screenshot(page, args.screenshot)
        print(f"[publish] screenshot of {page.relative_to(out)} at 1280x900: {args.screenshot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
