"""One result directory as the pages show it, read once: its run.json (coerced, so an old, partial
or hand-edited one renders as "-" instead of failing), its effects with every cell's text, its
figures and tables, and the paper's citation and claims from the paper's facts file (data: no
experiment module is imported, which would load TensorFlow). The Markdown and HTML templates
render this model; neither reads the directory again."""

from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from ondevice.report import facts, judge, provenance
from ondevice.report.claims import PAIRED
from ondevice.report.pages.cells import (
    DASH,
    anchor,
    as_float,
    counts,
    diagnosed_prefix,
    diagnosis,
    interval,
    level,
    pct,
    ratio,
)

INLINE_ROWS, INLINE_COLUMNS = 12, 9  # a table this small is shown on the Markdown page, a larger one linked
SHOWN_ELSEWHERE = {"effects.csv", "headline.csv", "paper_vs_ours.csv"}
UNCHECKED = {"stale": None, "files": [], "why": "not checked"}


@dataclass
class Table:
    """A CSV file of the result's tables/ folder."""

    name: str
    header: list[str]
    rows: list[dict]

    @property
    def numeric(self) -> set[str]:
        """The columns whose every filled cell is a number (right-aligned, shown to 4 digits)."""
        return {
            h
            for h in self.header
            if self.rows and all(as_float(r.get(h)) is not None or r.get(h) in ("", None) for r in self.rows)
        }

    @property
    def inline(self) -> bool:
        """Small enough to show on the Markdown page, and not shown there in another form."""
        return (
            self.name not in SHOWN_ELSEWHERE
            and 0 < len(self.rows) <= INLINE_ROWS
            and len(self.header) <= INLINE_COLUMNS
        )


@dataclass
class Figure:
    name: str  # figures/<name>.png
    svg: bool  # figures/<name>.svg exists too


@dataclass
class Headline:
    name: str
    value: object
    tolerance: object
    per_seed: list


@dataclass
class Effect:
    """One effects.csv row with the text of its cells."""

    row: dict
    diagnosis: str  # the judged audit text, with why a named section cannot be linked
    target: str | None  # the anchor of the notebook heading that measures an explained row
    judged: judge.Judged  # the row judged at publish (judge.judge): verdict, audit, ratio, reading
    effect: str = field(init=False)
    paper: str = field(init=False)  # the paper's change
    ours: str = field(init=False)  # our change
    ratio: str = field(init=False)
    interval: str = field(init=False)
    level: str = field(init=False)
    counts: str = field(init=False)
    verdict: str = field(init=False)
    modelled: bool = field(init=False)  # the numbers come from a model, not a meter

    def __post_init__(self):
        r = self.row
        self.effect = r.get("effect") or DASH
        self.paper, self.ours, self.ratio = pct(r.get("paper change")), pct(r.get("our change")), ratio(self.judged)
        self.interval, self.level, self.counts = interval(r), level(r), counts(r)
        self.verdict = self.judged.verdict
        self.modelled = "modelled" in str(r.get("meter") or "").lower()

    @property
    def prefix(self) -> str:
        """ "differs, explained by " or "differs, open: ": what precedes the experiment's own text."""
        return diagnosed_prefix(self.diagnosis)

    @property
    def explained(self) -> str:
        """The experiment's own diagnosis: the text of the link to its notebook section."""
        return self.diagnosis.removeprefix(self.prefix)


