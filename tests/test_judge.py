"""Judging at publish (report/judge.py): four verdicts, the paper's printed precision, the paper's
unit read two ways, and staleness that counts measuring code only."""

import json
import subprocess

import numpy as np
import pandas as pd
import pytest

from ondevice import REPO_ROOT
from ondevice.report import claims, judge, provenance

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

[[exp.claims.protocols]]
claim = "new keeps old"
table = "sensitivity.csv"
run = "run"
change = "new - old"
main = "main"
unit = "points"
select = { model = "small" }
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


def test_a_diagnosis_outside_our_code_reads_open_where_our_own_protocol_reverses_the_sign(papers):
    row = {"effect": "new keeps old", "our change": -0.2, "diagnosis": "few words per user", "diagnosis kind": "data"}
    runs = [
        {"run": "main", "model": "small", "new - old": -0.04},  # the rows' own protocol: never a reversal
        {"run": "other inputs", "model": "small", "new - old": 0.0065},
        {"run": "other inputs", "model": "large", "new - old": 0.03},  # not selected
        {"run": "no change", "model": "small", "new - old": 0.0},  # zero reverses nothing
    ]
    checked = judge.protocol_checked(row, "exp", {"sensitivity.csv": runs}, papers)
    assert checked["diagnosis kind"] == "open"
    assert checked["diagnosis"] == (
        "open (protocol), not data: our own sensitivity runs give the other sign (other inputs +0.65 points); "
        "few words per user"
    )
    assert judge.flagged_kind(checked, "differs, explained by x") == "open"
    same_sign = [{"run": "other inputs", "model": "small", "new - old": -0.01}]
    assert judge.protocol_checked(row, "exp", {"sensitivity.csv": same_sign}, papers) == row
    unrun = judge.protocol_checked(row, "exp", {}, papers)  # declared, not stored: the sign is not known
    assert unrun["diagnosis kind"] == "open"
    assert unrun["diagnosis"].startswith("open (protocol not yet run), not data: its declared sensitivity runs ")
    assert unrun["diagnosis"].endswith("may yet turn the change around; few words per user")
    undeclared = row | {"effect": "base beats better"}
    assert judge.protocol_checked(undeclared, "exp", {"sensitivity.csv": runs}, papers) == undeclared
    (papers / "p" / "paper.toml").write_text(FACTS.replace('change = "new - old"\n', ""))
    judge._facts.cache_clear()
    with pytest.raises(ValueError, match="protocols of 'new keeps old' lack change"):
        judge.protocol_checked(row, "exp", {"sensitivity.csv": runs}, papers)


def test_a_protocol_of_two_conditions_of_a_per_user_table_is_drawn_as_the_rows_own_change(papers):
    (papers / "p" / "paper.toml").write_text(
        FACTS + '\n[[exp.claims.protocols]]\nclaim = "base beats better"\ntable = "users.csv"\nrun = "other step"\n'
        'paired = { column = "condition", value = "score", better = "base, other step", worse = "better" }\n'
    )
    judge._facts.cache_clear()
    users = [
        {"seed": s, "user": u, "condition": c, "score": v}
        for s in ("0", "1")
        for u, base, other, better in (("a", 0.5, 0.62, 0.6), ("b", 0.4, 0.45, 0.5), ("c", 0.3, 0.31, 0.2))
        for c, v in (("base", base), ("base, other step", other), ("better", better))
    ]
    # medians per seed: other step 0.45 against better 0.5 (-10%); the rows' own base 0.4 (-20%)
    assert judge.paired_change(users, "condition", "score", "base, other step", "better") == pytest.approx(-0.1)
    assert judge.paired_change(users[:3], "condition", "score", "base, other step", "better") is None  # one user
    row = {"effect": "base beats better", "our change": 0.05, "diagnosis": "small data", "diagnosis kind": "data"}
    checked = judge.protocol_checked(row, "exp", {"users.csv": users}, papers)
    assert checked["diagnosis"].startswith(
        "open (protocol), not data: our own sensitivity runs give the other sign (other step -10.0%)"
    )
    assert (
        judge.protocol_checked(row | {"our change": -0.05}, "exp", {"users.csv": users}, papers)["diagnosis kind"]
        == "data"
    )
    (papers / "p" / "paper.toml").write_text(
        FACTS + '\n[[exp.claims.protocols]]\nclaim = "base beats better"\ntable = "u.csv"\nrun = "x"\n'
        'paired = { column = "condition" }\n'
    )
    judge._facts.cache_clear()
    with pytest.raises(ValueError, match="lack paired.value, paired.better, paired.worse"):
        judge.protocol_checked(row, "exp", {}, papers)


