"""A data or scale diagnosis keeps its kind only with a measured link (report/curves.py): a declared
curve over the quantity it names that moves our change toward the paper's, drawn at publish."""

import json

import numpy as np
import pandas as pd
import pytest

from ondevice import REPO_ROOT
from ondevice.report import curves, judge, provenance

FACTS = """
[paper]
short = "P"
title = "P"
authors = "A"
venue = "V 2020"

[exp.claims]
citation = "A, P"

[[exp.claims.numbers]]
quantity = "personal"
value = 0.6

[[exp.claims.numbers]]
quantity = "global"
value = 0.5

[[exp.claims.effects]]
claim = "personal beats global"
better = "personal"
worse = "global"

[[exp.claims.curves]]
claim = "personal beats global"
quantity = "words per user"
table = "users.csv"
x = "words"
paper_x = 100000
paired = { column = "condition", value = "score", better = "personal", worse = "global" }

[[exp.claims.curves]]
claim = "personal beats global by size"
quantity = "words per user"
table = "users.csv"
x = "words"
paper_x = 100000
conditions = { column = "condition", value = "score", worse = "global", better = ["personal 50%", "personal"] }

[[exp.claims.curves]]
claim = "more data raises it"
quantity = "global words"
table = "sizes_curve.csv"
x = "words"
paper_x = 1000000
steps = "score"
select = { kept = "True" }

[[exp.claims.curves]]
claim = "personal beats global, against the global words"
quantity = "global words of a user"
table = "users.csv"
x = "words"
paper_x = 100000
paired = { column = "condition", value = "score", better = "personal", worse = "global", x_of = "personal 50%" }

[[exp.claims.curves]]
claim = "a habit sets it"
quantity = "share of phones with Wi-Fi"
table = "sweep.csv"
x = "wifi"
change = "change"
spans = true

[[exp.claims.curves]]
claim = "bigger at the paper's size"
quantity = "model size"
table = "sizes.csv"
change = "change"
select = { model = "big" }
"""

ROW = {"our change": 0.02, "paper change": 0.2, "diagnosis": "few words", "diagnosis kind": "data"}


@pytest.fixture
def papers(tmp_path):
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "paper.toml").write_text(FACTS)
    judge._facts.cache_clear()
    yield tmp_path
    judge._facts.cache_clear()


def users(gain, n=12, seeds=("0", "1")) -> list[dict]:
    """A per-user table: user i has 1,000 x (i + 1) words and its personal score gains gain(i)."""
    rows = []
    for s in seeds:
        for i in range(n):
            base = 0.4 + 0.01 * (i % 3)
            for c, v in (
                ("global", base),
                ("personal", base * (1 + gain(i))),
                ("personal 50%", base * (1 + gain(i) / 2)),
            ):
                words = 1000 * (i + 1) // (2 if c.endswith("50%") else 1)
                rows.append({"seed": s, "user": f"u{i}", "condition": c, "score": str(v), "words": str(words)})
    return rows


def test_a_change_that_rises_with_words_keeps_a_data_diagnosis_and_shows_the_curve(papers):
    row = ROW | {"effect": "personal beats global"}
    checked = judge.curve_checked(row, "exp", {"users.csv": users(lambda i: 0.01 * i)}, papers)
    assert checked["diagnosis kind"] == "data"
    assert checked["diagnosis"].startswith("few words; curve: across 12 users (words per user 1,000 to 12,000")
    assert "rank correlation +1.00 [+1.00, +1.00]" in checked["diagnosis"]


def test_a_change_that_does_not_rise_toward_the_paper_reads_open(papers):
    row = ROW | {"effect": "personal beats global"}
    for gain in (lambda i: -0.01 * i, lambda i: 0.02 * (-1) ** i):  # falls; or no trend at all
        checked = judge.curve_checked(row, "exp", {"users.csv": users(gain)}, papers)
        assert checked["diagnosis kind"] == "open"
        assert checked["diagnosis"].startswith("open (no measured link), not data: the curve does not move")
        assert checked["diagnosis"].endswith("the change must rise); few words")
    # ours above the paper's: toward the paper's words the change must fall, and a falling curve shows it
    above = row | {"our change": 0.4}
    assert (
        judge.curve_checked(above, "exp", {"users.csv": users(lambda i: -0.01 * i)}, papers)["diagnosis kind"] == "data"
    )