@dataclass
class Experiment:
    """One result directory as published."""

    slug: str  # the folder's name
    path: Path
    run: dict
    rows: list[dict]  # tables/effects.csv
    citation: str = DASH
    claims: list[str] = field(default_factory=list)
    title: str = ""
    short: str = DASH
    reference: str = DASH  # the paper's full reference (authors, title, venue), for citing
    notebook: Path | None = None  # the stored executed notebook
    headings: list[str] = field(default_factory=list)  # its Markdown headings, for links to a section
    figures: list[Figure] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    headline: list[Headline] = field(default_factory=list)
    name: str = ""  # the experiment (its notebook's name)
    papers_dir: Path = facts.PAPERS
    changed: dict = field(default_factory=lambda: dict(UNCHECKED))
    effects: list[Effect] = field(init=False)

    def __post_init__(self):
        judged = [judge.judge(r, self.name or self.slug, self.run.get("headline"), self.papers_dir) for r in self.rows]
        self.effects = [Effect(r, *self._diagnosis(r, j), j) for r, j in zip(self.rows, judged)]

    def _diagnosis(self, row: dict, judged: judge.Judged) -> tuple[str, str | None]:
        """The diagnosis cell's text and, for an explained row whose section is a heading of the stored
        notebook, that heading's anchor (the link target); a section the notebook lacks is said."""
        text = diagnosis(row, judged)
        section = str(row.get("section") or "").strip()
        if not diagnosed_prefix(text) or not section:
            return text, None
        target = anchor(section)
        if self.notebook is not None and target in {anchor(h) for h in self.headings}:
            return text, target
        return f"{text} (its section {section!r} is not a heading of the notebook)", None

    def lose_notebook(self) -> None:
        """The site could not render the notebook: no page links into it."""
        self.notebook = None
        self.__post_init__()

    def table(self, name: str) -> Table | None:
        return next((t for t in self.tables if t.name == name), None)

    @property
    def status(self) -> str:
        return str(get(self.run, "notebook", "status") or DASH)

    @property
    def wall_time_s(self):
        return get(self.run, "notebook", "wall_time_s") or self.run.get("wall_time_s")

    @property
    def stand_in(self) -> str:
        value = self.run.get("stand_in_data")
        return value.strip() if isinstance(value, str) else ""

    @property
    def stale(self) -> str:
        """Whether the code that measured this result has changed since its run: "no", "yes: <files
        (+added/-removed lines)>", or "unknown (<why>)"."""
        if self.changed["stale"] is None:
            return f"unknown ({self.changed['why']})"
        if not self.changed["stale"]:
            return "no"
        return "yes: " + ", ".join(f"{f['path']} (+{f['added']}/-{f['removed']})" for f in self.changed["files"])

    @property
    def verdict(self) -> str:
        """One word when every effect agrees, else counts ("1 holds, 1 within noise"); "-" without verdicts."""
        verdicts = [f.verdict if f.verdict != DASH else "" for f in self.effects]
        if not verdicts or not all(verdicts):
            return DASH
        counted = {v: verdicts.count(v) for v in dict.fromkeys(verdicts)}
        return verdicts[0] if len(counted) == 1 else ", ".join(f"{n} {v}" for v, n in counted.items())

    @property
    def data_kind(self) -> str:
        """Stand-in or original data ("-" when the result names none)."""
        return "stand-in" if self.stand_in else "original" if self.run.get("data") else DASH

    @property
    def commit(self) -> str:
        git = get(self.run, "environment", "git") or {}
        return str(git.get("commit") or DASH)[:12] + (" (uncommitted changes)" if git.get("dirty") else "")

    @property
    def machine(self) -> str:
        env = self.run.get("environment", {})
        cores = f"{env['cpu_count']} cores" if env.get("cpu_count") else None
        return ", ".join(str(x) for x in (env.get("cpu"), cores) if x) or DASH

    @property
    def packages(self) -> str:
        """'numpy 1.26.4, pandas 2.2.2' from the environment record; "-" without one."""
        packages = self.run.get("environment", {}).get("packages", {})
        return ", ".join(f"{k} {v}" for k, v in packages.items()) or DASH

    @property
    def environment(self) -> dict:
        """The environment record flat: its packages as "package <name>" rows."""
        env = self.run.get("environment", {})
        flat = {k: v for k, v in env.items() if k != "packages"}
        return flat | {f"package {k}": v for k, v in env.get("packages", {}).items()}

    @property
    def run_time(self) -> RunTime:
        """The last run's wall time, whether it was warm, and a cold run's time (`run_time`)."""
        return run_time(self.wall_time_s, notebook_file(self.path))


def get(doc, *keys, default=None):
    for key in keys:
        if not isinstance(doc, dict) or key not in doc:
            return default
        doc = doc[key]
    return doc


