"""The forest plot: every claimed effect on one shared axis, our change with its interval coloured
by its verdict, the paper's change as a diamond beside it. Written as SVG text here, at publish, so
the picture is built from the stored measurements, needs no script or plotting library and reads
offline; each effect links to its row on its experiment's page."""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

from ondevice.report.pages.cells import DASH, as_float
from ondevice.report.pages.content import Experiment

# -100% .. +1000%: a few changes run to +1000% and beyond, most sit within ±50%; a symmetric-log
# axis (linear within ±SOFT) keeps both readable, and a mark beyond the axis stops at its edge
# with an arrow, its value in the tooltip
LOW, HIGH, SOFT = -1.0, 10.0, 0.03
TICKS = (-0.5, -0.1, 0.0, 0.1, 0.5, 2.0, 10.0)
COLOURS = {"holds": "#1e7b3c", "does not hold": "#b3261e", "within noise": "#b58500", "inconclusive": "#7443a8"}
NONE = "#7d868f"  # a row with no verdict
INK, MUTED, GRID = "#1d2329", "#5b6670", "#e3e7eb"
ROW, HEAD, TOP, FONT = 15, 26, 44, 11  # px: an effect's row, a paper's header, legend and axis, label size
GAP = 36  # px between columns


@dataclass(frozen=True)
class Mark:
    """One effect as the plot draws it."""

    label: str
    href: str
    verdict: str
    ours: float | None
    low: float | None
    high: float | None
    paper: float | None
    title: str  # the tooltip: the numbers as the tables print them
    first: bool  # the first effect of its experiment (a rule above it)


def marks(e: Experiment, page: str) -> list[Mark]:
    """An experiment's effects as marks; `page` is the link to its page from where the plot sits."""
    out = []
    for i, f in enumerate(e.effects, 1):
        r = f.row
        low, high = as_float(r.get("ci low")), as_float(r.get("ci high"))
        spread = f"{f.interval} ({f.level})" if f.interval != DASH else "no interval"
        paper = f"paper {f.paper}" if f.paper != DASH else "the paper gives no number"
        title = f"{f.effect}\n{e.slug}: ours {f.ours}, {spread}; {paper}; verdict: {f.verdict}"
        out.append(
            Mark(f.effect, f"{page}#effect-{i}", f.verdict, as_float(r.get("our change")), low, high,
                 as_float(r.get("paper change")), title, i == 1)
        )  # fmt: skip
    return out


def groups(entries: list[Experiment]) -> list[tuple[str, list[Mark]]]:
    """Every experiment's marks under its paper (its short citation), papers in order of first
    appearance; an experiment no facts file names goes under its own name."""
    grouped: dict[str, list[Mark]] = {}
    for e in entries:
        paper = e.short if e.short != DASH else e.slug
        grouped.setdefault(paper, []).extend(marks(e, f"{e.slug}/index.html"))
    return [(paper, ms) for paper, ms in grouped.items() if ms]


def _u(x: float) -> float:
    return math.copysign(math.log10(1 + abs(x) / SOFT), x)


def text_width(text: str, size: float = FONT) -> float:
    """Roughly how wide a sans-serif text draws: enough to cut a label before it meets the axis."""
    narrow, wide = set("ijlrtf.,;:'!|()[]- "), set("mwMW%@")
    return size * sum(0.32 if c in narrow else 0.86 if c in wide else 0.68 if c.isupper() else 0.56 for c in text)


def fit(text: str, width: float, size: float = FONT) -> str:
    """The text, cut at a word with '…' when it is wider than `width` (the tooltip has all of it)."""
    if text_width(text, size) <= width:
        return text
    words, kept = text.split(), ""
    for word in words:
        if text_width(f"{kept} {word}…", size) > width:
            break
        kept = f"{kept} {word}".strip()
    return (kept or text[: max(1, int(width / size / 0.56))]) + "…"


def _columns(rows: list[tuple], n: int) -> list[list[tuple]]:
    """The plot's rows in at most `n` (1 or 2) columns of about equal height: a column break falls
    between papers where that costs little, else inside one, whose header repeats."""
    if n < 2 or len(rows) < 8:
        return [rows]
    height = lambda part: sum(HEAD if r[0] == "head" else ROW for r in part)  # noqa: E731
    best = None
    for k in range(1, len(rows)):
        left, right = rows[:k], rows[k:]
        if right[0][0] == "mark":  # inside a paper: its header again above the second column
            head = next(r for r in reversed(left) if r[0] == "head")
            right = [("head", head[1] + " (continued)"), *right]
        cost = max(height(left), height(right)) + (0 if rows[k][0] == "head" else 3 * ROW)
        if best is None or cost < best[0]:
            best = (cost, [left, right])
    return best[1]


