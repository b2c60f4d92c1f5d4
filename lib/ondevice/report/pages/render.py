"""The content model rendered by the Jinja2 templates in templates/: HTML with autoescaping (every
value from a result is text, whatever it contains), Markdown without it (its templates escape
through the `md` filter). A template that is missing or names an undefined value is an error,
never a blank. Executed notebooks are rendered by nbconvert's lab template minus its CDN scripts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jinja2

from ondevice.report import judge
from ondevice.report.pages import forest
from ondevice.report.pages.cells import (
    DASH,
    citation_rest,
    duration,
    href,
    md,
    md_link,
    number,
    short_citation,
)
from ondevice.report.pages.content import Effect, Experiment, Table

TEMPLATES = Path(__file__).resolve().parent / "templates"
NOTEBOOK_TEMPLATE = "offline.html.j2"  # in templates/notebook/, beside nothing of ours that nbconvert could pick up
VERDICTS = {
    "holds": "holds",
    "does not hold": "not",
    "within noise": "noise",
    "inconclusive": "inconclusive",
}  # verdict -> badge class v-<...>


def value(v):
    """A parameter or environment value as shown: a dict or list as JSON."""
    return json.dumps(v) if isinstance(v, (dict, list)) else v


def stale_text(entries: list[Experiment]) -> str:
    """SUMMARY.md's line on results whose measuring code has changed since their run."""
    stale = [e.slug for e in entries if e.changed["stale"]]
    unknown = [e.slug for e in entries if e.changed["stale"] is None]
    text = f"**{len(stale)} of {len(entries)} results were measured by code that has changed since**"
    text += f" (re-run them with `make reproduce`): {', '.join(stale)}." if stale else "."
    return text + (f" Unknown for {len(unknown)}: {', '.join(unknown)}." if unknown else "")


def drawn_text(entries: list[Experiment]) -> str:
    """SUMMARY.md's line on where the intervals come from: drawn at publish from stored paired values
    (`judge.recomputed`), or as the notebook stored them (runs from before paired values were kept)."""
    rows = [f.row for e in entries for f in e.effects]
    drawn = sum(str(r.get(judge.DRAWN, "")).startswith("at publish") for r in rows)
    return (
        f"**{drawn} of {len(rows)} intervals were drawn at publish** from the paired values their run stored "
        f"(per user and seed, with the bootstrap's generator state: unchanged rules give the stored interval "
        f"to the last digit, at {judge.LEVEL:.0%}); the others are as their notebook stored them."
    )


ONE_LINE = 120  # characters of a diagnosis a table cell holds; the whole of it follows the table
OURS_TO_FIX = {"open", "unexplained"}  # diagnosis kinds that name no cause outside our implementation


