"""The papers' numbers, claims and citations, read from `papers/<paper>/paper.toml`.

Facts are data, not code: the site and SUMMARY.md read them without importing TensorFlow or any
experiment module, and an experiment takes its `claims.Paper` from here by its own name.
"""

from __future__ import annotations

import functools
import re
import tomllib
from pathlib import Path

from .claims import Effect, Paper, PaperNumber

PAPERS = Path(__file__).resolve().parents[1] / "papers"


@functools.cache
def load(paper: str, papers_dir: Path = PAPERS) -> dict:
    """The whole facts file of one paper (e.g. "deeptype")."""
    path = papers_dir / paper / "paper.toml"
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"no facts file {path}: every paper folder has a paper.toml") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path} is not valid TOML: {exc}") from None


def papers(papers_dir: Path = PAPERS) -> list[str]:
    return sorted(p.parent.name for p in papers_dir.glob("*/paper.toml") if not p.parent.name.startswith("_"))


def paper_of(experiment: str, papers_dir: Path = PAPERS) -> str | None:
    """The paper whose facts file has a section for this experiment, or None."""
    return next((p for p in papers(papers_dir) if experiment in load(p, papers_dir)), None)


def paper(experiment: str, part: str = "claims", papers_dir: Path = PAPERS, in_paper: str | None = None) -> Paper:
    """An experiment's numbers and claimed effects (`part`: "claims", or e.g. "time"), from the
    facts file that has a section for it, or from `in_paper`'s (which may be a folder the scan
    skips, such as the new-paper skeleton `_template`)."""
    name = in_paper if in_paper and experiment in load(in_paper, papers_dir) else paper_of(experiment, papers_dir)
    if name is None:
        raise KeyError(f"no paper.toml under {papers_dir} has a section [{experiment}]")
    section = load(name, papers_dir)[experiment].get(part)
    if section is None:
        raise KeyError(f"{papers_dir / name / 'paper.toml'} has no section [{experiment}.{part}]")
    return Paper(
        section["citation"],
        tuple(PaperNumber(n["quantity"], float(n["value"]), n["source"]) for n in section.get("numbers", [])),
        tuple(Effect(e["claim"], e["better"], e["worse"]) for e in section.get("effects", [])),
    )


def citation(paper_name: str, papers_dir: Path = PAPERS) -> str:
    """The full reference of a paper: authors, title, venue."""
    info = load(paper_name, papers_dir)["paper"]
    return f'{info["authors"]}, "{info["title"]}", {info["venue"]}'


def short_citation(paper_name: str, papers_dir: Path = PAPERS) -> str:
    """'Xu et al., DeepType, 2018': the first author's surname, the paper's short name, its year."""
    info = load(paper_name, papers_dir)["paper"]
    authors = [a.strip() for a in info["authors"].split(",") if a.strip() and a.strip() != "et al."]
    several = len(authors) > 1 or "et al." in info["authors"]
    years = re.findall(r"\b(?:19|20)\d\d\b", info.get("venue", ""))
    return ", ".join([authors[0].split()[-1] + (" et al." if several else ""), info["short"], *years[-1:]])
