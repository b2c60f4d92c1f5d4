"""`make bench`'s pieces on a tiny model: the FLOP formula it prints counts what it says, the step
is cut at its joints, and evaluation throughput is measured on samples `task.evaluate` accepts."""

import numpy as np

from ondevice.models import lstm_lm
from ondevice.papers.deeptype import bench_measures
from ondevice.tasks.next_word import NextWordTask

CONFIG = lstm_lm.LSTMConfig(input_vocab=60, output_vocab=50, embedding_dim=6, hidden_units=8, layers=2)


def test_step_flops_counts_the_printed_formula_by_hand():
    total, forward, formula = bench_measures.step_flops(CONFIG, batch=4, length=5)
    per_position = 2 * 4 * 8 * (6 + 8) + 2 * 4 * 8 * (8 + 8) + 2 * 8 * 50  # two LSTM layers, softmax
    assert total == 3 * per_position * 4 * 5
    assert f"{per_position:,}" in forward and "3 x" in formula and f"{total / 1e9:.4f} GFLOP" in formula


def test_step_parts_time_every_joint_and_leave_the_weights_alone():
    model, rng = lstm_lm.build(CONFIG, seed=0), np.random.default_rng(0)
    start = model.get_weights()
    batch = rng.integers(2, 60, (4, 5), dtype=np.int32), rng.integers(2, 50, (4, 5), dtype=np.int32)
    parts = bench_measures.step_parts(model, NextWordTask(), batch, repeats=2)
    assert list(parts) == [
        "forward",
        "forward + loss",
        "forward + loss + gradients",
        "full step (+ SGD update, clip 5)",
        "cross-entropy alone (forward + backward)",
        "  the same by TensorFlow's sparse op (before)",
    ]
    assert all(ms > 0 for ms in parts.values())
    for a, b in zip(start, model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_eval_throughput_runs_the_real_evaluation_and_matches_the_eager_one():
    model = lstm_lm.build(CONFIG, seed=0)
    r = bench_measures.eval_throughput(model, NextWordTask(), CONFIG, n_words=40)
    assert r["positions_per_s"] > r["words_per_s"] > 0 and 6 <= r["positions_per_s"] / r["words_per_s"] <= 13
    assert r["eager_positions_per_s"] > 0 and r["same_chars_needed"]


def test_compiled_evaluation_gives_every_words_chars_needed_as_the_eager_per_sample_one():
    model, samples = lstm_lm.build(CONFIG, seed=1), bench_measures.eval_samples(CONFIG, n_words=300, seed=2)
    samples.labels[::7] = 1  # some <unk> words: never a hit
    got = NextWordTask(k=3).evaluate(model, samples)["chars_needed"]
    want = bench_measures.eager_evaluate(model, samples, k=3)
    np.testing.assert_array_equal(got, want)
    assert 0 < (got < samples.word_len).sum() < len(got)  # some words suggested early, some never


def test_the_mobilenet_fedavg_bench_prints_its_rounds_against_the_bare_step(capsys):
    from ondevice.papers.autlearn import bench_fedavg

    assert bench_fedavg.main(["--mobilenet", "--scale", "smoke"]) == 0
    out = capsys.readouterr().out
    assert "smoke: 2 clients a round" in out and "of the clients' own step rate" in out
