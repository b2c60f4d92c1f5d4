"""Publish results/<scale>/ as a static site that works offline, and a cross-paper SUMMARY.md.

Nothing is executed: each stored executed notebook is re-rendered to HTML with nbconvert's lab
template minus its CDN scripts (require.js, MathJax, Mermaid, widgets), so the site opens from disk
with no network. Every result directory with a run.json is published, whatever it lacks: a missing
field, table or notebook shows as "-", never as a crash. The paper's citation and claimed effects
are read from its facts file, papers/<paper>/paper.toml (data: no experiment module is imported,
which would load TensorFlow).

    python -m ondevice.report.publish --scale default [--results DIR] [--out DIR] [--summary PATH]
                                       [--screenshot docs/site-index.png]

Layout of the site: index.html (experiments and every claimed effect), SUMMARY.md, style.css and
one folder per result: index.html (effects, headline numbers, figures, data, parameters,
environment), notebook.html, the executed .ipynb, run.json, figures/ and tables/.
"""

from __future__ import annotations

import argparse
import csv
import html
import json
import math
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from ondevice import REPO_ROOT
from ondevice.report import facts
from ondevice.report.claims import audit, percent
from ondevice.report.record import atomic_write

RESULTS = Path(os.environ.get("ONDEVICE_RESULTS") or REPO_ROOT / "results")
SITE = REPO_ROOT / "site"
DASH = "-"
VERDICTS = {"holds": "holds", "does not hold": "not", "within noise": "noise"}


# ---------------------------------------------------------------- reading results


@dataclass
class Entry:
    """One result directory as published: its run.json, effects rows and the experiment's claims."""

    slug: str
    path: Path
    run: dict
    effects: list[dict]
    citation: str = DASH
    claims: list[str] = field(default_factory=list)
    title: str = ""
    short: str = DASH
    reference: str = DASH  # the paper's full reference (authors, title, venue), for citing
    notebook: Path | None = None  # the stored executed notebook
    headings: list[str] = field(default_factory=list)  # its Markdown headings, for links to a section

    @property
    def status(self) -> str:
        return str(_get(self.run, "notebook", "status") or DASH)

    @property
    def wall_time_s(self):
        return _get(self.run, "notebook", "wall_time_s", default=None) or self.run.get("wall_time_s")

    @property
    def stand_in(self) -> str:
        value = self.run.get("stand_in_data")
        return value.strip() if isinstance(value, str) else ""

    @property
    def verdict(self) -> str:
        """One word when every effect agrees, else counts ("1 holds, 1 within noise"); "-" without verdicts."""
        verdicts = [r.get("verdict") or "" for r in self.effects]
        if not verdicts or not all(verdicts):
            return DASH
        counts = {v: verdicts.count(v) for v in dict.fromkeys(verdicts)}
        return verdicts[0] if len(counts) == 1 else ", ".join(f"{n} {v}" for v, n in counts.items())


def _get(doc, *keys, default=None):
    for key in keys:
        if not isinstance(doc, dict) or key not in doc:
            return default
        doc = doc[key]
    return doc


def _read_run(path: Path) -> dict:
    """run.json with the fields the pages use coerced to their types (a field of the wrong type is
    dropped), so an old, partial or hand-edited run.json renders as "-" instead of failing."""
    try:
        run = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(run, dict):
        return {}
    for key, kind in (("data", list), ("headline", dict), ("params", dict), ("environment", dict), ("notebook", dict)):
        if not isinstance(run.get(key, kind()), kind):
            run[key] = kind()
    run["data"] = [
        dict(
            d,
            artifacts=[a for a in d.get("artifacts") or [] if isinstance(a, dict)]
            if isinstance(d.get("artifacts"), list)
            else [],
        )
        for d in run.get("data", [])
        if isinstance(d, dict)
    ]
    run["headline"] = {
        str(k): dict(h, per_seed=h["per_seed"] if isinstance(h.get("per_seed"), list) else [])
        for k, h in run.get("headline", {}).items()
        if isinstance(h, dict)
    }
    env = run.get("environment", {})
    for key in ("packages", "git"):
        if not isinstance(env.get(key, {}), dict):
            env[key] = {}
    return run


def read_csv(path: Path) -> tuple[list[str], list[dict]]:
    """Header and rows of a CSV file; ([], []) when it is missing or unreadable."""
    try:
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            rows = list(reader)
            return list(reader.fieldnames or []), rows
    except (OSError, csv.Error, UnicodeDecodeError):
        return [], []


def paper_of(name: str, papers_dir: Path = facts.PAPERS) -> tuple[str, list[str], str]:
    """(citation, claimed effects, short citation) of an experiment from its paper's facts file
    (paper.toml), read as data: the experiment's own citation, else the paper's; ("-", [], "-") for
    an experiment no facts file names, or a facts file that does not parse."""
    try:
        paper = facts.paper_of(name, papers_dir)
        if paper is None:
            return DASH, [], DASH
        parts = [v for v in facts.load(paper, papers_dir)[name].values() if isinstance(v, dict)]
        citation = next((p["citation"] for p in parts if isinstance(p.get("citation"), str)), None)
        claims = [e["claim"] for p in parts for e in p.get("effects", []) if isinstance(e, dict) and "claim" in e]
        return citation or facts.citation(paper, papers_dir), claims, facts.short_citation(paper, papers_dir)
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return DASH, [], DASH


