"""A stage's result kept with the run's finished jobs (engine/stage.py): read back when the same
inputs and code come again, computed again when any input changes or the stored file is bad."""

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tf_keras as keras

from ondevice.engine.stage import fingerprint, resumable
from ondevice.training.model_cache import Entry

CALLS = []


@dataclass(frozen=True)
class Fields:
    rate: float
    grid: tuple


@resumable("toy")
def toy_stage(params: Fields, data: dict, model, entry: Entry, log=print):
    CALLS.append(params)
    log(f"trained at {params.rate}")
    return {"sum": float(data["x"].sum() * params.rate), "words": data["words"]}


def _inputs(rate=0.5, x=(1.0, 2.0), hit=False):
    data = {"x": np.array(x, np.float32), "words": ["to", "be"]}
    entry = Entry("key-1", Path("/cache/e"), [np.zeros(2)], {"trained_at": "then"}, hit)
    return Fields(rate, (1, 2)), data, keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]), entry


def test_without_a_jobs_directory_the_stage_runs_every_time(monkeypatch):
    monkeypatch.delenv("ONDEVICE_JOBS_DIR", raising=False)
    CALLS.clear()
    assert toy_stage(*_inputs()) == toy_stage(*_inputs()) and len(CALLS) == 2


def test_a_stage_is_read_back_for_equal_inputs_and_computed_again_for_changed_ones(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("ONDEVICE_JOBS_DIR", str(tmp_path))
    CALLS.clear()
    first = toy_stage(*_inputs())
    assert capsys.readouterr().out == "trained at 0.5\n" and (tmp_path / "stage-toy.pkl").is_file()
    # equal inputs in new objects: another Keras model and log, the model-cache entry now a hit
    again = toy_stage(*_inputs(hit=True), log=lambda line: print(line))
    printed = capsys.readouterr().out
    assert again == first and len(CALLS) == 1
    assert printed.startswith("[stage] toy: read back from") and printed.endswith("trained at 0.5\n")
    for changed in (_inputs(rate=0.25), _inputs(x=(1.0, 2.5))):
        toy_stage(*changed)
    assert len(CALLS) == 3
    (tmp_path / "stage-toy.pkl").write_bytes(b"not a pickle")  # a bad file: computed again, not an error
    assert toy_stage(*_inputs(x=(1.0, 2.5))) == {"sum": 1.75, "words": ["to", "be"]} and len(CALLS) == 4


def test_fingerprint_counts_content_not_identity():
    a = {"w": [np.arange(3, dtype=np.float32)], "n": 1, "s": ("a", "b")}
    assert fingerprint(a) == fingerprint({"n": 1, "s": ("a", "b"), "w": [np.arange(3, dtype=np.float32)]})
    assert fingerprint(a) != fingerprint({**a, "w": [np.arange(3, dtype=np.float64)]})  # the type counts
    assert fingerprint(a) != fingerprint({**a, "w": [np.arange(3, dtype=np.float32).reshape(1, 3)]})  # the shape
    assert fingerprint(["ab", "c"]) != fingerprint(["a", "bc"])  # a sentence's words stay apart


@resumable("per_seed", part=lambda params, seed, log=print: f"seed{seed}")
def per_seed_stage(params: Fields, seed: int, log=print):
    CALLS.append(seed)
    log(f"seed {seed} at {params.rate}")
    return seed * params.rate


def test_a_stage_with_parts_keeps_one_file_per_part_and_resumes_each(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("ONDEVICE_JOBS_DIR", str(tmp_path))
    CALLS.clear()
    params = Fields(0.5, (1,))
    assert [per_seed_stage(params, s) for s in (0, 1)] == [0.0, 0.5]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stage-per_seed-seed0.pkl", "stage-per_seed-seed1.pkl"]
    (tmp_path / "stage-per_seed-seed1.pkl").unlink()  # seed 1 interrupted: only seed 1 is computed again
    capsys.readouterr()
    assert [per_seed_stage(params, s) for s in (0, 1)] == [0.0, 0.5] and CALLS == [0, 1, 1]
    assert capsys.readouterr().out.startswith("[stage] per_seed-seed0: read back from")
