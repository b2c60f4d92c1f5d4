import json

import numpy as np
import pytest

from ondevice.training import model_cache


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ONDEVICE_MODEL_CACHE", str(tmp_path / "models"))
    return tmp_path / "models"


def trainer(calls, value=1.0):
    def train():
        calls.append(1)
        return [np.full((2, 3), value, np.float32), np.arange(4)], {"history": [{"epoch": 1, "loss": 0.5}]}

    return train


def test_trains_once_then_reuses_the_same_weights(cache):
    calls = []
    first = model_cache.load_or_train("m", {"units": 4}, ["abc"], "code1", trainer(calls), log=lambda _: None)
    second = model_cache.load_or_train("m", {"units": 4}, ["abc"], "code1", trainer(calls, 2.0), log=lambda _: None)
    assert calls == [1] and not first.hit and second.hit
    for a, b in zip(first.weights, second.weights):
        np.testing.assert_array_equal(a, b)
    assert second.info["history"] == [{"epoch": 1, "loss": 0.5}] and second.info["train_seconds"] >= 0


def test_a_reused_entry_prints_what_its_training_printed(cache, capsys):
    """A run that finds its model prints the same lines as the run that trained it (the notebooks'
    same-seed test compares the two line by line)."""

    def train():
        print("epoch 1/2 loss 0.9")
        print("epoch 2/2 loss 0.5", end="")
        return [np.zeros(2)], {}

    model_cache.load_or_train("m", {}, [], "c", train, log=lambda _: None)
    trained = capsys.readouterr().out
    entry = model_cache.load_or_train("m", {}, [], "c", train, log=lambda _: None)
    assert entry.hit and trained == "epoch 1/2 loss 0.9\nepoch 2/2 loss 0.5" == capsys.readouterr().out


@pytest.mark.parametrize("change", [dict(fields={"units": 5}), dict(data=["abd"]), dict(code="code2")])
def test_any_change_of_fields_data_or_code_trains_again(cache, change):
    calls = []
    base = dict(fields={"units": 4}, data=["abc"], code="code1")
    model_cache.load_or_train("m", **base, train=trainer(calls), log=lambda _: None)
    entry = model_cache.load_or_train("m", **{**base, **change}, train=trainer(calls), log=lambda _: None)
    assert calls == [1, 1] and not entry.hit


def test_interrupted_training_leaves_no_entry_and_a_corrupt_entry_is_retrained(cache):
    def boom():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        model_cache.load_or_train("m", {}, [], "c", boom, log=lambda _: None)
    assert not cache.exists() or not [p for p in cache.iterdir() if p.suffix != ".lock"]  # the lock file stays
    calls = []
    entry = model_cache.load_or_train("m", {}, [], "c", trainer(calls), log=lambda _: None)
    (entry.path / "weights.npz").write_bytes(b"not a zip")
    again = model_cache.load_or_train("m", {}, [], "c", trainer(calls), log=lambda _: None)
    assert calls == [1, 1] and not again.hit
    assert json.loads((again.path / "info.json").read_text())["key"] == again.key


def test_code_digest_ignores_formatting_comments_and_docstrings_not_code(tmp_path):
    from ondevice.training.model_cache import code_digest

    f = tmp_path / "train.py"
    digest = lambda text: (f.write_text(text), code_digest([f]))[1]  # noqa: E731
    base = digest('def step(x):\n    """Why."""\n    return x * 0.5\n')
    assert digest("def step(x):  # the same step\n    return x*0.5\n") == base  # reformatted, no docstring
    assert digest('def step(x):\n    """Another why."""\n\n    return (x * 0.5)\n') == base
    assert digest("def step(x):\n    return x * 0.25\n") != base  # a changed constant
    assert digest("def step(y):\n    return y * 0.5\n") != base  # a renamed argument is another code
    assert code_digest([], extra="    def m(self):\n        return 1\n") == code_digest(
        [], extra="def m(self): return 1"
    )


def _train_in_another_process(cache_dir: str, log_file: str) -> bool:
    """A spawned process asking for the key the test process is training; returns whether it hit."""
    import os

    os.environ["ONDEVICE_MODEL_CACHE"] = cache_dir

    def train():
        with open(log_file, "a") as f:
            f.write("trained by the other process\n")
        return [np.zeros(2, np.float32)], {}

    def log(message):
        with open(log_file, "a") as f:
            f.write(message + "\n")

    return model_cache.load_or_train("m", {"units": 4}, ["abc"], "code1", train, log=log).hit


def test_a_key_being_trained_elsewhere_is_waited_for_not_trained_twice(cache, tmp_path):
    """Two notebooks run at once (report/at_once.py) and want one global model: the second waits
    for the first and reads its entry."""
    import multiprocessing
    import time

    log_file = tmp_path / "log.txt"
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:

        def train():
            other = pool.apply_async(_train_in_another_process, (str(cache), str(log_file)))
            deadline = time.monotonic() + 60
            while "waiting" not in (log_file.read_text() if log_file.exists() else ""):
                assert time.monotonic() < deadline, "the other process never waited for the lock"
                assert not other.ready(), "the other process finished while this one held the lock"
                time.sleep(0.05)
            train.other = other
            return [np.ones(2, np.float32)], {}

        entry = model_cache.load_or_train("m", {"units": 4}, ["abc"], "code1", train, log=lambda _: None)
        assert not entry.hit and train.other.get(timeout=60) is True
    assert "trained by the other process" not in log_file.read_text()