def clauses(text: str, marks: str = ";") -> list[str]:
    """The text split after each of `marks` that stands outside parentheses and brackets (a
    diagnosis's clauses: its cause first, then the numbers that show it)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += (ch in "([") - (ch in ")]")
        if depth <= 0 and ch in marks and text[i + 1 : i + 2] in (" ", ""):
            parts.append(text[start : i + 1].strip())
            start = i + 1
    return [p for p in [*parts, text[start:].strip()] if p]


SENTENCE = re.compile(r"(?<=[a-z0-9)]{2}\.) (?=[A-Z])")


def one_line(text: str, limit: int = ONE_LINE) -> str:
    """A diagnosis as a table cell shows it: its first clause (to the first ':' or ';' outside
    parentheses, or the first sentence's end), cut at a word with '…' when still over `limit`."""
    first = SENTENCE.split(clauses(" ".join(str(text).split()), ":;")[0])[0].rstrip(":;.")
    if len(first) <= limit:
        return first
    cut, opened = first[: limit - 1].rsplit(" ", 1)[0], []
    for i, ch in enumerate(cut):  # not inside a parenthesis: before the first one left open
        opened = [*opened, i] if ch == "(" else opened[:-1] if ch == ")" else opened
    return cut[: opened[0] if opened else None].rstrip(",;: ") + "…"


def clauses_led(text: str) -> tuple[str, str, list[str]]:
    """A diagnosis for its own section: the one line a table cell shows of it (`one_line`), the rest
    of its first clause, and its other clauses, each without its ';'."""
    first, *others = [c.removesuffix(";") for c in clauses(" ".join(str(text).split()))] or [""]
    line = one_line(first)
    head = line if first.startswith(line) else first
    return head, first[len(head) :], others


def kind(f: Effect) -> str:
    """Where a flagged row's cause lies (`judge.flagged_kind`), "" for a row the audit does not flag."""
    return judge.flagged_kind(f.row, f.diagnosis) or ""


def tally(effects: list[Effect]) -> list[tuple[str, int]]:
    """How many effects got each verdict, in the order VERDICTS lists them, others after."""
    verdicts = [f.verdict for f in effects]
    order = [*VERDICTS, *dict.fromkeys(v for v in verdicts if v not in VERDICTS)]
    return [(v, verdicts.count(v)) for v in order if v in verdicts]


def aligned(table: Table) -> list[tuple[str, str]]:
    """A CSV table's header as (label, css class) pairs: numeric columns right-aligned."""
    numeric = table.numeric
    return [(h, "num" if h in numeric else "") for h in table.header]


class Pages:
    """The site's and the results folder's pages, from the templates in one folder."""

    def __init__(self, templates: Path = TEMPLATES):
        self.templates = Path(templates)
        self.env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(self.templates),
            autoescape=jinja2.select_autoescape(enabled_extensions=("html.j2",), default=False),
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
            keep_trailing_newline=True,
        )
        self.env.filters.update(md=md, number=number, duration=duration, value=value)
        self.env.globals.update(
            DASH=DASH, VERDICTS=VERDICTS, href=href, md_link=md_link, aligned=aligned,
            short_citation=short_citation, citation_rest=citation_rest, one_line=one_line, clauses_led=clauses_led,
            kind=kind, tally=tally, OURS_TO_FIX=OURS_TO_FIX,
        )  # fmt: skip

    def render(self, name: str, **context) -> str:
        try:
            return self.env.get_template(name).render(**context)
        except jinja2.TemplateNotFound as exc:
            raise FileNotFoundError(
                f"no page template {exc.name!r} in {self.templates} (needed for {name!r}; the templates ship as "
                "package data, see [tool.setuptools.package-data] in pyproject.toml)"
            ) from None

    def index_html(self, entries: list[Experiment], scale: str) -> str:
        plot = forest.svg(forest.groups(entries), columns=2)
        return self.render("index.html.j2", entries=entries, scale=scale, root="", forest=plot)

    def experiment_html(self, e: Experiment, scale: str) -> str:
        plot = forest.svg([(e.short if e.short != DASH else e.slug, forest.marks(e, ""))], width=960)
        return self.render("experiment.html.j2", e=e, scale=scale, root="../", forest=plot)

    def experiment_markdown(self, e: Experiment, scale: str) -> str:
        return self.render("experiment.md.j2", e=e, scale=scale)

    def summary_markdown(self, entries: list[Experiment], scale: str) -> str:
        kinds = judge.kinds_text(
            [k for e in entries for f in e.effects if (k := judge.flagged_kind(f.row, f.diagnosis))]
        )
        return self.render(
            "summary.md.j2",
            entries=entries,
            scale=scale,
            kinds=kinds,
            stale=stale_text(entries),
            drawn=drawn_text(entries),
        )

    def css(self) -> str:
        path = self.templates / "site.css"
        if not path.is_file():
            raise FileNotFoundError(f"no stylesheet {path} (package data, see pyproject.toml)")
        return path.read_text(encoding="utf-8")

    def notebook_exporter(self):
        """nbconvert's lab template without the blocks that load scripts from a CDN (the site must
        work offline; stored outputs are static, so nothing needs require.js, and math stays as TeX)."""
        from nbconvert import HTMLExporter

        folder = self.templates / "notebook"
        if not (folder / NOTEBOOK_TEMPLATE).is_file():
            raise FileNotFoundError(f"no notebook template {folder / NOTEBOOK_TEMPLATE}")
        loader = jinja2.FileSystemLoader(folder)
        return HTMLExporter(template_name="lab", extra_loaders=[loader], template_file=NOTEBOOK_TEMPLATE)

    def notebook_html(self, e: Experiment, scale: str, exporter) -> str:
        """The stored executed notebook as a page, under a bar that leads back into the site."""
        import nbformat

        nav = self.render("notebook_nav.html.j2", e=e, scale=scale).strip()  # inside <nav>, no line ends
        nb = nbformat.read(e.notebook, as_version=4)
        resources = {"publish_nav": nav, "metadata": {"name": e.title or e.notebook.stem}}
        body, _ = exporter.from_notebook_node(nb, resources=resources)
        return body