def reference_of(name: str, papers_dir: Path = facts.PAPERS) -> str:
    """The full reference of the paper an experiment reproduces, from its facts file; "-" if none."""
    try:
        paper = facts.paper_of(name, papers_dir)
        return facts.citation(paper, papers_dir) if paper else DASH
    except (OSError, ValueError, KeyError, TypeError):
        return DASH


def _notebook_file(path: Path, slug: str) -> Path | None:
    candidates = [path / f"{slug}.ipynb", path / f"{slug.removesuffix('.failed')}.ipynb", *sorted(path.glob("*.ipynb"))]
    return next((p for p in candidates if p.is_file()), None)


def _headings(notebook: Path | None) -> list[str]:
    """The notebook's Markdown headings in order, without their '#'s (the first is its title)."""
    if notebook is None:
        return []
    try:
        cells = json.loads(notebook.read_text(encoding="utf-8")).get("cells", [])
    except (OSError, ValueError, AttributeError):
        return []
    headings = []
    for cell in cells:
        if isinstance(cell, dict) and cell.get("cell_type") == "markdown":
            source = cell.get("source", "")
            for line in ("".join(source) if isinstance(source, list) else str(source)).splitlines():
                if re.match(r"#{1,6} ", line):
                    headings.append(line.lstrip("#").strip())
    return headings


def load(results_dir: Path, papers_dir: Path = facts.PAPERS) -> list[Entry]:
    """Every results_dir/*/run.json, in name order."""
    entries = []
    for run_path in sorted(results_dir.glob("*/run.json")):
        path = run_path.parent
        run = _read_run(run_path)
        name = run.get("experiment")
        if not (isinstance(name, str) and name.isidentifier()):  # a module name, never a path
            name = path.name.removesuffix(".failed")
        _, effects = read_csv(path / "tables" / "effects.csv")
        citation, claims, short = paper_of(name, papers_dir)
        claims = claims or list(dict.fromkeys(r.get("effect", "") for r in effects if r.get("effect")))
        notebook = _notebook_file(path, path.name)
        headings = _headings(notebook)
        title = headings[0] if headings else path.name
        reference = reference_of(name, papers_dir)
        entries.append(
            Entry(path.name, path, run, effects, citation, claims, title, short, reference, notebook, headings)
        )
    return entries


# ---------------------------------------------------------------- formatting


def _float(value) -> float | None:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def pct(value) -> str:
    x = _float(value)
    return DASH if x is None else percent(x)


def number(value, digits: int = 4) -> str:
    if isinstance(value, bool) or value is None:
        return DASH if value is None else str(value)
    x = _float(value)
    if x is None:
        return str(value) if value not in ("", None) else DASH
    return f"{x:.{digits}g}"


def interval(row: dict) -> str:
    low, high = pct(row.get("ci low")), pct(row.get("ci high"))
    return DASH if DASH in (low, high) else f"{low} to {high}"


def level(row: dict) -> str:
    x = _float(row.get("level"))
    return f"{x:.0%}" if x is not None else "95%"


def duration(seconds) -> str:
    s = _float(seconds)
    if s is None:
        return DASH
    s = round(s)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


LOCATION = re.compile(r"(Sec|Section|Table|Tab|Fig|Figure|Eq|footnote|p)\b\.?", re.IGNORECASE)


def short_citation(citation: str) -> str:
    """The citation without where in the paper: 'Xu et al., DeepType, IMWUT 2018' from '..., IMWUT
    2018, Table 1'; commas inside parentheses do not split ('Yang, MoIL (MASc thesis, U. Toronto, 2022)')."""
    if not citation or citation == DASH:
        return DASH
    parts, depth, current = [], 0, ""
    for ch in citation:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += ch
    parts.append(current.strip())
    kept = [p for p in parts[: next((i for i, p in enumerate(parts) if i and LOCATION.match(p)), len(parts))] if p]
    return ", ".join(kept[:3])


# Columns of effects.csv that count what an interval resampled, and the unit each counts.
COUNTED = (("users", None), ("devices", "devices"), ("test samples", "test samples"), ("repeats", "repeats"))


def counts(row: dict) -> str:
    """What the interval resampled and how many: '20 users x 3 seeds', '4 users x 5 repeats x 1 seed',
    '2000 test samples x 2 seeds'. The `users` column counts the units a row's `resampled` names
    (devices, repeats); a row that records nothing says "not recorded", never a silent dash."""
    parts = []
    for column, unit in COUNTED:
        n = _float(row.get(column))
        if n is not None:
            parts.append(f"{n:g} {unit or str(row.get('resampled') or '').strip() or 'users'}")
    seeds = _float(row.get("seeds"))
    if seeds is not None:
        parts.append(f"{seeds:g} seed{'s' if seeds != 1 else ''}")
    if not parts:
        return "not recorded"
    return " x ".join(parts) + ("" if seeds is not None else " (seeds not recorded)")


def ratio(row: dict) -> str:
    """Ours / the paper's change ('2.5x', '-0.4x'); '-' where the paper gives no change or zero."""
    paper, ours = _float(row.get("paper change")), _float(row.get("our change"))
    return DASH if paper in (None, 0.0) or ours is None else f"{ours / paper:.2g}x"


def diagnosis(row: dict) -> str:
    """The audit rule (`claims.audit`) on one effects.csv row, with the experiment's diagnosis if it
    gave one: "agrees ...", "differs, explained by ...", "unexplained" or why it cannot tell."""
    return audit(
        row.get("paper change"), row.get("our change"), row.get("ci low"), row.get("ci high"), row.get("diagnosis")
    )