def test_a_protocol_run_may_be_read_from_another_experiments_result(papers):
    (papers / "p" / "paper.toml").write_text(
        FACTS.replace('table = "sensitivity.csv"\n', 'table = "sensitivity.csv"\nexperiment = "other"\n')
    )
    judge._facts.cache_clear()
    assert judge.referenced("exp", papers) == {("other", "sensitivity.csv")}
    row = {"effect": "new keeps old", "our change": 0.01, "diagnosis": "small data", "diagnosis kind": "data"}
    runs = [{"run": r, "model": "small", "new - old": x} for r, x in (("main", 0.01), ("other", -0.02))]
    not_its_own = judge.protocol_checked(row, "exp", {"sensitivity.csv": runs}, papers)  # the claim's own table
    assert not_its_own["diagnosis"].startswith(
        "open (protocol not yet run), not data: its declared sensitivity runs "
        "(other/sensitivity.csv) have no stored result"
    )
    checked = judge.protocol_checked(row, "exp", {"other/sensitivity.csv": runs}, papers)
    assert checked["diagnosis"].startswith("open (protocol), not data: our own sensitivity runs give the other sign")


def test_every_declared_sensitivity_table_is_in_its_committed_result_with_its_columns_and_main_run():
    """A declaration whose table, columns or rows are misspelt would read nothing and never fire."""
    judge._facts.cache_clear()
    declared = [
        (experiment, p)
        for doc in judge._facts(judge.PAPERS).values()
        for experiment, sections in doc.items()
        if isinstance(sections, dict)
        for section in sections.values()
        if isinstance(section, dict)
        for p in section.get("protocols", [])
    ]
    assert declared
    for experiment, p in declared:
        holder = p.get("experiment", experiment)  # another experiment's result may hold the runs
        if holder != experiment and not (REPO_ROOT / "results" / "default" / holder).is_dir():
            assert provenance.notebook_of(holder) is not None, (experiment, p)  # a notebook not yet run at default
            continue
        path = REPO_ROOT / "results" / "default" / holder / "tables" / p["table"]
        table = pd.read_csv(path)
        if paired := p.get("paired"):  # two conditions of a per-user table, both there for every user
            assert {paired["column"], paired["value"], "seed", "user"} <= set(table.columns), (experiment, p["claim"])
            rows = table.to_dict("records")
            assert judge.paired_change(rows, *(paired[k] for k in judge.PAIRED_KEYS)) is not None, (experiment, p)
            assert p["claim"] in set(pd.read_csv(path.with_name("effects.csv")).effect), (experiment, p["claim"])
            continue
        assert {p["run"], p["change"], *p.get("select", {})} <= set(table.columns), (experiment, p["claim"])
        for column, value in p.get("select", {}).items():
            table = table[table[column] == value]
        runs = set(table[p["run"]])
        assert p["main"] in runs and len(runs) > 1, (experiment, p["claim"])  # the main run, and another to compare
        effects = REPO_ROOT / "results" / "default" / experiment / "tables" / "effects.csv"
        assert p["claim"] in set(pd.read_csv(effects).effect), (experiment, p["claim"])


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


def test_a_run_records_the_commit_it_started_at_and_a_commit_during_it_that_touched_its_code(tmp_path, monkeypatch):
    """The runner sets RUN_GIT at a notebook's start; a commit made while it runs is not the code it
    imported, so the run keeps its first commit, dirty only if that commit changed the run's paths."""

    def git(*args):
        out = subprocess.run(["git", *args], cwd=tmp_path, capture_output=True, text=True, check=True)
        return out.stdout.strip()

    git("init", "-q")
    git("config", "user.email", "t@t")
    git("config", "user.name", "t")
    (tmp_path / "mine.py").write_text("a = 1\n")
    (tmp_path / "other.py").write_text("b = 1\n")
    git("add", "-A")
    git("commit", "-qm", "first")
    first = git("rev-parse", "HEAD")
    monkeypatch.setattr(provenance, "REPO_ROOT", tmp_path)
    monkeypatch.setenv(provenance.RUN_GIT, json.dumps(provenance.git_state(["mine.py"])))
    (tmp_path / "other.py").write_text("b = 2\n")
    git("commit", "-qam", "during the run, elsewhere")
    assert provenance.git_state(["mine.py"]) == {"commit": first, "dirty": False}
    (tmp_path / "mine.py").write_text("a = 2\n")
    git("commit", "-qam", "during the run, its own code")
    assert provenance.git_state(["mine.py"]) == {"commit": first, "dirty": True}
    monkeypatch.delenv(provenance.RUN_GIT)
    assert provenance.git_state(["mine.py"]) == {"commit": git("rev-parse", "HEAD"), "dirty": False}