def svg(grouped: list[tuple[str, list[Mark]]], width: int = 1200, columns: int = 1) -> str:
    """The forest plot of `grouped` (paper, marks) as inline SVG, `columns` side by side."""
    rows = [r for paper, ms in grouped for r in [("head", paper), *(("mark", m) for m in ms)]]
    cols = _columns(rows, columns)
    col_w = (width - GAP * (len(cols) - 1)) / len(cols)
    label_w = round(col_w * (0.42 if len(cols) > 1 else 0.4))
    plot_x, plot_w = label_w + 14, col_w - label_w - 14 - 24  # room for an arrow and a label past the right edge
    body = max(sum(HEAD if r[0] == "head" else ROW for r in c) for c in cols)
    height = TOP + body + 8
    n = sum(1 for r in rows if r[0] == "mark")
    out = [
        f'<svg class="forest" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" '
        f'height="{height}" role="img" aria-label="forest plot of {n} claimed effect{"s" if n != 1 else ""}" '
        f'font-family="system-ui, sans-serif" font-size="{FONT}">',
        _legend(),
    ]
    for c, col in enumerate(cols):
        x0 = c * (col_w + GAP)
        x = lambda v, x0=x0: x0 + plot_x + (_u(min(max(v, LOW), HIGH)) - _u(LOW)) / (_u(HIGH) - _u(LOW)) * plot_w  # noqa: E731
        col_h = sum(HEAD if r[0] == "head" else ROW for r in col)
        out.append(_axis(x, TOP, TOP + col_h))
        y = TOP
        for kind, item in col:
            if kind == "head":
                out.append(f'<text class="paper" x="{x0:.1f}" y="{y + 18}" font-weight="600" font-size="13" '
                           f'fill="{INK}">{escape(item)}</text>')  # fmt: skip
                y += HEAD
            else:
                out.append(_mark(item, x0, col_w, label_w, x, y))
                y += ROW
    out.append("</svg>")
    return "\n".join(out)


def _legend() -> str:
    """One line: the colour of each verdict, our mark and the paper's."""
    parts, x = [], 0.0
    items = [(v, c) for v, c in COLOURS.items()] + [("no verdict", NONE)]
    for name, colour in items:
        parts.append(f'<line x1="{x}" y1="9" x2="{x + 18}" y2="9" stroke="{colour}" stroke-width="2.5"/>'
                     f'<circle cx="{x + 9}" cy="9" r="3.5" fill="{colour}"/>'
                     f'<text x="{x + 24}" y="13" fill="{INK}">{name}</text>')  # fmt: skip
        x += 34 + text_width(name)
    x += 12
    parts.append(f'<path d="{_diamond(x + 5, 9)}" fill="#fff" stroke="{INK}" stroke-width="1.5"/>'
                 f'<text x="{x + 16}" y="13" fill="{INK}">the paper\'s change</text>')  # fmt: skip
    x += 28 + text_width("the paper's change") + 12
    note = f"symmetric-log axis; ▸ beyond {HIGH:+.0%} (the value is in the tooltip)"
    parts.append(f'<text x="{x}" y="13" fill="{MUTED}">{note}</text>')
    return '<g class="legend">' + "".join(parts) + "</g>"


def _axis(x, top: float, bottom: float) -> str:
    """Grid lines at the ticks, zero darker, labels above."""
    parts = []
    for t in TICKS:
        stroke = "#9aa4ad" if t == 0 else GRID
        parts.append(f'<line x1="{x(t):.1f}" y1="{top - 4}" x2="{x(t):.1f}" y2="{bottom}" stroke="{stroke}"/>')
        label = "0" if t == 0 else f"{t:+.0%}"
        parts.append(f'<text x="{x(t):.1f}" y="{top - 8}" text-anchor="middle" fill="{MUTED}" '
                     f'font-size="10.5">{label}</text>')  # fmt: skip
    return '<g class="axis">' + "".join(parts) + "</g>"


def _diamond(cx: float, cy: float, r: float = 4.5) -> str:
    return f"M{cx:.1f},{cy - r:.1f} L{cx + r:.1f},{cy:.1f} L{cx:.1f},{cy + r:.1f} L{cx - r:.1f},{cy:.1f} Z"


def _arrow(x: float, y: float, right: bool, colour: str) -> str:
    d = 6 if right else -6
    return f'<path d="M{x:.1f},{y - 4} L{x + d:.1f},{y} L{x:.1f},{y + 4} Z" fill="{colour}"/>'


def _mark(m: Mark, x0: float, col_w: float, label_w: float, x, y: float) -> str:
    """One effect: a link around its label, interval, point and the paper's diamond."""
    colour, mid = COLOURS.get(m.verdict, NONE), y + ROW / 2
    parts = [f'<rect class="band" x="{x0:.1f}" y="{y}" width="{col_w:.1f}" height="{ROW}" fill="transparent"/>']
    if m.first:
        parts.append(f'<line x1="{x0:.1f}" y1="{y}" x2="{x0 + col_w:.1f}" y2="{y}" stroke="{GRID}"/>')
    parts.append(f'<text x="{x0:.1f}" y="{mid + 4:.1f}" fill="{INK}">{escape(fit(m.label, label_w))}</text>')
    beyond = [v for v in (m.low, m.high, m.ours) if v is not None and not LOW <= v <= HIGH]
    if m.low is not None and m.high is not None:
        parts.append(f'<line x1="{x(m.low):.1f}" y1="{mid}" x2="{x(m.high):.1f}" y2="{mid}" stroke="{colour}" '
                     f'stroke-width="2.5"/>')  # fmt: skip
    if m.paper is not None:
        parts.append(f'<path d="{_diamond(x(m.paper), mid)}" fill="#fff" stroke="{INK}" stroke-width="1.5"/>')
        beyond += [m.paper] if not LOW <= m.paper <= HIGH else []
    if m.ours is not None:
        parts.append(f'<circle cx="{x(m.ours):.1f}" cy="{mid}" r="3.5" fill="{colour}" stroke="#fff"/>')
    for right in sorted({v > HIGH for v in beyond}):
        parts.append(_arrow(x(HIGH if right else LOW) + (2 if right else -2), mid, right, colour))
    title = m.title + ("" if m.ours is not None else "\nno change measured")
    return (
        f'<a href="{escape(m.href)}"><g class="effect-mark" data-verdict="{escape(m.verdict)}">'
        f"<title>{escape(title)}</title>{''.join(parts)}</g></a>"
    )