def anchor(section: str) -> str:
    """The URL fragment Jupyter and nbconvert give a notebook heading: its text with spaces as '-'
    (Markdown emphasis and code marks dropped); a section given as '#anchor' is kept as it is."""
    section = section.strip()
    if section.startswith("#") and not section.lstrip("#").startswith(" "):
        return section[1:]
    text = re.sub(r"[`*]|(?<!\w)_|_(?!\w)", "", section.lstrip("#").strip())
    return quote(text.replace(" ", "-"), safe="?/:@!$&'()*+,;=")


def section_link(e: "Entry", row: dict) -> str | None:
    """Where a row's diagnosis is measured: the anchor of its notebook section when the stored
    notebook has that heading; None without a section, a notebook, or a matching heading."""
    section = str(row.get("section") or "").strip()
    if not section or e.notebook is None:
        return None
    target = anchor(section)
    return target if target in {anchor(h) for h in e.headings} else None


# ---------------------------------------------------------------- SUMMARY.md

MD_SPECIAL = re.compile(r"([\\|<>&*`\[\]])")


def _md(text) -> str:
    """Text for a Markdown table cell: one line, with the characters that would make markup escaped."""
    return MD_SPECIAL.sub(r"\\\1", " ".join(str(text).split()))


def _md_link(text: str, target: str) -> str:
    """A Markdown link; parentheses in the target are percent-encoded so they cannot end it."""
    return f"[{_md(text)}]({target.replace('(', '%28').replace(')', '%29')})"


EXPLAINED = "differs, explained by "


def diagnosis_of(e: Entry | None, row: dict) -> tuple[str, str | None]:
    """The diagnosis cell's text and, for an explained row whose section is a heading of the stored
    notebook, that heading's anchor (the link target); a section the notebook lacks is said."""
    text = diagnosis(row)
    section = str(row.get("section") or "").strip()
    if not text.startswith(EXPLAINED) or not section or e is None:
        return text, None
    target = section_link(e, row)
    return (text, target) if target else (f"{text} (its section {section!r} is not a heading of the notebook)", None)


def diagnosis_markdown(e: Entry, row: dict, prefix: str = "") -> str:
    """The diagnosis cell in Markdown, an explained row linked to the notebook section that measures
    it (`prefix`: the path from the page to the result's folder)."""
    text, target = diagnosis_of(e, row)
    if target is None:
        return _md(text)
    return EXPLAINED + _md_link(text.removeprefix(EXPLAINED), f"{prefix}{quote(e.notebook.name)}#{target}")


def _effect_cells_markdown(e: Entry, r: dict, prefix: str = "") -> list[str]:
    """One effects.csv row as Markdown cells under EFFECTS_MD_HEADER."""
    span = interval(r) if interval(r) == DASH else f"{interval(r)} ({level(r)})"
    plain = (r.get("effect") or DASH, pct(r.get("paper change")), pct(r.get("our change")), ratio(r), span)
    return [_md(c) for c in (*plain, counts(r), r.get("verdict") or DASH)] + [diagnosis_markdown(e, r, prefix)]


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


EFFECTS_MD_HEADER = [
    "| effect | paper's change | our change | ours / paper | interval | resampled | verdict | diagnosis |",
    "|---|---:|---:|---:|---|---|---|---|",
]
INLINE_ROWS, INLINE_COLUMNS = 12, 9  # a table this small is shown on the page, a larger one linked
SHOWN_ELSEWHERE = {"effects.csv", "headline.csv", "paper_vs_ours.csv"}


