"""The published site: built from stored results only, offline, robust to incomplete results, and
checked in a real headless browser (Debian's chromium driven by Playwright)."""

import base64
import csv
import io
import json
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from urllib.parse import unquote, urlparse

import jinja2
import nbformat
import pytest
from PIL import Image, ImageDraw, ImageStat

from ondevice.report import judge, publish
from ondevice.report.claims import percent
from ondevice.report.pages import forest, render
from ondevice.report.pages.cells import DASH, counts, diagnosis, ratio, short_citation
from ondevice.report.pages.content import paper_of

REPO = Path(__file__).resolve().parents[1]
COMMITTED = REPO / "results" / "default"
CHROMIUM = Path(os.environ.get("ONDEVICE_CHROMIUM") or "/usr/bin/chromium")
EXTERNAL = re.compile(r"""<(?:script|link|img|iframe|source)\b[^>]*\b(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", re.I)


@pytest.fixture(scope="module")
def committed_site(tmp_path_factory):
    """The site of the committed default results; SUMMARY.md and the pages go to a temporary folder."""
    out = tmp_path_factory.mktemp("site")
    entries = publish.build(
        COMMITTED, out / "default", summary_path=out / "SUMMARY.md", scale="default", pages_dir=out / "pages"
    )
    return out / "default", out / "SUMMARY.md", entries


def _png(path: Path, size=(360, 240), text="figure") -> bytes:
    img = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(img)
    for i in range(0, size[0], 24):
        draw.line([(i, size[1] - 20), (i + 12, 20 + (i * 7) % (size[1] - 40))], fill=(200, 60, 80), width=3)
    draw.text((10, 5), text, fill="black")
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buf.getvalue())
    return buf.getvalue()


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """A results tree with a complete fake experiment whose text carries HTML, one whose run.json has
    nothing but its name, one whose fields all have the wrong type and one whose run.json is not JSON."""
    root = tmp_path_factory.mktemp("synthetic")
    results, papers = root / "results" / "fake", root / "papers"
    (papers / "doe").mkdir(parents=True)
    (papers / "doe" / "paper.toml").write_text(
        '[paper]\nshort = "Alpha"\ntitle = "Alpha"\nauthors = "Doe et al."\nvenue = "Venue 2020"\n\n'
        '[alpha.claims]\ncitation = "Doe et al., <Alpha & Co>, Venue 2020, Table 1"\n'
        '[[alpha.claims.effects]]\nclaim = "tricks <help>"\nbetter = "a"\nworse = "b"\n'
        '[[alpha.claims.effects]]\nclaim = "more | data"\nbetter = "c"\nworse = "d"\n'
    )
    alpha = results / "alpha"
    png = _png(alpha / "figures" / "curve.png")
    (alpha / "figures" / "curve.svg").write_text('<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"/>')
    (alpha / "tables").mkdir(parents=True)
    rows = [
        {
            "effect": "tricks <help>",
            "paper change": 0.1,
            "our change": 0.02,
            "ci low": 0.01,
            "ci high": 0.03,
            "users": 12,
            "seeds": 3,
            "verdict": "holds",
            "level": 0.95,
        },
        {
            "effect": "more | data",
            "paper change": 0.05,
            "our change": -0.01,
            "ci low": -0.04,
            "ci high": 0.02,
            "users": 12,
            "seeds": 3,
            "verdict": "within noise",
            "level": 0.95,
        },
    ]
    with (alpha / "tables" / "effects.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("# Alpha <b>bold</b> & friends\n\nText."),
        nbformat.v4.new_code_cell(
            "plot()",
            outputs=[
                nbformat.v4.new_output(
                    "display_data", data={"image/png": base64.b64encode(png).decode(), "text/plain": "<Figure>"}
                )
            ],
        ),
    ]
    nbformat.write(nb, alpha / "alpha.ipynb")
    (alpha / "run.json").write_text(
        json.dumps(
            {
                "experiment": "alpha",
                "scale": "fake",
                "params": {"k": 3, "note": "<i>x</i>"},
                "wall_time_s": 75.0,
                "stand_in_data": "<img src=x onerror=alert(1)> stands in for private logs.",
                "data": [
                    {"name": "toy<data>", "license": "MIT", "artifacts": [{"file": "t.tgz", "sha256": "ab" * 32}]}
                ],
                "headline": {"score": {"value": 0.5, "per_seed": [0.4, 0.5, 0.6], "tolerance": 0.1, "resolution": 0.0}},
                "environment": {"git": {"commit": "0123456789abcdef", "dirty": True}, "packages": {"numpy": "1"}},
                "notebook": {"status": "complete", "wall_time_s": 80.5},
            }
        )
    )
    (results / "beta").mkdir()
    (results / "beta" / "run.json").write_text(json.dumps({"experiment": "beta"}))
    (results / "delta").mkdir()  # every field of the wrong type
    (results / "delta" / "run.json").write_text(
        json.dumps(
            {
                "experiment": "../../delta",
                "data": 5,
                "headline": {"x": 3, "y": {"value": "n/a", "per_seed": 2}},
                "params": [1],
                "environment": {"packages": [1], "git": "abc"},
                "notebook": {"status": None},
                "stand_in_data": True,
                "wall_time_s": "slow",
            }
        )
    )
    (results / "gamma #1").mkdir()
    (results / "gamma #1" / "run.json").write_text("{not json")
    site, summary = root / "site" / "fake", root / "SUMMARY.md"
    entries = publish.build(results, site, summary_path=summary, papers_dir=papers)
    return site, summary, entries


def _summary_rows(text: str) -> list[list[str]]:
    """The cells of SUMMARY.md's table, without the header, Markdown escapes undone."""
    return [c for c in map(_cells, text.splitlines()) if c][1:]


def test_summary_reports_every_effect_of_the_committed_results(committed_site):
    site, summary, entries = committed_site
    assert [e.slug for e in entries] == sorted(p.parent.name for p in COMMITTED.glob("*/run.json"))
    expected = []
    for effects in sorted(COMMITTED.glob("*/tables/effects.csv")):
        with effects.open(newline="") as f:
            for row in csv.DictReader(f):
                expected.append((effects.parents[1].name, row))
    rows = _summary_rows(summary.read_text())
    assert len(rows) == len(expected) >= 1
    for (name, row), cells in zip(expected, rows):
        assert f"[{name}]({name}/README.md)" == cells[1] and row["effect"] == cells[2]
        # a paper that gives no number (e.g. DeepType Fig. 1b) shows "-" for its change
        assert cells[3] == (percent(float(row["paper change"])) if row["paper change"] else DASH)
        assert cells[4] == percent(float(row["our change"]))
        if row.get("ci low"):
            assert cells[6].startswith(f"{percent(float(row['ci low']))} to {percent(float(row['ci high']))}")
        assert cells[7] == counts(row) and cells[7] != DASH, "the counts column never reads '-'"
        row = _protocol_checked(name, row)  # its diagnosis read open where our own protocols reverse its sign
        judged = _judged(name, row)  # the verdict is judged at publish, from the interval, not read from the row
        assert cells[8] == judged.verdict and _unlinked(cells[9]).startswith(diagnosis(row, judged))
        assert cells[10].endswith(", modelled") == ("modelled" in row.get("meter", "")), "modelled numbers are labelled"
        assert cells[0] == next(e.short for e in entries if e.slug == name) and cells[0] != DASH
    assert (site / "SUMMARY.md").read_text() == summary.read_text()


def _protocol_checked(name: str, row: dict) -> dict:
    """`judge.protocol_checked` and `judge.curve_checked` on a committed row, with its result's tables
    as the pages read them."""
    tables = {}
    for path in (COMMITTED / name / "tables").glob("*.csv"):
        with path.open(newline="") as f:
            tables[path.name] = list(csv.DictReader(f))
    run, experiment = json.loads((COMMITTED / name / "run.json").read_text()), name
    experiment = run.get("experiment") or name
    for other, table in judge.referenced(experiment):  # protocol runs another experiment's result holds
        path = COMMITTED / other / "tables" / table
        if path.is_file():  # not yet run: no rows, as the pages read it (the row reads protocol not yet run)
            with path.open(newline="") as f:
                tables[f"{other}/{table}"] = list(csv.DictReader(f))
    # read open where our own protocols reverse its sign, or where a data or scale cause has no curve
    return judge.curve_checked(judge.protocol_checked(row, experiment, tables), experiment, tables)


def _judged(name: str, row: dict) -> judge.Judged:
    run = json.loads((COMMITTED / name / "run.json").read_text())
    return judge.judge(row, run.get("experiment") or name, run.get("headline"))


def test_every_committed_result_gets_a_generated_page_and_the_committed_pages_are_current(committed_site):
    site, summary, entries = committed_site
    for e in entries:
        assert f"]({e.slug}/README.md)" in summary.read_text() or not e.effects, "SUMMARY.md links each page"
        page = (site.parent / "pages" / e.slug / "README.md").read_text()
        lines = page.splitlines()
        for r in e.rows:
            cells = next(c for c in map(_cells, lines) if c and c[0] == r["effect"])
            judged = _judged(e.name, r)
            assert cells[3] == ratio(judged) and cells[5] == counts(r)
            assert _unlinked(cells[7]).startswith(diagnosis(r, judged))
        for name in e.run.get("headline") or {}:
            assert any(c and c[0] == name for c in map(_cells, lines)), f"{e.slug}: headline {name!r} not on its page"
        for fig in (COMMITTED / e.slug / "figures").glob("*.png"):
            assert f"(figures/{fig.name})" in page
        for table in (COMMITTED / e.slug / "tables").glob("*.csv"):
            assert f"(tables/{table.name})" in page
        assert ("Stand-in data" in page) == bool(e.stand_in)
        assert e.reference in page.replace("\\", "") and "## Provenance" in page and "(run.json)" in page
        committed = COMMITTED / e.slug / "README.md"
        assert committed.read_text() == page, f"{committed} is stale: run make publish SCALE=default"


def _unlinked(cell: str) -> str:
    """A diagnosis cell without its link to the notebook section: 'differs, explained by [text](nb#anchor)'
    reads 'differs, explained by text' (the link target must be a notebook heading's anchor), without the
    other reading of its unit that may follow."""
    m = re.fullmatch(r"(.*?)\[(.*)\]\(([^()\s]+\.ipynb#[^()\s]+)\)( \(read as .*\))?", cell)
    return m.group(1) + m.group(2) if m else cell


def _cells(line: str) -> list[str]:
    """A Markdown table line's cells, escapes undone; [] for any other line."""
    if not line.startswith("| "):
        return []
    return [re.sub(r"\\(.)", r"\1", c.strip()) for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def test_committed_site_has_every_page_and_loads_nothing_from_the_network(committed_site):
    site, _, entries = committed_site
    for e in entries:
        page = (site / e.slug / "index.html").read_text()
        assert (site / e.slug / "notebook.html").is_file() and (site / e.slug / "run.json").is_file()
        for fig in (COMMITTED / e.slug / "figures").glob("*.png"):
            assert f'src="figures/{fig.name}"' in page and (site / e.slug / "figures" / fig.name).is_file()
        if e.stand_in:
            assert "stand-in data" in page
    for page in site.rglob("*.html"):
        text = page.read_text()
        assert not EXTERNAL.search(text), f"{page.name} loads something from another host"
        assert "require.js" not in text and "MathJax.js" not in text and "<script src" not in text


def test_incomplete_results_publish_with_dashes_and_text_is_escaped(synthetic):
    site, summary, entries = synthetic
    assert [e.slug for e in entries] == ["alpha", "beta", "delta", "gamma #1"]
    alpha = entries[0]
    assert alpha.citation == "Doe et al., <Alpha & Co>, Venue 2020, Table 1"
    assert alpha.claims == ["tricks <help>", "more | data"] and alpha.verdict == "1 holds, 1 within noise"
    index = (site / "index.html").read_text()
    assert "Doe et al., &lt;Alpha &amp; Co&gt;" in index and "<Alpha" not in index
    assert "&lt;img src=x" not in index  # the stand-in text is on the experiment page, labelled on the index
    page = (site / "alpha" / "index.html").read_text()
    assert "&lt;img src=x onerror=alert(1)&gt;" in page and "<img src=x" not in page
    assert "toy&lt;data&gt;" in page and "&lt;i&gt;x&lt;/i&gt;" in page and "1 min 20 s" in page
    assert "Alpha &lt;b&gt;bold&lt;/b&gt; &amp; friends" in index  # the notebook's title, as text
    assert 'href="gamma%20%231/index.html"' in index  # a folder name is URL-quoted in links
    assert "n/a" in (site / "delta" / "index.html").read_text()  # the one headline that is a record
    for name in ("beta", "gamma #1"):
        page = (site / name / "index.html").read_text()
        assert "no effects table" in page and "no headline numbers" in page
        assert not (site / name / "notebook.html").exists()
    beta_row = index.split('href="beta/index.html"', 1)[1].split("</tr>", 1)[0]
    assert beta_row.count(">-<") >= 3  # status, verdict, wall time
    rows = _summary_rows(summary.read_text())
    assert "tricks \\<help\\>" in summary.read_text()  # no raw HTML in the Markdown
    assert [r[2] for r in rows] == ["tricks <help>", "more | data"] and [r[8] for r in rows] == [
        "holds",
        "within noise",
    ]
    assert rows[0][6] == "+1.0% to +3.0% (95%)" and rows[0][7] == "12 users x 3 seeds" and rows[0][10] == "stand-in"
    assert rows[0][5] == "0.2x" and rows[0][9] == "unexplained"  # +2% vs +10%: interval excludes it, 5x smaller
    alpha_page = (alpha.path / "README.md").read_text()
    assert "tricks \\<help\\>" in alpha_page and "<help>" not in alpha_page and "unexplained" in alpha_page
    assert "Stand-in data" in alpha_page and "(figures/curve.png)" in alpha_page
    assert "no effects table" in (entries[1].path / "README.md").read_text()


def test_an_empty_results_directory_publishes_an_index_and_a_missing_one_is_an_error(tmp_path):
    (tmp_path / "results").mkdir()
    publish.build(tmp_path / "results", tmp_path / "site", summary_path=tmp_path / "S.md", scale="smoke")
    assert "No results in" in (tmp_path / "site" / "index.html").read_text()
    assert "No claimed effects" in (tmp_path / "S.md").read_text()
    assert publish.main(["--results", str(tmp_path / "nowhere"), "--out", str(tmp_path / "x")]) == 1


def _apt_usable() -> bool:
    if not shutil.which("apt-get"):
        return False
    return os.geteuid() == 0 or subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode == 0


def _chromium() -> str:
    if CHROMIUM.is_file():
        return str(CHROMIUM)
    if _apt_usable():
        pytest.fail(
            f"{CHROMIUM} is missing though apt-get is usable here: `make browser` (part of `make test`) installs it"
        )
    pytest.skip(
        f"no browser: {CHROMIUM} is missing and apt-get is not available (or needs a password) to install "
        "Debian's chromium; set ONDEVICE_CHROMIUM to a Chromium binary to run this test"
    )


HREFS = "els => els.map(a => new URL(a.getAttribute('href'), document.baseURI).href)"  # SVG <a> too
# what is wider than the screen: the page, or a table's box (or the forest plot); a table wider than
# its box must scroll inside it, or with `fit` (the index, read at a glance) not be wider at all.
# Folded parts (<details>) are opened first.
OVERFLOW = """fit => {
  document.querySelectorAll('details').forEach(d => { d.open = true; });
  const width = innerWidth, out = [], page = document.documentElement.scrollWidth;
  if (page > width) out.push(`the page is ${page} px wide`);
  for (const el of document.querySelectorAll('table, svg.forest')) {
    const box = el.closest('.scroll') || el, r = box.getBoundingClientRect();
    const scrolls = ['auto', 'scroll'].includes(getComputedStyle(box).overflowX);
    const what = el.tagName.toLowerCase() + ' ' + (el.querySelector('th') || el).textContent.trim().slice(0, 30);
    if (r.left < 0 || r.right > width) out.push(`${what}: its box spans ${r.left | 0}..${r.right | 0} px`);
    const wider = el.getBoundingClientRect().width > r.width + 1;
    if (wider && (fit || !scrolls)) out.push(`${what}: cut off by its box`);
  }
  return out;
}"""


def _check_site(browser, site: Path) -> dict:
    """Visit every page reachable from index.html; return what went wrong and what was seen."""
    root = site.resolve()
    problems, seen, images = [], set(), 0
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    current = {"url": ""}
    page.on("console", lambda m: m.type == "error" and problems.append(f"console error on {current['url']}: {m.text}"))
    page.on("pageerror", lambda e: problems.append(f"page error on {current['url']}: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"request failed on {current['url']}: {r.url} {r.failure}"))

    def only_local(route):
        if route.request.url.startswith(("file:", "data:")):
            route.continue_()
        else:
            problems.append(f"network request from {current['url']}: {route.request.url}")
            route.abort()

    page.route("**/*", only_local)
    queue = [root / "index.html"]
    while queue:
        path = queue.pop()
        if path in seen:
            continue
        seen.add(path)
        current["url"] = str(path.relative_to(root))
        page.goto(path.as_uri(), wait_until="load")
        links = page.eval_on_selector_all("a[href]", HREFS)
        ids = set(page.eval_on_selector_all("[id]", "els => els.map(e => e.id)"))
        for href in links:
            url = urlparse(href)
            if url.scheme != "file":
                problems.append(f"{current['url']}: link out of the site: {href}")
                continue
            target = Path(unquote(url.path)).resolve()
            if not target.is_relative_to(root) or not target.is_file():
                problems.append(f"{current['url']}: broken link {href}")
            # as browsers do (HTML "indicated part"): the decoded fragment, then the raw one
            elif target == path and url.fragment and not {unquote(url.fragment), url.fragment} & set(ids):
                problems.append(f"{current['url']}: no element with id {unquote(url.fragment)!r}")
            elif target.suffix == ".html":
                queue.append(target)
        for img in page.query_selector_all("img"):
            src = img.get_attribute("src") or ""
            name = src[:40]
            img.scroll_into_view_if_needed()
            if not img.evaluate("i => i.complete && i.naturalWidth > 0"):
                problems.append(f"{current['url']}: image did not load: {name}")
                continue
            shot = Image.open(io.BytesIO(img.screenshot())).convert("L")
            if shot.width < 50 or shot.height < 50 or ImageStat.Stat(shot).stddev[0] < 8:
                problems.append(f"{current['url']}: image renders blank or tiny: {name} {shot.size}")
            images += 1
    page.close()
    on_disk = {p.resolve() for p in root.rglob("*.html")}
    problems += [f"page not linked from the index: {p.relative_to(root)}" for p in sorted(on_disk - seen)]
    return {"problems": problems, "pages": seen, "images": images}


def test_site_in_a_real_browser(committed_site, synthetic):
    """Every page loads without console errors or network requests, every link and image resolves
    inside the site, and every figure renders (a screenshot with visible variation)."""
    executable = _chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, headless=True)
        try:
            for site, _, entries in (committed_site, synthetic):
                report = _check_site(browser, site)
                assert not report["problems"], "\n".join(report["problems"])
                assert len(report["pages"]) == 1 + len(entries) + sum(
                    (site / e.slug / "notebook.html").is_file() for e in entries
                )
                assert report["images"] >= sum(len(list((site / e.slug / "figures").glob("*.png"))) for e in entries)
        finally:
            browser.close()


def test_pages_fit_a_1280px_screen_and_the_forest_plot_marks_every_effect(committed_site, synthetic):
    """At 1280 px no page of ours is wider than the screen and every table fits (on the index), or
    scrolls inside its own box; the index's forest plot has one mark per effect row of SUMMARY.md, an experiment's
    page one per effect, and each mark links to its effect's row."""
    executable = _chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            for site, summary, entries in (committed_site, synthetic):
                problems = []
                for path in [site / "index.html", *(site / e.slug / "index.html" for e in entries)]:
                    page.goto(path.as_uri(), wait_until="load")
                    fit = path.parent == site  # the index fits: a scroll bar below 70 rows is out of sight
                    problems += [f"{path.relative_to(site)}: {p}" for p in page.evaluate(OVERFLOW, fit)]
                    marks = page.eval_on_selector_all("svg.forest .effect-mark", "els => els.length")
                    rows = {e.slug: len(e.effects) for e in entries}.get(path.parent.name)
                    expected = len(_summary_rows(summary.read_text())) if path.parent == site else rows
                    assert marks == expected, f"{path.relative_to(site)}: {marks} forest marks, {expected} effects"
                    for href in page.eval_on_selector_all("svg.forest a", HREFS):
                        url = urlparse(href)
                        target = Path(unquote(url.path))
                        assert re.fullmatch(r"effect-\d+", url.fragment) and target.is_file(), href
                        assert f'<tr id="{url.fragment}">' in target.read_text(), f"{href}: no such row"
                assert not problems, "\n".join(problems)
        finally:
            browser.close()


def test_citation_and_claims_come_from_the_facts_file_and_short_citations_keep_parentheses(tmp_path):
    (tmp_path / "roe").mkdir()
    (tmp_path / "roe" / "paper.toml").write_text(
        '[paper]\nshort = "R"\ntitle = "Thesis"\nauthors = "Roe"\nvenue = "U. Nowhere, 2021"\n'
        '[exp_b.time]\ncitation = "Roe, R (MSc thesis, U. Nowhere, 2021), Sec. 5"\n'
        '[[exp_b.time.effects]]\nclaim = "faster"\nbetter = "a"\nworse = "b"\n[exp_c.groups]\nnote = 1\n'
    )
    assert paper_of("exp_b", tmp_path) == (
        "Roe, R (MSc thesis, U. Nowhere, 2021), Sec. 5",
        ["faster"],
        "Roe, R, 2021",
    )
    assert paper_of("exp_c", tmp_path) == ('Roe, "Thesis", U. Nowhere, 2021', [], "Roe, R, 2021")  # the paper's
    assert paper_of("exp_d", tmp_path) == (DASH, [], DASH)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "paper.toml").write_text("[paper\n")
    assert paper_of("exp_b", tmp_path) == (DASH, [], DASH)  # a broken facts file: no crash
    assert short_citation("Roe, R (MSc thesis, U. Nowhere, 2021), Sec. 5") == "Roe, R (MSc thesis, U. Nowhere, 2021)"
    assert short_citation("Xu et al., DeepType, IMWUT 2018, Table 1") == "Xu et al., DeepType, IMWUT 2018"


def test_the_summary_diagnosis_is_the_judged_audit():
    row = {"paper change": "0.1", "our change": "0.4", "ci low": "0.35", "ci high": "0.45", "diagnosis": ""}

    def text(r):
        return diagnosis(r, judge.judge(r, "no_such_experiment"))

    assert text(row) == "unexplained"
    # a diagnosis explains only when its kind names a cause outside our implementation; open (or no
    # kind recorded, as in a table from before kinds) reads as ours to fix
    assert text({**row, "diagnosis": "tiny users", "diagnosis kind": "data"}) == "differs, explained by tiny users"
    assert text({**row, "diagnosis": "kept epoch 0", "diagnosis kind": "open"}) == "differs, open: kept epoch 0"
    assert text({**row, "diagnosis": "tiny users"}) == "differs, open: tiny users"
    assert text({**row, "our change": "0.2", "ci low": "0.15", "ci high": "0.25"}) == "agrees within 3x"
    # within noise never agrees in size: the ratio and "within 3x" need an interval off zero
    noisy = {**row, "our change": "0.2", "ci low": "-0.01", "ci high": "0.09"}
    assert text(noisy) == "unexplained" and ratio(judge.judge(noisy, "x")) == DASH
    assert text({**row, "ci low": "-0.1"}) == judge.INCONCLUSIVE


def test_an_explained_row_links_its_diagnosis_to_the_notebook_section_that_measures_it(tmp_path):
    results, papers = tmp_path / "results" / "fake", tmp_path / "papers"
    (papers / "doe").mkdir(parents=True)
    (papers / "doe" / "paper.toml").write_text(
        '[paper]\nshort = "Omega"\ntitle = "Omega"\nauthors = "Jo Doe"\nvenue = "Venue 2021"\n[omega.claims]\n'
        'citation = "Doe, Omega, Venue 2021, Fig. 2"\n'
    )
    exp = results / "omega"
    (exp / "tables").mkdir(parents=True)
    base = {"paper change": 0.5, "our change": 5.0, "ci low": 4.0, "ci high": 6.0, "users": 4, "seeds": 1}
    base["diagnosis kind"] = ""  # open: ours to fix
    rows = [
        {
            **base,
            "effect": "cache",
            "diagnosis": "the frozen share (sweep)",
            "section": "Ablation: the `frozen` share",
            "diagnosis kind": "hardware",  # outside our implementation, and no curve needed (report/curves.py)
        },
        {**base, "effect": "gone", "diagnosis": "a lost section", "section": "Nowhere"},
        {**base, "effect": "bare", "diagnosis": "no section given", "section": ""},
        {**base, "effect": "timed", "diagnosis": "", "section": "", "repeats": 5},
    ]
    with (exp / "tables" / "effects.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[-1]))
        writer.writeheader()
        writer.writerows(rows)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(t) for t in ("# Omega", "## Ablation: the `frozen` share\n\nText.")]
    nbformat.write(nb, exp / "omega.ipynb")
    (exp / "run.json").write_text(json.dumps({"experiment": "omega", "notebook": {"status": "complete"}}))
    site, summary = tmp_path / "site", tmp_path / "SUMMARY.md"
    publish.build(results, site, summary_path=summary, papers_dir=papers)

    anchor = "Ablation:-the-frozen-share"
    cells = {r[2]: r for r in _summary_rows(summary.read_text())}
    assert summary.read_text().count(f"](omega/omega.ipynb#{anchor})") == 1
    assert cells["cache"][9] == "differs, explained by [the frozen share (sweep)](omega/omega.ipynb#" + anchor + ")"
    assert cells["gone"][9] == "differs, open: a lost section (its section 'Nowhere' is not a heading of the notebook)"
    assert cells["bare"][9] == "differs, open: no section given"
    assert cells["timed"][9] == "unexplained" and cells["timed"][7] == "4 users x 5 repeats x 1 seed"
    assert [r[8] for r in cells.values()] == ["holds"] * 4  # no verdict recorded: judged at publish from the interval
    page = (exp / "README.md").read_text()
    assert f"](omega.ipynb#{anchor})" in page and '- reference: Jo Doe, "Omega", Venue 2021' in page
    html = (site / "omega" / "index.html").read_text()
    assert f'differs, explained by <a href="notebook.html#{anchor}">the frozen share (sweep)</a>' in html
    assert f'href="omega/notebook.html#{anchor}"' in (site / "index.html").read_text()
    assert f'id="{anchor}"' in (site / "omega" / "notebook.html").read_text()  # the rendered notebook has the target


@pytest.mark.parametrize(
    "row,expected",
    [
        ({"users": 12, "seeds": 3}, "12 users x 3 seeds"),
        ({"users": 45, "seeds": 2, "resampled": "devices"}, "45 devices x 2 seeds"),
        ({"users": 4, "seeds": 1, "repeats": 5}, "4 users x 5 repeats x 1 seed"),
        ({"test samples": 2000, "seeds": 2}, "2000 test samples x 2 seeds"),
        ({"users": 12}, "12 users (seeds not recorded)"),
        ({"users": "", "seeds": ""}, "not recorded"),
    ],
)
def test_the_resampled_column_says_what_and_how_many_and_never_a_bare_dash(row, expected):
    assert counts(row) == expected


def _one_result(root: Path, why: str, section: str, notebook: str | None = None) -> Path:
    """results/fake/<one>/ with one explained effect row (its diagnosis `why` and section as given) and,
    unless `notebook` is given as the raw file text, a notebook whose one heading is 'Why'."""
    exp = root / "results" / "fake" / "one"
    (exp / "tables").mkdir(parents=True)
    row = {"effect": "e", "paper change": 0.5, "our change": 5.0, "ci low": 4.0, "ci high": 6.0, "users": 4}
    with (exp / "tables" / "effects.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[*row, "diagnosis", "section"])
        writer.writeheader()
        writer.writerow({**row, "diagnosis": why, "section": section})
    if notebook is None:
        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_markdown_cell("# One\n\n## Why\n\nText.")]
        nbformat.write(nb, exp / "one.ipynb")
    else:
        (exp / "one.ipynb").write_text(notebook)
    (exp / "run.json").write_text(json.dumps({"experiment": "one"}))
    return exp.parent


@pytest.mark.parametrize("section", ["Why", ""], ids=["linked", "plain"])
def test_a_script_in_a_diagnosis_is_text_on_every_page(tmp_path, section):
    """HTML templates autoescape: a diagnosis cannot inject markup, linked to its section or not;
    the Markdown pages escape it too."""
    results = _one_result(tmp_path, "<script>alert('x')</script> & more", section)
    site, summary = tmp_path / "site", tmp_path / "SUMMARY.md"
    publish.build(results, site, summary_path=summary, papers_dir=tmp_path / "papers")
    escaped = "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; more"
    for page in (site / "index.html", site / "one" / "index.html"):
        text = page.read_text()
        assert escaped in text and "<script" not in text, page
        assert (f'notebook.html#Why">{escaped}</a>' in text) == bool(section)
    for page in (summary, results / "one" / "README.md"):
        text = page.read_text()
        assert "\\<script\\>alert('x')\\</script\\> \\& more" in text and not re.search(r"(?<!\\)<script", text), page


def test_a_notebook_that_cannot_be_rendered_costs_its_page_and_its_links(tmp_path):
    results = _one_result(
        tmp_path, "measured", "Why", notebook='{"cells": [{"cell_type": "markdown", "source": "## Why"}]}'
    )
    site, logged = tmp_path / "site", []
    publish.build(results, site, summary_path=tmp_path / "S.md", papers_dir=tmp_path / "papers", log=logged.append)
    assert len(logged) == 1 and "could not render one.ipynb" in logged[0]
    assert not (site / "one" / "notebook.html").exists() and not (site / "one" / "one.ipynb").exists()
    for page in (site / "one" / "index.html", site / "index.html", results / "one" / "README.md"):
        text = page.read_text()
        assert "notebook.html" not in text and "one.ipynb" not in text, page
        why = "(its section 'Why' is not a heading of the notebook)"
        assert (why.replace("'", "&#39;") if page.suffix == ".html" else why) in text, page


def test_a_missing_template_is_a_clear_error_and_leaves_the_site_alone(tmp_path):
    (tmp_path / "templates").mkdir()
    pages = render.Pages(tmp_path / "templates")
    with pytest.raises(FileNotFoundError, match=r"no page template 'summary\.md\.j2' in .*templates"):
        pages.summary_markdown([], "fake")
    (tmp_path / "templates" / "index.html.j2").write_text('{% extends "page.html.j2" %}')
    with pytest.raises(FileNotFoundError, match=r"'page\.html\.j2' .* \(needed for 'index\.html\.j2'"):
        pages.index_html([], "fake")
    (tmp_path / "results").mkdir()
    (tmp_path / "site").mkdir()
    with pytest.raises(FileNotFoundError, match="no page template"):
        publish.build(
            tmp_path / "results", tmp_path / "site", summary_path=tmp_path / "S.md", templates=tmp_path / "templates"
        )
    assert not any((tmp_path / "site").iterdir()) and not (tmp_path / "S.md").exists()


def test_a_template_that_names_an_undefined_value_is_an_error_not_a_blank(tmp_path):
    (tmp_path / "summary.md.j2").write_text("# {{ scale }} {{ nothing_by_this_name }}\n")
    with pytest.raises(jinja2.UndefinedError, match="nothing_by_this_name"):
        render.Pages(tmp_path).summary_markdown([], "fake")


def test_the_shipped_templates_and_stylesheet_are_package_data():
    """Every file in templates/ is matched by pyproject's package-data globs, so an installed
    (non-editable) package renders the same site."""
    with (REPO / "pyproject.toml").open("rb") as f:
        globs = tomllib.load(f)["tool"]["setuptools"]["package-data"]["ondevice.report.pages"]
    package = render.TEMPLATES.parent
    shipped = {p for g in globs for p in package.glob(g) if p.is_file()}
    files = {p for p in render.TEMPLATES.rglob("*") if p.is_file()}
    assert files and files == shipped


@pytest.mark.parametrize(
    "text,line",
    [
        (
            "the planted-signal control passes: gains +0.080 [+0.068, +0.088]; 3 of 5 runs",
            "the planted-signal control passes",
        ),
        (
            "a habit sets it, the Wi-Fi share (ours 0.8); change at 0.2: +3179%",
            "a habit sets it, the Wi-Fi share (ours 0.8)",
        ),
        ("users are few (the paper's: 100K, Sec. 6.1). More follows", "users are few (the paper's: 100K, Sec. 6.1)"),
        ("word " * 40, ("word " * 23).strip() + "…"),
        ("a long cause " + "(in words " * 20 + ")", "a long cause…"),
    ],
    ids=["colon", "semicolon outside parentheses", "sentence", "words", "not inside a parenthesis"],
)
def test_a_table_cell_holds_one_line_of_a_diagnosis(text, line):
    assert render.one_line(text) == line and len(line) <= render.ONE_LINE


def test_a_long_diagnosis_is_one_line_in_its_cell_and_whole_below_the_table(tmp_path):
    why = "the cause, in short: " + "; ".join(f"protocol {i} +{i}.0% [+0.1%, +{i}.9%]" for i in range(12))
    results = _one_result(tmp_path, why, "Why")
    publish.build(results, tmp_path / "site", summary_path=tmp_path / "S.md", papers_dir=tmp_path / "papers")
    page = (tmp_path / "site" / "one" / "index.html").read_text()
    cell = re.search(r'<td class="diagnosis">(.*?)</td>', page, re.S).group(1)
    assert '<a href="notebook.html#Why">the cause, in short</a>' in cell and "protocol" not in cell
    assert 'href="index.html#diagnosis-1">more</a>' in cell and 'id="diagnosis-1"' in page
    section = page.split('id="diagnosis-1"', 1)[1]
    assert all(f"<li>protocol {i} +{i}.0% [+0.1%, +{i}.9%]</li>" in section for i in range(1, 12))
    index = (tmp_path / "site" / "index.html").read_text()
    assert 'href="one/index.html#diagnosis-1">more</a>' in index and "protocol 3" not in index


def test_the_forest_plot_clips_huge_changes_at_its_edge_and_says_the_value():
    mark = forest.Mark("huge", "#effect-1", "holds", 31.79, 20.0, 40.0, 1.0, "huge: ours +3179%", True)
    bare = forest.Mark("bare", "#effect-2", "-", 0.05, None, None, None, "bare: no interval", False)
    svg = str(forest.svg([("Paper", [mark, bare])]))
    assert svg.count('class="effect-mark"') == 2 and "<title>huge: ours +3179%</title>" in svg
    marks = svg.split('class="effect-mark"')[1:]
    assert marks[0].count("<path") == 2 and "<line" in marks[0]  # the paper's diamond and an arrow at the edge
    assert "<line" not in marks[1].split("</text>", 1)[1] and "<path" not in marks[1]  # a point, no paper
    assert 'href="#effect-1"' in svg and "no interval" in marks[1]


def test_a_warm_run_says_so_beside_its_cold_time(tmp_path):
    """A run that found global models in the cache is marked warm; a cold run's time is its time
    less the training it did plus every model's recorded training (report/progress.py's estimate)."""
    results = _one_result(tmp_path, "measured", "Why")
    nb = nbformat.v4.new_notebook()
    lines = [
        "[model cache] lstm: reusing /cache/a1 (trained 2026-01-01 on 2 threads in 3000s)\n",
        "[model cache] lstm: trained in 500s, stored in /cache/b2\n",
    ]
    nb.cells = [nbformat.v4.new_markdown_cell("# One\n\n## Why")] + [
        nbformat.v4.new_code_cell(
            "exp.train()",
            outputs=[nbformat.v4.new_output("stream", name="stdout", text=line)],
            metadata={"papermill": {"duration": seconds}},
        )  # fmt: skip
        for line, seconds in zip(lines, (10.0, 520.0))
    ]
    nbformat.write(nb, results / "one" / "one.ipynb")
    (results / "one" / "run.json").write_text(json.dumps({"experiment": "one", "notebook": {"wall_time_s": 600}}))
    entries = publish.build(results, tmp_path / "site", summary_path=tmp_path / "S.md", papers_dir=tmp_path / "papers")
    t = entries[0].run_time
    assert (t.warm, t.reused, t.models, t.trained_s, t.cold_s) == (True, 1, 2, 500.0, 600 - 500 + 3000 + 500)
    page = (tmp_path / "site" / "one" / "index.html").read_text()
    assert "10 min 00 s, warm: 1 global model from the model cache" in page and "~1 h 00 min, estimated" in page
    assert "cold ~1 h 00 min" in (tmp_path / "site" / "index.html").read_text()
