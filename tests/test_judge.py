"""Judging at publish (report/judge.py): four verdicts, the paper's printed precision, the paper's
unit read two ways, and staleness that counts measuring code only."""

import subprocess

import pytest

from ondevice import REPO_ROOT
from ondevice.report import judge, provenance

FACTS = """
[paper]
short = "P"
title = "P"
authors = "A"
venue = "V 2020"

[exp.claims]
citation = "A, P"

[[exp.claims.numbers]]
quantity = "base"
value = 1.0
exact = true

[[exp.claims.numbers]]
quantity = "better"
value = 0.99

[[exp.claims.numbers]]
quantity = "old"
value = 0.616

[[exp.claims.numbers]]
quantity = "new"
value = 0.617

[[exp.claims.effects]]
claim = "base beats better"
better = "base"
worse = "better"

[[exp.claims.effects]]
claim = "new keeps old"
better = "new"
worse = "old"

[[exp.claims.readings]]
claim = "base beats better"
lead = "relative"
other = "points"
level = "better, ours"
"""


@pytest.fixture
def papers(tmp_path):
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "paper.toml").write_text(FACTS)
    judge._facts.cache_clear()
    yield tmp_path
    judge._facts.cache_clear()


@pytest.mark.parametrize(
    "low, high, paper, expected",
    [
        (0.01, 0.05, 0.1, "holds"),
        (-0.05, -0.01, 0.1, "does not hold"),
        (-0.01, 0.05, 0.1, "within noise"),
        (-0.01, 0.15, 0.1, "inconclusive"),
        (-0.01, 0.15, None, "within noise"),  # no paper change: nothing to be inconclusive about
        (-0.01, 0.01, 0.0, "within noise"),  # the paper claims no change and we see none
        (None, 0.1, 0.1, "-"),
    ],
)
def test_four_verdicts(low, high, paper, expected):
    assert judge.verdict(low, high, paper, paper) == expected


def test_the_papers_range_comes_from_its_printed_digits_and_an_exact_baseline_has_none(papers):
    low, high = judge.paper_range("exp", "base beats better", papers)
    assert low == pytest.approx(1 / 0.995 - 1) and high == pytest.approx(1 / 0.985 - 1)  # 0.99 is 0.985 to 0.995
    low, high = judge.paper_range("exp", "new keeps old", papers)
    assert low == 0.0 and high == pytest.approx(0.6175 / 0.6155 - 1)  # one unit of the last digit: no change in range
    assert judge.paper_range("exp", "no such claim", papers) is None


def test_a_change_within_the_papers_precision_agrees_and_one_only_within_noise_never_agrees_in_size(papers):
    row = {"effect": "new keeps old", "paper change": 0.617 / 0.616 - 1, "our change": -0.0005}
    kept = judge.judge({**row, "ci low": -0.003, "ci high": 0.001}, "exp", papers_dir=papers)
    assert kept.verdict == "within noise" and kept.audit.startswith("agrees: no change")
    assert kept.ratio is None  # no ratio while the interval contains zero
    far = {"effect": "x", "paper change": 0.3, "our change": 0.2, "ci low": -0.01, "ci high": 0.25}
    noisy = judge.judge(far, "exp", papers_dir=papers)
    assert noisy.verdict == "within noise" and noisy.audit == "unexplained" and noisy.ratio is None
    sure = judge.judge({**far, "ci low": 0.15}, "exp", papers_dir=papers)
    assert sure.audit == "agrees within 3x" and sure.ratio == pytest.approx(2 / 3)


def test_a_claims_unit_read_two_ways_gives_the_other_readings_verdict_beside_the_leads(papers):
    row = {"effect": "base beats better", "paper change": 1 / 0.99 - 1, "our change": 0.08}
    row |= {"ci low": 0.03, "ci high": 0.13, "diagnosis": ""}
    headline = {"better, ours": {"value": 0.08}}  # an accuracy of 8%: +8% relative is +0.64 points
    j = judge.judge(row, "exp", headline, papers)
    assert (j.verdict, j.audit, j.reading) == ("holds", "unexplained", "relative")
    assert j.other == "as points (+0.64 points): holds; agrees"
    assert judge.judge(row, "exp", {}, papers).other == "as points: no level to convert with"
    flagged = judge.flagged_kind(row, j.audit)
    assert flagged == "unexplained" and judge.kinds_text([flagged]).startswith("**1 of 1 flagged rows are ours")


def test_judging_code_is_outside_every_results_fingerprint():
    """A change to the rules re-renders pages and re-runs nothing: no notebook's code files hold it."""
    judging = {REPO_ROOT / "lib" / (m.replace(".", "/") + ".py") for m in provenance.NOT_MEASURING}
    assert REPO_ROOT / "lib/ondevice/report/judge.py" in judging
    for notebook in sorted((REPO_ROOT / "notebooks").rglob("*.ipynb")):
        if notebook.parent.name.startswith((".", "_")):
            continue
        files = set(provenance.code_files(notebook))
        assert not files & judging, notebook.name
        assert REPO_ROOT / "lib/ondevice/report/record.py" in files  # measuring code still counts


def test_a_result_is_stale_when_its_measuring_code_changed_since_its_commit():
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True).stdout.strip()
    if not head:
        pytest.skip("not a git checkout")
    root = subprocess.run(["git", "rev-list", "--max-parents=0", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True)
    first = root.stdout.split()[0]
    if first == head:
        pytest.skip("a clone without history: no earlier commit to diff from")
    old = provenance.changed_since({"commit": first, "dirty": False}, "deeptype_top3eff")
    assert old["stale"] is True and old["files"] and all(f["added"] + f["removed"] > 0 for f in old["files"])
    assert provenance.changed_since({"commit": head, "dirty": True}, "deeptype_top3eff")["stale"] is None
    assert provenance.changed_since({"commit": "0" * 40}, "deeptype_top3eff")["stale"] is None
    assert provenance.changed_since({}, "deeptype_top3eff")["stale"] is None
    assert provenance.changed_since({"commit": head}, "no_such_notebook")["stale"] is None
