"""The conclusion builder: per-user measurements and the paper's facts in, the record's tables out."""

import numpy as np
import pandas as pd
import pytest

from ondevice.params import Params
from ondevice.report import claims
from ondevice.report.conclusion import Conclusion, diagnose, diagnosed, effect_row, wide

PAPER = claims.Paper(
    "someone 2018",
    (claims.PaperNumber("top-k-eff, global", 0.5, "T1"), claims.PaperNumber("top-k-eff, personal", 0.6, "T1")),
    (claims.Effect("personalization helps", "top-k-eff, personal", "top-k-eff, global"),),
)


def tidy(seeds=2, users=8, gain=1.2) -> pd.DataFrame:
    """Per (seed, user, condition) top-k-eff: the personal model `gain` times the global one."""
    rng = np.random.default_rng(0)
    base = rng.uniform(0.3, 0.5, size=(seeds, users))
    rows = [
        {"seed": s, "user": f"u{u:02d}", "condition": c, "top_k_eff": base[s, u] * (gain if c == "personal" else 1)}
        for s in range(seeds)
        for u in range(users)
        for c in ("global", "personal")
    ]
    return pd.DataFrame(rows).sample(frac=1, random_state=1)  # shuffled: wide must sort


def test_a_conclusion_from_tidy_measurements_gives_the_record_with_headline_paper_and_effects(tmp_path):
    users = tidy()
    c = Conclusion("toy", Params("smoke", 0), PAPER)
    med = users.groupby(["seed", "condition"]).top_k_eff.median()
    c.headlines({f"top-k-eff, {k}": med.xs(k, level="condition") for k in ("global", "personal")})
    better, worse = wide(users, "top_k_eff", condition="personal"), wide(users, "top_k_eff", condition="global")
    assert better.shape == (2, 8) and np.allclose(better, worse * 1.2)
    why = claims.Diagnosis("few words per user", "Vocabulary", claims.Kind.DATA)
    rng = np.random.default_rng(0)
    c.effects({"personalization helps": (better, worse)}, rng, n_boot=200, diagnoses={"personalization helps": why})
    c.paper_vs_ours(setting={"top-k-eff, global": "G", "top-k-eff, personal": "P"})
    result = c.result({"users": users}, [{"name": "toy data"}], "a toy corpus", 1.5, seeds=[0, 1])
    assert list(result.tables) == ["users", "headline", "effects", "paper_vs_ours"]
    row = result.tables["effects"].iloc[0]
    assert row["our change"] == pytest.approx(0.2) and row.verdict == "holds"
    assert (row.diagnosis, row["diagnosis kind"]) == ("few words per user", "data")
    numbers = result.tables["paper_vs_ours"].set_index("quantity")
    assert numbers.loc["top-k-eff, personal", "ours"] == pytest.approx(1.2 * numbers.loc["top-k-eff, global", "ours"])
    assert numbers["ours (setting)"].tolist() == ["G", "P"]
    assert result.headline["top-k-eff, global"]["per_seed"] == med.xs("global", level="condition").tolist()
    assert result.notes == {"seeds": [0, 1]} and result.stand_in_data == "a toy corpus"
    result.save(tmp_path)
    assert (tmp_path / "tables" / "effects.csv").is_file() and (tmp_path / "run.json").is_file()


def test_rows_the_paper_cannot_pair_keep_their_columns_and_take_a_diagnosis_later():
    users = tidy(seeds=1)
    better, worse = wide(users, "top_k_eff", condition="personal"), wide(users, "top_k_eff", condition="global")
    first = {"effect": "mine", "paper change": np.nan}
    row = effect_row(first, better, worse, np.random.default_rng(0), 100, "mean", {"absolute": 0.1})
    assert list(row)[:6] == ["effect", "paper change", "our change", "ci low", "ci high", "absolute"]
    assert list(row)[6:] == ["users", "seeds", "users improved", "users worse", "sign test p", "verdict", "level"]
    assert row["users improved"] == 8 and row["our change"] == pytest.approx(0.2)
    assert diagnosed({"effect": "x"}, None) == {"effect": "x", "diagnosis": "", "section": "", "diagnosis kind": ""}
    c = Conclusion("toy", Params("smoke", 0))
    table = c.effect_rows([row, first | {"effect": "other", "our change": 0.0}])
    table = diagnose(table, "mine", claims.Diagnosis("our optimiser", "Sensitivity"))
    assert table["diagnosis kind"].tolist() == ["open", ""] and table.section.tolist() == ["Sensitivity", ""]


def test_a_conclusion_refuses_what_it_cannot_build():
    c = Conclusion("toy", Params("smoke", 0))
    with pytest.raises(ValueError, match="no paper facts"):
        c.paper_vs_ours()
    c.effect_rows([{"effect": "x"}])
    with pytest.raises(ValueError, match="come from the conclusion builder"):
        c.result({"effects": pd.DataFrame()}, [], None, 0.0)
    with pytest.raises(KeyError, match="top-k-eff, personal"):
        Conclusion("toy", Params("smoke", 0), PAPER).paper_vs_ours({"top-k-eff, global": 0.4})