def read_run(path: Path) -> dict:
    """run.json with the fields the pages use coerced to their types (a missing field, or one of
    the wrong type, is empty), so an old, partial or hand-edited run.json renders as "-" instead of
    failing."""
    try:
        run = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        run = {}
    if not isinstance(run, dict):
        run = {}
    for key, kind in (("data", list), ("headline", dict), ("params", dict), ("environment", dict), ("notebook", dict)):
        if not isinstance(run.get(key), kind):
            run[key] = kind()
    run["data"] = [
        dict(
            d,
            artifacts=[a for a in d["artifacts"] if isinstance(a, dict)]
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
    """Header and rows of a CSV file; ([], []) when it is missing or unreadable. A cell may be as
    long as the file (effects.csv's paired values of many users are one cell)."""
    csv.field_size_limit(max(csv.field_size_limit(), path.stat().st_size + 1 if path.is_file() else 0))
    try:
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            rows = list(reader)
            return list(reader.fieldnames or []), rows
    except (OSError, csv.Error, UnicodeDecodeError):
        return [], []


def shown(header: list[str], rows: list[dict]) -> tuple[list[str], list[dict]]:
    """A table's header without its paired values (data for `judge.recomputed`, not for reading)."""
    return [h for h in header if h != PAIRED], rows


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


def notebook_file(path: Path) -> Path | None:
    """The stored executed notebook: <folder>.ipynb, else <name without .failed>.ipynb, else any."""
    slug = path.name
    candidates = [path / f"{slug}.ipynb", path / f"{slug.removesuffix('.failed')}.ipynb", *sorted(path.glob("*.ipynb"))]
    return next((p for p in candidates if p.is_file()), None)


def headings(notebook: Path | None) -> list[str]:
    """The notebook's Markdown headings in order, without their '#'s (the first is its title)."""
    if notebook is None:
        return []
    try:
        cells = json.loads(notebook.read_text(encoding="utf-8")).get("cells", [])
    except (OSError, ValueError, AttributeError):
        return []
    found = []
    for cell in cells:
        if isinstance(cell, dict) and cell.get("cell_type") == "markdown":
            source = cell.get("source", "")
            for line in ("".join(source) if isinstance(source, list) else str(source)).splitlines():
                if re.match(r"#{1,6} ", line):
                    found.append(line.lstrip("#").strip())
    return found


def experiment(path: Path, papers_dir: Path = facts.PAPERS, check_code: bool = True) -> Experiment:
    """The content model of one result directory (one with a run.json); `check_code`: whether to
    ask git if the code that measured it has changed since (`provenance.changed_since`)."""
    run = read_run(path / "run.json")
    name = run.get("experiment")
    if not (isinstance(name, str) and name.isidentifier()):  # a module name, never a path
        name = path.name.removesuffix(".failed")
    tables = [Table(p.name, *shown(*read_csv(p))) for p in sorted((path / "tables").glob("*.csv"))]
    by_name = {t.name: t.rows for t in tables}
    # the tables of other experiments' results that this one's claims read their protocol runs from
    by_name |= {f"{e}/{t}": read_csv(path.parent / e / "tables" / t)[1] for e, t in judge.referenced(name, papers_dir)}
    # each row's interval drawn at publish from its paired values, where the run stored them, and
    # its diagnosis read open where our own sensitivity runs reverse its sign, or where a data or scale
    # cause has no curve that moves our change toward the paper's
    checked = lambda r: judge.protocol_checked(judge.recomputed(r), name, by_name, papers_dir)  # noqa: E731
    rows = [judge.curve_checked(checked(r), name, by_name, papers_dir) for r in by_name.get("effects.csv", [])]
    citation, claims, short = paper_of(name, papers_dir)
    claims = claims or list(dict.fromkeys(r.get("effect", "") for r in rows if r.get("effect")))
    notebook = notebook_file(path)
    found = headings(notebook)
    pngs = sorted((path / "figures").glob("*.png"), key=lambda p: p.stem)
    return Experiment(
        slug=path.name,
        path=path,
        run=run,
        rows=rows,
        citation=citation,
        claims=claims,
        title=found[0] if found else path.name,
        short=short,
        reference=reference_of(name, papers_dir),
        notebook=notebook,
        headings=found,
        figures=[Figure(p.stem, p.with_suffix(".svg").is_file()) for p in pngs],
        tables=tables,
        headline=[Headline(k, get(h, "value"), get(h, "tolerance"), h["per_seed"]) for k, h in run["headline"].items()],
        name=name,
        papers_dir=papers_dir,
        changed=provenance.changed_since(get(run, "environment", "git") or {}, name) if check_code else UNCHECKED,
    )


def load(results_dir: Path, papers_dir: Path = facts.PAPERS, check_code: bool = True) -> list[Experiment]:
    """Every results_dir/*/run.json, in name order."""
    return [experiment(p.parent, papers_dir, check_code) for p in sorted(results_dir.glob("*/run.json"))]


@dataclass(frozen=True)
class RunTime:
    """How long the last run took and what it found done before it (model-cache entries, stages
    read back), so its time is not mistaken for a cold run's, which is given beside it."""

    last_s: float | None  # the last run's wall time
    recorded: bool  # its notebook was read: the counts below are known
    reused: int = 0  # model-cache entries an earlier run trained
    read_back: int = 0  # cells that read their results back from an earlier run's stage file
    trained_s: float = 0.0  # seconds the run spent training global models
    models_s: float = 0.0  # the recorded training seconds of every model-cache entry it used
    models: int = 0  # how many entries it used

    @property
    def warm(self) -> bool:
        return self.reused > 0 or self.read_back > 0

    @property
    def cold_s(self) -> float | None:
        """A cold run's time: the last run's when it was cold, else estimated as in
        report/progress.py: the last run less its training, plus every model's recorded training."""
        if self.last_s is None or not self.recorded:
            return None
        return self.last_s - self.trained_s + self.models_s if self.warm else self.last_s


def run_time(last_s, notebook: Path | None) -> RunTime:
    """The stored executed notebook's record of the model cache (`timings.cell_models`, the lines
    `training/model_cache.py` prints) and of stages read back (`timings.resumed`)."""
    from ondevice.report import timings  # pandas: only when a page shows times

    last = as_float(last_s)
    try:
        cells = [c for c in json.loads(notebook.read_text(encoding="utf-8"))["cells"] if c.get("cell_type") == "code"]
    except (AttributeError, OSError, ValueError, KeyError, TypeError):
        return RunTime(last, recorded=False)
    used, ran, trained_s, read_back = {}, set(), 0.0, 0
    for cell in cells:
        text = "".join("".join(o.get("text", "")) for o in cell.get("outputs", []) if o.get("output_type") == "stream")
        seconds, models = timings.cell_models(cell)
        duration = as_float(get(cell, "metadata", "papermill", "duration"))
        trained_s += min(seconds, duration) if duration is not None else seconds
        used |= models
        ran |= {Path(p).name for _, p in timings.TRAINED.findall(text)} | set(timings.WAITED.findall(text))
        read_back += timings.resumed(cell)
    reused = len(set(used) - {Path(p).name for p in ran})
    return RunTime(last, True, reused, read_back, trained_s, sum(used.values()), len(used))
