"""The new-paper skeleton: its example experiment runs end to end at smoke scale, and `make
new-paper` copies it into a folder of the shape tests/test_structure.py checks, renamed throughout."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import new_paper  # noqa: E402


def test_the_template_experiment_runs_and_judges_its_claim(tmp_path):
    from ondevice.papers._template.experiments import template_example as exp

    result = exp.run(exp.Params.for_scale("smoke"), log=lambda _: None)
    users = result.tables["users"]
    assert len(users) == 4 and users.best_epoch.between(1, 5).all()
    assert users[exp.PERSONAL].between(0, 1).all() and users[exp.BASELINE].between(0, 1).all()
    effects = result.tables["effects"]
    assert list(effects.effect) == [e.claim for e in exp.PAPER.effects]
    assert effects.verdict.isin(["holds", "does not hold", "within noise"]).all()
    assert result.save(tmp_path / "out").joinpath("run.json").is_file()


def test_new_paper_copies_the_skeleton_renamed(tmp_path):
    for part in ("lib/ondevice/papers/_template", "notebooks/_template"):
        src, dst = ROOT / part, tmp_path / part
        for f in src.rglob("*"):
            if f.is_file() and "__pycache__" not in f.parts:
                (dst / f.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
                (dst / f.relative_to(src)).write_bytes(f.read_bytes())
    written = new_paper.create("mypaper", tmp_path)
    paper, notebooks = tmp_path / "lib/ondevice/papers/mypaper", tmp_path / "notebooks/mypaper"
    for part in ("__init__.py", "paper.toml", "protocol.py", "experiments/__init__.py", "techniques/__init__.py"):
        assert (paper / part).is_file()
    assert (paper / "experiments/mypaper_example.py").is_file() and (notebooks / "mypaper_example.ipynb").is_file()
    text = "".join(f.read_text() for f in written)
    assert "_template" not in text and "template_example" not in text
    assert "ondevice.papers.mypaper.experiments import mypaper_example" in text
    assert "[mypaper_example.claims]" in (paper / "paper.toml").read_text()
    with pytest.raises(FileExistsError):
        new_paper.create("mypaper", tmp_path)
    with pytest.raises(ValueError, match="identifier"):
        new_paper.create("My-Paper", tmp_path)


def test_the_template_notebook_runs_under_papermill(tmp_path):
    import papermill

    from ondevice.report.runner import KERNEL

    out = tmp_path / "out"
    papermill.execute_notebook(
        str(ROOT / "notebooks/_template/template_example.ipynb"),
        str(tmp_path / "executed.ipynb"),
        parameters={"scale": "smoke", "out_dir": str(out)},
        kernel_name=KERNEL,
        progress_bar=False,
    )
    assert (out / "run.json").is_file() and (out / "tables" / "effects.csv").is_file()