def test_a_data_or_scale_diagnosis_without_a_curve_reads_open_and_other_kinds_are_kept(papers):
    row = ROW | {"effect": "undeclared", "diagnosis kind": "scale"}
    checked = judge.curve_checked(row, "exp", {}, papers)
    assert checked["diagnosis kind"] == "open"
    assert checked["diagnosis"].startswith("open (no curve), not scale: no curve over the quantity it names")
    declared_but_not_stored = ROW | {"effect": "personal beats global"}
    assert judge.curve_checked(declared_but_not_stored, "exp", {}, papers)["diagnosis"].startswith("open (no curve)")
    for kept in (row | {"diagnosis kind": "hardware"}, row | {"diagnosis kind": "open"}, row | {"diagnosis": ""}):
        assert judge.curve_checked(kept, "exp", {}, papers) == kept


def test_the_change_at_each_data_size_must_grow_with_its_words(papers):
    row = ROW | {"effect": "personal beats global by size"}
    checked = judge.curve_checked(row, "exp", {"users.csv": users(lambda i: 0.1)}, papers)
    assert checked["diagnosis kind"] == "data"
    assert "personal 50% (3,250) +5.0%, personal (6,500) +10.0%" in checked["diagnosis"]
    shrinking = judge.curve_checked(row, "exp", {"users.csv": users(lambda i: -0.1)}, papers)
    assert shrinking["diagnosis kind"] == "open"


def sizes_curve(per_doubling: list[float], n=10) -> list[dict]:
    """Scores of n users at 10,000 x 2^k words (k = 0, 2, 3, 4: steps of 4x, 2x, 2x) that grow by
    `per_doubling[i]` a doubling over step i, user i offset by 0.01 x i, beside an unkept epoch."""
    rows, words, score = [], [10_000, 40_000, 80_000, 160_000], [0.3]
    for g, a, b in zip(per_doubling, words, words[1:]):
        score.append(score[-1] * (1 + g) ** np.log2(b / a))
    for i in range(n):
        for w, v in zip(words, score):
            for kept, at in (("True", v + 0.01 * i), ("False", 0.01)):
                rows.append({"seed": "0", "user": f"u{i}", "words": str(w), "kept": kept, "score": str(at)})
    return rows


def test_the_gain_per_doubling_of_the_data_must_fall_toward_the_papers_size_where_ours_is_above(papers):
    row = ROW | {"effect": "more data raises it", "our change": 0.3, "paper change": 0.09}
    falling = judge.curve_checked(row, "exp", {"sizes_curve.csv": sizes_curve([0.2, 0.1, 0.05])}, papers)
    assert falling["diagnosis kind"] == "data"
    assert "gain per doubling of global words (10 users, sizes_curve.csv): 10,000 -> 40,000 +" in falling["diagnosis"]
    assert "toward the paper's global words (1,000,000) the change must fall" in falling["diagnosis"]
    steady = judge.curve_checked(row, "exp", {"sizes_curve.csv": sizes_curve([0.1, 0.1, 0.1])}, papers)
    assert steady["diagnosis kind"] == "open"
    assert steady["diagnosis"].startswith("open (no measured link), not data")
    two_sizes = [r for r in sizes_curve([0.2, 0.1, 0.05]) if r["words"] in ("10000", "40000")]
    assert judge.curve_checked(row, "exp", {"sizes_curve.csv": two_sizes}, papers)["diagnosis"].startswith(
        "open (no curve)"
    )