def _effects_row(rng_seed=7):
    """One effects_table row from per-user values whose change is known: +10% on the median user,
    +5% to +15% across users."""
    users = np.linspace(1.0, 2.0, 12)
    worse = np.stack([users, users * 1.01])
    gain = 1.1 + np.linspace(-0.05, 0.05, 12)
    paper = claims.Paper("P", (claims.PaperNumber("a", 1.1, "s"), claims.PaperNumber("b", 1.0, "s")), ())
    paper = claims.Paper("P", paper.numbers, (claims.Effect("a beats b", "a", "b"),))
    table = claims.effects_table(paper, {"a beats b": (worse * gain, worse)}, np.random.default_rng(rng_seed), 500)
    return table.iloc[0].to_dict(), worse


def test_publish_draws_the_stored_interval_again_from_the_paired_values_to_the_last_digit():
    row, _ = _effects_row()
    # as publish reads it: every cell a string from the CSV
    as_read = {k: str(v) for k, v in row.items()}
    again = judge.recomputed(as_read)
    assert again[judge.DRAWN] == "at publish, from the paired values"
    for column in ("our change", "ci low", "ci high", "sign test p"):
        assert again[column] == row[column], column
    assert (again["users"], again["seeds"], again["users improved"]) == (12, 2, 12)
    assert again["our change"] == pytest.approx(0.1, abs=0.01) and again["ci low"] < 0.1 < again["ci high"]


def test_a_rule_changed_at_publish_draws_a_new_interval_from_the_same_values(monkeypatch):
    row, _ = _effects_row()
    monkeypatch.setattr(judge, "LEVEL", 0.5)
    narrow = judge.recomputed(row)
    assert row["ci low"] < narrow["ci low"] < narrow["ci high"] < row["ci high"]
    assert narrow["level"] == 0.5 and narrow["our change"] == row["our change"]


def test_paired_values_that_cannot_be_read_leave_the_stored_interval_and_say_why():
    row, _ = _effects_row()
    for broken in (
        row["paired values"].replace('"worse":', '"other":'),
        "{not json",
        '{"rng": {"bit_generator": "X"}}',
    ):
        kept = judge.recomputed(row | {"paired values": broken})
        assert kept["ci low"] == row["ci low"] and "cannot be read" in kept[judge.DRAWN], broken


def test_a_row_without_paired_values_keeps_the_interval_its_notebook_stored():
    row = {"effect": "x", "our change": "0.1", "ci low": "0.05", "ci high": "0.2"}
    assert judge.recomputed(row) == row | {judge.DRAWN: "stored by the notebook"}


def test_published_pages_draw_intervals_from_stored_values_and_never_show_them(tmp_path, papers):
    """A result whose effects (and a timing table) store paired values: SUMMARY.md counts the row as
    drawn at publish with the stored interval, and no page prints the values' JSON."""
    from ondevice.report import publish

    row, _ = _effects_row()
    exp = tmp_path / "results" / "exp"
    (exp / "tables").mkdir(parents=True)
    for name in ("effects.csv", "timing_effects.csv"):
        pd.DataFrame([row | {"effect": "new keeps old", "paper change": 0.617 / 0.616 - 1}]).to_csv(
            exp / "tables" / name
        )
    run = {"experiment": "exp", "headline": {}, "notebook": {"status": "complete"}}
    (exp / "run.json").write_text(json.dumps(run))
    publish.build(tmp_path / "results", tmp_path / "site", scale="fake", papers_dir=papers, log=lambda _: None)
    summary = (tmp_path / "results" / "SUMMARY.md").read_text()
    assert "**1 of 1 intervals were drawn at publish**" in summary
    assert f"{row['ci low']:+.1%} to {row['ci high']:+.1%}" in summary
    pages = [p.read_text() for p in tmp_path.rglob("*") if p.suffix in (".md", ".html")]
    assert pages and not any('"rng"' in text or '"better":' in text for text in pages)