def _csv_markdown(path: Path) -> list[str]:
    header, rows = read_csv(path)
    lines = ["| " + " | ".join(_md(h) for h in header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(_md(number(r.get(h))) for h in header) + " |" for r in rows]


def _provenance_markdown(e: Entry) -> list[str]:
    run, env = e.run, e.run.get("environment", {})
    git = env.get("git") or {}
    commit = str(git.get("commit") or DASH)[:12] + (" (uncommitted changes)" if git.get("dirty") else "")
    machine = ", ".join(
        str(x) for x in (env.get("cpu"), f"{env['cpu_count']} cores" if env.get("cpu_count") else None) if x
    )
    packages = ", ".join(f"{k} {v}" for k, v in env.get("packages", {}).items())
    lines = [
        f"- created {_md(run.get('created_at') or DASH)} from code `{commit}` in {duration(e.wall_time_s)}"
        f" ({_md(_get(run, 'notebook', 'executed_by') or 'executed')})",
        f"- machine: {_md(machine or DASH)}; Python {_md(env.get('python') or DASH)}; {_md(packages or DASH)}",
    ]
    for d in run.get("data", []):
        files = ", ".join(f"`{a.get('file', DASH)}` (sha256 {str(a.get('sha256', DASH))[:16]})" for a in d["artifacts"])
        stand_in = f"; stands in for {d['stand_in_for']}" if d.get("stand_in_for") else ""
        license = str(d.get("license") or DASH).rstrip(". ")
        lines.append(f"- data {_md(d.get('name', DASH))}: {_md(license)}{_md(stand_in)}; {files or DASH}")
    params = run.get("params", {})
    lines += ["", f"<details><summary>Parameters ({len(params)})</summary>", ""]
    lines += ["| name | value |", "|---|---|"] if params else [DASH]
    lines += [f"| `{_md(k)}` | {_md(json.dumps(v) if isinstance(v, (dict, list)) else v)} |" for k, v in params.items()]
    return lines + ["", "</details>"]


def experiment_markdown(e: Entry, scale: str) -> str:
    """results/<scale>/<name>/README.md: one result as a page that renders wherever the results are
    browsed (GitHub, an editor): its claims with ratio and diagnosis, headline numbers, the paper's
    numbers beside ours, figures, its small tables, files and provenance."""
    lines = [
        f"# {_md(e.title)}",
        "",
        f"`{e.slug}` at scale `{scale}`, one of [all results](../SUMMARY.md): generated by `make publish` from "
        "this folder's run.json, tables and figures; do not edit by hand.",
        "",
    ]
    if e.stand_in:
        lines += [
            f"> **Stand-in data.** {_md(e.stand_in)} Absolute numbers are not comparable with the paper's; "
            "the direction and size of each effect are.",
            "",
        ]
    lines += [
        f"- paper: {_md(e.citation)}",
        f"- reference: {_md(e.reference)}",
        f"- status: {_md(e.status)}; verdicts: {_md(e.verdict)}",
    ]
    if e.notebook is not None:
        lines.append(f"- executed notebook: {_md_link(e.notebook.name, quote(e.notebook.name))}")
    lines += ["", "## Claimed effects", ""]
    lines += (
        EFFECTS_MD_HEADER + [_row(_effect_cells_markdown(e, r)) for r in e.effects]
        if e.effects
        else [f"{DASH} (no effects table)"]
    )
    headline = e.run.get("headline", {})
    lines += ["", "## Headline numbers", ""]
    if headline:
        lines += ["| quantity | mean over seeds | tolerance | seeds |", "|---|---:|---:|---:|"]
        for name, h in headline.items():
            value, tolerance = number(_get(h, "value")), number(_get(h, "tolerance"))
            lines.append(f"| {_md(name)} | {_md(value)} | {_md(tolerance)} | {len(h['per_seed'])} |")
    else:
        lines.append(f"{DASH} (no headline numbers)")
    if (e.path / "tables" / "paper_vs_ours.csv").is_file():
        lines += ["", "## The paper's numbers beside ours", "", *_csv_markdown(e.path / "tables" / "paper_vs_ours.csv")]
    figures = sorted(p.stem for p in (e.path / "figures").glob("*.png"))
    if figures:
        lines += ["", "## Figures", ""] + [f"![{_md(f)}](figures/{quote(f)}.png)" for f in figures]
    small, large = [], []
    for t in sorted((e.path / "tables").glob("*.csv")):
        header, rows = read_csv(t)
        shown = t.name not in SHOWN_ELSEWHERE and 0 < len(rows) <= INLINE_ROWS and len(header) <= INLINE_COLUMNS
        (small if shown else large).append((_md_link(f"tables/{t.name}", f"tables/{quote(t.name)}"), t, len(rows)))
    if small or large:
        lines += ["", "## Tables", ""]
    for link, t, _ in small:
        lines += [f"### {link}", "", *_csv_markdown(t), ""]
    lines += ["As CSV:", ""] + [f"- {link}: {n} rows" for link, _, n in large] + [""] if large else []
    lines += ["## Provenance", "", "All of it in [run.json](run.json).", "", *_provenance_markdown(e)]
    return "\n".join(lines) + "\n"


def summary_markdown(entries: list[Entry], scale: str) -> str:
    """Every claimed effect of every result: the paper's change, ours, the interval and the verdict."""
    lines = [
        f"# Paper vs ours, scale `{scale}`",
        "",
        "Every effect a paper claims, the paper's change beside ours, measured here with a paired bootstrap "
        "interval. **ours / paper** is the ratio of the two changes; **resampled** says what the interval "
        "resampled and how many: users (devices, repeats, test samples), each keeping its values in every "
        "seed, then the seeds. Verdict: **holds** (interval "
        "above zero), **does not hold** (below zero), **within noise** (contains zero); `-` where a result does "
        "not carry it. Diagnosis, computed by one rule for every row (`claims.audit`): where the interval "
        "excludes the paper's change and ours is more than 3x off or of the other sign (for a paper change "
        "near zero, the interval alone decides), *differs, explained by* the experiment's measurement, linked "
        "to the notebook section that shows it, or else **unexplained**; the verdict is unchanged. Each "
        "experiment links to its generated page (claims, tables, figures, provenance). Generated by "
        "`make publish` (`python -m ondevice.report.publish`) from each `*/tables/effects.csv`; "
        "do not edit by hand.",
        "",
    ]
    rows = [(e, r) for e in entries for r in e.effects]
    if not rows:
        lines.append(f"No claimed effects in `results/{scale}/` yet (run `make reproduce SCALE={scale}`).")
        return "\n".join(lines) + "\n"
    lines += [
        "| paper | experiment | effect | paper's change | our change | ours / paper | interval | resampled | "
        "verdict | diagnosis | data |",
        "|---|---|---|---:|---:|---:|---|---|---|---|---|",
    ]
    for e, r in rows:
        short = e.short if e.short != DASH else short_citation(e.citation)
        page = _md_link(e.slug, f"{quote(e.slug)}/README.md")
        cells = _effect_cells_markdown(e, r, f"{quote(e.slug)}/")
        lines.append(_row([_md(short), page, *cells, _md(data_kind(e, r))]))
    stand_ins = [e for e in entries if e.stand_in and e.effects]
    if stand_ins:
        lines += [
            "",
            "Stand-in data: absolute numbers are not comparable with the paper's; the direction and "
            "size of each effect are.",
        ]
        lines += [f"- {_md(e.slug)}: {_md(e.stand_in)}" for e in stand_ins]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- HTML


def esc(value) -> str:
    return html.escape(str(value), quote=True)


def href(*parts: str) -> str:
    """A relative link from path parts (file names come from disk), URL-quoted and escaped for an attribute."""
    return esc("/".join(quote(p) for p in parts))


CSS = """
:root { --ink: #1d2329; --muted: #5b6670; --line: #d9dee3; --band: #f5f7f9; --accent: #24598f;
  --ok: #1e7b3c; --ok-bg: #e3f4e8; --bad: #a3262f; --bad-bg: #fbe5e6; --mid: #7a5a00; --mid-bg: #fbf0cf; }
* { box-sizing: border-box; }
body { margin: 0; color: var(--ink); background: #fff; line-height: 1.5;
  font: 16px/1.55 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
main { max-width: 78rem; margin: 0 auto; padding: 1.5rem 1.5rem 4rem; }
header.site { border-bottom: 1px solid var(--line); background: var(--band); }
header.site div { max-width: 78rem; margin: 0 auto; padding: .6rem 1.5rem; font-size: .9rem; color: var(--muted); }
a { color: var(--accent); text-decoration-thickness: 1px; text-underline-offset: 2px; }
h1 { font-size: 1.7rem; line-height: 1.25; margin: .4rem 0 .3rem; }
h2 { font-size: 1.2rem; margin: 2.2rem 0 .6rem; padding-bottom: .25rem; border-bottom: 1px solid var(--line); }
p.lead, p.meta, .muted { color: var(--muted); }
p.lead { max-width: 60rem; margin-top: .2rem; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; font-size: .92rem; margin: .4rem 0 1rem; }
th, td { padding: .42rem .7rem; border-bottom: 1px solid var(--line); vertical-align: top; text-align: left; }
th { font-weight: 600; background: var(--band); border-bottom: 2px solid var(--line); white-space: nowrap; }
tbody tr:nth-child(even) td { background: #fafbfc; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.nowrap { white-space: nowrap; }
td small, .small { font-size: .82rem; color: var(--muted); }
.badge { display: inline-block; padding: .05rem .5rem; border-radius: 999px; font-size: .8rem; font-weight: 600;
  white-space: nowrap; border: 1px solid transparent; }
.v-holds { color: var(--ok); background: var(--ok-bg); border-color: #b7e0c2; }
.v-not { color: var(--bad); background: var(--bad-bg); border-color: #f0b9bd; }
.v-noise { color: var(--mid); background: var(--mid-bg); border-color: #ecd58f; }
.v-none, .s-other { color: var(--muted); background: var(--band); border-color: var(--line); }
.s-complete { color: var(--ok); background: var(--ok-bg); border-color: #b7e0c2; }
.s-failed { color: var(--bad); background: var(--bad-bg); border-color: #f0b9bd; }
.standin { color: #6b4a00; background: #fff4d6; border-color: #efd48b; }
.callout { border-left: 4px solid #e0b53a; background: #fff9e8; padding: .7rem 1rem; margin: 1rem 0; max-width: 60rem; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: .25rem 1.2rem; margin: 1rem 0; }
dl.facts dt { color: var(--muted); } dl.facts dd { margin: 0; }
ul.links { display: flex; flex-wrap: wrap; gap: .4rem 1.2rem; padding: 0; list-style: none; }
.figures { display: grid; grid-template-columns: repeat(auto-fill, minmax(26rem, 1fr)); gap: 1.2rem; }
figure { margin: 0; border: 1px solid var(--line); border-radius: 6px; padding: .6rem; background: #fff; }
figure img { width: 100%; height: auto; display: block; }
figcaption { font-size: .85rem; color: var(--muted); margin-top: .4rem; }
details { margin: .6rem 0; } summary { cursor: pointer; font-weight: 600; }
code { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: .88em; }
footer { margin-top: 3rem; font-size: .85rem; color: var(--muted); }
"""


def _badge(text: str, kind: str) -> str:
    return f'<span class="badge {kind}">{esc(text)}</span>'


def verdict_badge(verdict: str) -> str:
    if verdict in VERDICTS:
        return _badge(verdict, f"v-{VERDICTS[verdict]}")
    return _badge(verdict or DASH, "v-none")


def status_badge(status: str) -> str:
    return _badge(status, f"s-{status}" if status in ("complete", "failed") else "s-other")


def _page(title: str, body: str, root: str, crumbs: str) -> str:
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{esc(title)}</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="{root}style.css">
</head>
<body>
<header class="site"><div>{crumbs}</div></header>
<main>
{body}
<footer>Built by <code>make publish</code> from stored results; nothing was re-executed.</footer>
</main>
</body>
</html>
"""


def _table(header: list[tuple[str, str]], rows: list[list[str]]) -> str:
    """header: (label, css class); rows: cells already escaped HTML."""
    head = "".join(f'<th class="{c}" scope="col">{esc(h)}</th>' for h, c in header)
    body = "\n".join(
        "<tr>" + "".join(f'<td class="{c}">{cell}</td>' for (_, c), cell in zip(header, row)) + "</tr>" for row in rows
    )
    return f'<div class="scroll"><table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}\n</tbody></table></div>'


def _data_cell(e: Entry) -> str:
    names = [esc(d.get("name", DASH)) for d in e.run.get("data", [])]
    text = ", ".join(names) or DASH
    if e.stand_in:
        text += " " + _badge("stand-in data", "standin")
    return text


def diagnosis_html(e: Entry | None, row: dict, prefix: str = "") -> str:
    """The diagnosis cell in HTML, an explained row linked to its section of the rendered notebook."""
    text, target = diagnosis_of(e, row)
    if target is None:
        return esc(text)
    explained = esc(text.removeprefix(EXPLAINED))
    return f'{EXPLAINED}<a href="{esc(prefix)}notebook.html#{esc(target)}">{explained}</a>'


def _effect_cells(r: dict, e: Entry | None = None, prefix: str = "") -> list[str]:
    """One effects.csv row as cells under EFFECT_HEADER (`prefix`: the path from the page to the result's folder)."""
    span = interval(r)
    span = esc(span) + (f" <small>({esc(level(r))})</small>" if span != DASH else "")
    effect = esc(r.get("effect") or DASH)
    if "modelled" in str(r.get("meter") or "").lower():
        effect += " " + _badge("modelled", "standin")
    return [
        effect,
        esc(pct(r.get("paper change"))),
        esc(pct(r.get("our change"))),
        esc(ratio(r)),
        span,
        esc(counts(r)),
        verdict_badge(r.get("verdict") or DASH),
        diagnosis_html(e, r, prefix),
    ]


def data_kind(e: Entry, row: dict | None = None) -> str:
    """Stand-in or original data, and "modelled" when an effect's numbers come from a model
    (an effects.csv `meter` column saying so), so a modelled number never reads as measured."""
    kind = "stand-in" if e.stand_in else "original" if e.run.get("data") else DASH
    if row and "modelled" in str(row.get("meter") or "").lower():
        kind += ", modelled"
    return kind


EFFECT_HEADER = [
    ("effect", ""),
    ("paper's change", "num"),
    ("our change", "num"),
    ("ours / paper", "num"),
    ("interval", "nowrap"),
    ("resampled", ""),
    ("verdict", ""),
    ("diagnosis", ""),
]


def index_page(entries: list[Entry], scale: str) -> str:
    rows = []
    for e in entries:
        claims = "<br>".join(esc(c) for c in e.claims) or DASH
        rows.append(
            [
                f'<a href="{href(e.slug, "index.html")}">{esc(e.slug)}</a><br><small>{esc(e.title)}</small>',
                esc(short_citation(e.citation)) + _citation_rest(e.citation),
                claims,
                status_badge(e.status),
                verdict_badge(e.verdict),
                esc(duration(e.wall_time_s)),
                _data_cell(e),
            ]
        )
    if rows:
        experiments = _table(
            [
                ("experiment", ""),
                ("paper", ""),
                ("claim", ""),
                ("status", ""),
                ("verdict", ""),
                ("wall time", "num"),
                ("data", ""),
            ],
            rows,
        )
    else:
        experiments = (
            f"<p>No results in <code>results/{esc(scale)}/</code> yet: run "
            f"<code>make reproduce SCALE={esc(scale)}</code>.</p>"
        )
    link = '{}<br><small><a href="{}">{}</a></small>'
    effects = [
        [link.format(esc(short_citation(e.citation)), href(e.slug, "index.html"), esc(e.slug))]
        + _effect_cells(r, e, f"{quote(e.slug)}/")
        + [_badge("stand-in", "standin") if e.stand_in else esc(data_kind(e))]
        for e in entries
        for r in e.effects
    ]
    summary = (
        _table([("paper / experiment", "")] + EFFECT_HEADER + [("data", "")], effects)
        if effects
        else "<p>No claimed effects measured yet.</p>"
    )
    n_effects = len(effects)
    body = f"""<h1>On-device personalization: paper vs ours</h1>
<p class="lead">Results at scale <code>{esc(scale)}</code>: {len(entries)} experiment{"s" * (len(entries) != 1)},
{n_effects} claimed effect{"s" * (n_effects != 1)}. Each notebook was executed by <code>make reproduce</code>;
this site only renders what it stored.</p>
<h2>Experiments</h2>
{experiments}
<h2 id="summary">Every claimed effect</h2>
<p class="lead">The paper's change beside ours, with our paired bootstrap interval over users. Verdict:
{verdict_badge("holds")} the interval is above zero, {verdict_badge("does not hold")} below zero,
{verdict_badge("within noise")} it contains zero. With {_badge("stand-in", "standin")} data, absolute numbers are
not comparable with the paper's; the direction and size of each effect are. Also as
<a href="SUMMARY.md">SUMMARY.md</a>.</p>
{summary}"""
    crumbs = f"ondevice &middot; results &middot; scale <code>{esc(scale)}</code>"
    return _page(f"ondevice results ({scale})", body, "", crumbs)


def _citation_rest(citation: str) -> str:
    """What the full citation adds to its short form, as a second, smaller line."""
    rest = citation[len(short_citation(citation)) :].lstrip(", ") if citation != DASH else ""
    return f"<br><small>{esc(rest)}</small>" if rest else ""


def _csv_table(path: Path, digits: int = 4) -> str:
    header, rows = read_csv(path)
    if not header:
        return ""
    numeric = {h for h in header if rows and all(_float(r.get(h)) is not None or r.get(h) in ("", None) for r in rows)}
    return _table(
        [(h, "num" if h in numeric else "") for h in header],
        [[esc(number(r.get(h), digits) if h in numeric else (r.get(h) or DASH)) for h in header] for r in rows],
    )


def _kv_table(doc: dict) -> str:
    rows = [
        [f"<code>{esc(k)}</code>", esc(json.dumps(v) if isinstance(v, (dict, list)) else v)] for k, v in doc.items()
    ]
    return _table([("name", ""), ("value", "")], rows) if rows else f"<p>{DASH}</p>"


def experiment_page(e: Entry, scale: str, has_notebook: bool, figures: list[str], tables: list[str]) -> str:
    run = e.run
    git = _get(run, "environment", "git", default={}) or {}
    commit = str(git.get("commit") or DASH)[:12] + (" (uncommitted changes)" if git.get("dirty") else "")
    facts = [
        ("paper", esc(e.citation)),
        ("status", status_badge(e.status)),
        ("verdict", verdict_badge(e.verdict)),
        ("wall time", esc(duration(e.wall_time_s))),
        ("scale", esc(run.get("scale", DASH))),
        ("created", esc(run.get("created_at", DASH))),
        ("code", f"<code>{esc(commit)}</code>"),
    ]
    error = _get(run, "notebook", "error")
    if error:
        facts.append(("error", f"<code>{esc(error)}</code>"))
    links = [("rendered notebook", href("notebook.html"))] if has_notebook else []
    links += [("executed notebook (.ipynb)", href(f"{e.slug}.ipynb"))] if has_notebook else []
    links += [("run.json", href("run.json"))]
    parts = [
        f"<h1>{esc(e.title)}</h1>",
        f'<p class="meta"><code>{esc(e.slug)}</code> &middot; scale <code>{esc(scale)}</code></p>',
    ]
    if e.stand_in:
        parts.append(
            f'<div class="callout">{_badge("stand-in data", "standin")} {esc(e.stand_in)} Absolute numbers are '
            "not comparable with the paper's; the direction and size of each effect are.</div>"
        )
    parts.append('<dl class="facts">' + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts) + "</dl>")
    parts.append('<ul class="links">' + "".join(f'<li><a href="{h}">{esc(t)}</a></li>' for t, h in links) + "</ul>")
    parts.append("<h2>Claimed effects</h2>")
    parts.append(
        _table(EFFECT_HEADER, [_effect_cells(r, e) for r in e.effects])
        if e.effects
        else f"<p>{DASH} (no effects table)</p>"
    )
    headline = run.get("headline", {})
    parts.append("<h2>Headline numbers</h2>")
    if headline:
        rows = [
            [
                esc(name),
                esc(number(_get(h, "value"))),
                esc(number(_get(h, "tolerance"))),
                esc(len(h["per_seed"])),
                esc(", ".join(number(v) for v in h["per_seed"]) or DASH),
            ]
            for name, h in headline.items()
        ]
        parts.append(
            _table(
                [
                    ("quantity", ""),
                    ("mean over seeds", "num"),
                    ("tolerance", "num"),
                    ("seeds", "num"),
                    ("per seed", ""),
                ],
                rows,
            )
        )
    else:
        parts.append(f"<p>{DASH} (this result has no headline numbers)</p>")
    if "paper_vs_ours.csv" in tables:
        parts += ["<h2>The paper's numbers beside ours</h2>", _csv_table(e.path / "tables" / "paper_vs_ours.csv")]
    if figures:
        parts.append("<h2>Figures</h2>")
        figs = []
        for name in figures:
            has_svg = (e.path / "figures" / f"{name}.svg").is_file()
            svg = f' &middot; <a href="{href("figures", name + ".svg")}">SVG</a>' if has_svg else ""
            figs.append(
                f'<figure><img src="{href("figures", name + ".png")}" alt="{esc(name)}" loading="eager">'
                f"<figcaption>{esc(name.replace('_', ' '))}{svg}</figcaption></figure>"
            )
        parts.append('<div class="figures">' + "\n".join(figs) + "</div>")
    if tables:
        parts.append("<h2>Tables</h2>")
        items = "".join(f'<li><a href="{href("tables", t)}">{esc(t)}</a></li>' for t in tables)
        parts.append(f'<ul class="links">{items}</ul>')
    parts.append("<h2>Data</h2>")
    data_rows = [
        [
            esc(d.get("name", DASH)),
            esc(d.get("license", DASH)),
            esc(d.get("stand_in_for") or DASH),
            "<br>".join(
                f"<code>{esc(a.get('file', DASH))}</code> <small>sha256 {esc(str(a.get('sha256', DASH))[:16])}</small>"
                for a in d["artifacts"]
            )
            or DASH,
        ]
        for d in run.get("data", [])
    ]
    parts.append(
        _table([("name", ""), ("license", ""), ("stands in for", ""), ("files", "")], data_rows)
        if data_rows
        else f"<p>{DASH}</p>"
    )
    params = run.get("params", {})
    parts.append(f"<details><summary>Parameters ({len(params)})</summary>{_kv_table(params)}</details>")
    env = run.get("environment", {})
    flat = {k: v for k, v in env.items() if k != "packages"}
    flat.update({f"package {k}": v for k, v in env.get("packages", {}).items()})
    parts.append(f"<details><summary>Environment</summary>{_kv_table(flat)}</details>")
    crumbs = f'<a href="../index.html">all results ({esc(scale)})</a> &middot; {esc(e.slug)}'
    return _page(f"{e.slug}: {e.title}", "\n".join(parts), "../", crumbs)


# ---------------------------------------------------------------- notebooks

OFFLINE_TEMPLATE = """{%- extends 'index.html.j2' -%}
{%- block html_head_js -%}{%- endblock html_head_js -%}
{%- block jupyter_widgets -%}{%- endblock jupyter_widgets -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block html_head_css -%}
<style>
nav.publish { font: 14px/1.5 system-ui, sans-serif; color: #5b6670; padding: 10px 16px; margin: 0 0 12px;
  background: #f5f7f9; border-bottom: 1px solid #d9dee3; }
nav.publish a { color: #24598f; }
</style>
{%- endblock html_head_css -%}
{%- block body_header -%}
{{ super() }}
<nav class="publish">{{ resources.publish_nav }}</nav>
{%- endblock body_header -%}
"""


def _exporter():
    """nbconvert's lab template without the blocks that load scripts from a CDN (the site must work
    offline; stored outputs are static, so nothing needs require.js, and math stays as TeX)."""
    from jinja2 import DictLoader
    from nbconvert import HTMLExporter

    return HTMLExporter(
        template_name="lab",
        extra_loaders=[DictLoader({"offline.html.j2": OFFLINE_TEMPLATE})],
        template_file="offline.html.j2",
    )


def render_notebook(path: Path, nav: str, title: str = "", exporter=None) -> str:
    import nbformat

    nb = nbformat.read(path, as_version=4)
    resources = {"publish_nav": nav, "metadata": {"name": title or path.stem}}
    body, _ = (exporter or _exporter()).from_notebook_node(nb, resources=resources)
    return body


# ---------------------------------------------------------------- build


def build(
    results_dir: Path,
    out_dir: Path,
    summary_path: Path | None = None,
    scale: str | None = None,
    papers_dir: Path = facts.PAPERS,
    log=print,
    pages_dir: Path | None = None,
) -> list[Entry]:
    """Write the site into out_dir (replaced whole, via a staging directory), SUMMARY.md
    (atomically) to summary_path, default results_dir/SUMMARY.md, and each result's README.md page
    to pages_dir/<name>/ (default: the result's own folder)."""
    results_dir, out_dir = Path(results_dir), Path(out_dir)
    scale = scale or results_dir.name
    if not results_dir.is_dir():
        raise FileNotFoundError(f"no results directory {results_dir} (run `make reproduce SCALE={scale}` first)")
    entries = load(results_dir, papers_dir)
    summary = summary_markdown(entries, scale)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = out_dir.with_name(f".staging-{out_dir.name}-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        (staging / "style.css").write_text(CSS.lstrip(), encoding="utf-8")
        (staging / "SUMMARY.md").write_text(summary, encoding="utf-8")
        exporter = None
        for e in entries:
            dest = staging / e.slug
            dest.mkdir()
            shutil.copy2(e.path / "run.json", dest / "run.json")
            figures = sorted(p.stem for p in (e.path / "figures").glob("*.png"))
            tables = sorted(p.name for p in (e.path / "tables").glob("*.csv"))
            svgs = [p.name for p in (e.path / "figures").glob("*.svg")]
            for sub, names in (("figures", [f"{f}.png" for f in figures] + svgs), ("tables", tables)):
                if names:
                    (dest / sub).mkdir()
                for name in names:
                    shutil.copy2(e.path / sub / name, dest / sub / name)
            notebook = _notebook_file(e.path, e.slug)
            if notebook is not None:
                nav = (
                    f'<a href="../index.html">all results ({esc(scale)})</a> &middot; '
                    f'<a href="index.html">{esc(e.slug)}</a> &middot; rendered notebook (stored outputs)'
                )
                exporter = exporter or _exporter()
                try:
                    (dest / "notebook.html").write_text(
                        render_notebook(notebook, nav, e.title, exporter), encoding="utf-8"
                    )
                    shutil.copy2(notebook, dest / f"{e.slug}.ipynb")
                except Exception as exc:  # an unreadable notebook costs its page, not the site
                    log(f"[publish] {e.slug}: could not render {notebook.name}: {type(exc).__name__}: {exc}")
                    notebook = e.notebook = None  # no section links into a notebook the site lacks
            page = experiment_page(e, scale, notebook is not None, figures, tables)
            (dest / "index.html").write_text(page, encoding="utf-8")
        (staging / "index.html").write_text(index_page(entries, scale), encoding="utf-8")
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
        page = experiment_markdown(e, scale)
        atomic_write(Path(pages_dir or results_dir) / e.slug / "README.md", lambda p, t=page: p.write_text(t, "utf-8"))
    return entries


def screenshot(page: Path, dest: Path, width: int = 1280) -> None:
    """A full-page PNG of a built page (the README's picture of the index), taken with the same
    system Chromium the browser test uses (ONDEVICE_CHROMIUM, default /usr/bin/chromium)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=os.environ.get("ONDEVICE_CHROMIUM") or "/usr/bin/chromium")
        try:
            view = browser.new_page(viewport={"width": width, "height": 720})
            view.goto(Path(page).resolve().as_uri(), wait_until="load")
            png = view.screenshot(full_page=True)
        finally:
            browser.close()
    atomic_write(Path(dest), lambda p: p.write_bytes(png))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", default="default")
    ap.add_argument("--results", type=Path, help="results directory (default: results/<scale>)")
    ap.add_argument("--out", type=Path, help="site directory (default: site/<scale>)")
    ap.add_argument("--summary", type=Path, help="where SUMMARY.md goes (default: <results>/SUMMARY.md)")
    ap.add_argument("--screenshot", type=Path, help="also save a PNG of the index page here (e.g. docs/site-index.png)")
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
        screenshot(out / "index.html", args.screenshot)
        print(f"[publish] screenshot of the index page: {args.screenshot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