def test_a_users_quantity_can_come_from_the_other_conditions_rows(papers):
    """`x_of`: the words counted in the compressed condition's rows, not the better one's."""
    row = ROW | {"effect": "personal beats global, against the global words"}
    checked = judge.curve_checked(row, "exp", {"users.csv": users(lambda i: 0.01 * i)}, papers)
    assert "words per user" not in checked["diagnosis"]
    assert "(global words of a user 500 to 6,000" in checked["diagnosis"]


def test_a_sweep_links_where_it_reaches_the_papers_change_or_its_point_at_the_papers_size_is_nearer(papers):
    sweep = [{"wifi": str(w), "change": str(c)} for w, c in ((0.2, 3.0), (0.8, 0.3), (1.0, 0.05))]
    row = ROW | {"effect": "a habit sets it", "our change": 0.3, "paper change": 1.0}
    assert judge.curve_checked(row, "exp", {"sweep.csv": sweep}, papers)["diagnosis kind"] == "data"
    assert (
        "the paper's +100.0% within this range"
        in judge.curve_checked(row, "exp", {"sweep.csv": sweep}, papers)["diagnosis"]
    )
    assert (
        judge.curve_checked(row | {"paper change": 5.0}, "exp", {"sweep.csv": sweep}, papers)["diagnosis kind"]
        == "open"
    )
    sizes = [{"model": "small", "change": "0.9"}, {"model": "big", "change": "0.3"}]
    row = ROW | {"effect": "bigger at the paper's size", "our change": 0.05, "paper change": 0.33}
    assert judge.curve_checked(row, "exp", {"sizes.csv": sizes}, papers)["diagnosis kind"] == "data"
    assert (
        judge.curve_checked(row | {"our change": 0.32}, "exp", {"sizes.csv": sizes}, papers)["diagnosis kind"] == "open"
    )


def test_a_curve_without_its_form_or_quantity_is_an_error(papers):
    (papers / "p" / "paper.toml").write_text(
        FACTS + '\n[[exp.claims.curves]]\nclaim = "broken"\ntable = "users.csv"\nx = "words"\n'
    )
    judge._facts.cache_clear()
    with pytest.raises(ValueError, match="curve of 'broken' lacks quantity, one form"):
        judge.curve_checked(ROW | {"effect": "broken"}, "exp", {}, papers)


def test_spearman_ranks_ties_and_reads_zero_where_a_side_does_not_vary():
    assert curves.spearman(np.array([1.0, 2, 3, 4]), np.array([10.0, 20, 30, 40])) == pytest.approx(1.0)
    assert curves.spearman(np.array([1.0, 1, 2, 2]), np.array([1.0, 1, 2, 2])) == pytest.approx(1.0)
    assert curves.spearman(np.array([1.0, 2, 3]), np.array([5.0, 5, 5])) == 0.0


def test_every_declared_curve_draws_from_its_committed_result():
    """A declaration whose table, columns or conditions are misspelt would draw nothing and read open."""
    judge._facts.cache_clear()
    declared = [
        (experiment, c)
        for doc in judge._facts(judge.PAPERS).values()
        for experiment, sections in doc.items()
        if isinstance(sections, dict)
        for section in sections.values()
        if isinstance(section, dict)
        for c in section.get("curves", [])
    ]
    assert declared
    for experiment, c in declared:
        path = REPO_ROOT / "results" / "default" / experiment / "tables" / c["table"]
        if not path.is_file():  # only a result made by older code may lack it: its re-run stores the table
            git = (json.loads((path.parents[1] / "run.json").read_text()).get("environment") or {}).get("git") or {}
            assert provenance.changed_since(git, experiment)["stale"], (experiment, c["table"])
            continue
        rows = pd.read_csv(path).astype(str).to_dict("records")
        assert c["claim"] in set(pd.read_csv(path.with_name("effects.csv")).effect), (experiment, c["claim"])
        sections = [s for s in judge._claims(experiment, judge.PAPERS)]
        (curve,) = [k for k in curves.declared(sections, experiment, c["claim"]) if k.table == c["table"]]
        assert curves.link(curve, rows, ours=0.0, paper=0.1) is not None, (experiment, c["claim"])
