"""The text of one cell, the same on every page: percentages, counts, durations, citations, the
judged diagnosis and notebook anchors. Values that are missing or not numbers read "-"."""

from __future__ import annotations

import re
from urllib.parse import quote

from ondevice.report.claims import Kind, percent
from ondevice.report.claims import finite as as_float
from ondevice.report.judge import Judged, flagged_kind

DASH = "-"
EXPLAINED = "differs, explained by "
# a flagged row whose diagnosis names no cause outside our implementation (its kind is open): ours to fix
OPEN = "differs, open: "


def pct(value) -> str:
    x = as_float(value)
    return DASH if x is None else percent(x)


def number(value, digits: int = 4) -> str:
    if isinstance(value, bool) or value is None:
        return DASH if value is None else str(value)
    x = as_float(value)
    if x is None:
        return str(value) if value not in ("", None) else DASH
    return f"{x:.{digits}g}"


def interval(row: dict) -> str:
    low, high = pct(row.get("ci low")), pct(row.get("ci high"))
    return DASH if DASH in (low, high) else f"{low} to {high}"


def level(row: dict) -> str:
    x = as_float(row.get("level"))
    return f"{x:.0%}" if x is not None else "95%"


def duration(seconds) -> str:
    s = as_float(seconds)
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


def citation_rest(citation: str) -> str:
    """What the full citation adds to its short form ('Table 1'); "" when nothing."""
    return citation[len(short_citation(citation)) :].lstrip(", ") if citation != DASH else ""


# Columns of effects.csv that count what an interval resampled, and the unit each counts.
COUNTED = (("users", None), ("devices", "devices"), ("test samples", "test samples"), ("repeats", "repeats"))


def counts(row: dict) -> str:
    """What the interval resampled and how many: '20 users x 3 seeds', '4 users x 5 repeats x 1 seed',
    '2000 test samples x 2 seeds'. The `users` column counts the units a row's `resampled` names
    (devices, repeats); a row that records nothing says "not recorded", never a silent dash."""
    parts = []
    for column, unit in COUNTED:
        n = as_float(row.get(column))
        if n is not None:
            parts.append(f"{n:g} {unit or str(row.get('resampled') or '').strip() or 'users'}")
    seeds = as_float(row.get("seeds"))
    if seeds is not None:
        parts.append(f"{seeds:g} seed{'s' if seeds != 1 else ''}")
    if not parts:
        return "not recorded"
    return " x ".join(parts) + ("" if seeds is not None else " (seeds not recorded)")


def ratio(judged: Judged) -> str:
    """Ours / the paper's change ('2.5x', '-0.4x'), only where our interval excludes zero ('-' else,
    or where the paper gives no change or zero)."""
    return DASH if judged.ratio is None else f"{judged.ratio:.2g}x"


def diagnosis(row: dict, judged: Judged) -> str:
    """The judged audit text of one effects.csv row, with the experiment's diagnosis if it gave one:
    "agrees ...", "inconclusive ...", "differs, explained by ..." (a cause outside our
    implementation), "differs, open: ..." (its kind is open, or the table predates kinds),
    "unexplained" or why it cannot tell."""
    text = judged.audit
    if text.startswith(EXPLAINED) and flagged_kind(row, text) == Kind.OPEN.value:
        return OPEN + text.removeprefix(EXPLAINED)
    return text


def diagnosed_prefix(text: str) -> str:
    """The prefix of a diagnosis cell that carries the experiment's own text ("" for none)."""
    return next((p for p in (EXPLAINED, OPEN) if text.startswith(p)), "")


def anchor(section: str) -> str:
    """The URL fragment Jupyter and nbconvert give a notebook heading: its text with spaces as '-'
    (Markdown emphasis and code marks dropped); a section given as '#anchor' is kept as it is."""
    section = section.strip()
    if section.startswith("#") and not section.lstrip("#").startswith(" "):
        return section[1:]
    text = re.sub(r"[`*]|(?<!\w)_|_(?!\w)", "", section.lstrip("#").strip())
    return quote(text.replace(" ", "-"), safe="?/:@!$&'()*+,;=")


MD_SPECIAL = re.compile(r"([\\|<>&*`\[\]])")


def md(text) -> str:
    """Text for Markdown (a table cell, a list item): one line, with the characters that would make
    markup escaped."""
    return MD_SPECIAL.sub(r"\\\1", " ".join(str(text).split()))


def md_link(text: str, target: str) -> str:
    """A Markdown link; parentheses in the target are percent-encoded so they cannot end it."""
    return f"[{md(text)}]({target.replace('(', '%28').replace(')', '%29')})"


def href(*parts: str) -> str:
    """A relative link from path parts (file and folder names come from disk), URL-quoted."""
    return "/".join(quote(p) for p in parts)
