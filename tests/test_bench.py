"""`make bench`'s pieces on a tiny model: the FLOP formula it prints counts what it says, the step
is cut at its joints, and evaluation throughput is measured on samples `task.evaluate` accepts."""

import numpy as np

from ondevice.models import lstm_lm
from ondevice.papers.deeptype import bench
from ondevice.tasks.next_word import NextWordTask

CONFIG = lstm_lm.LSTMConfig(input_vocab=60, output_vocab=50, embedding_dim=6, hidden_units=8, layers=2)


def test_step_flops_counts_the_printed_formula_by_hand():
    total, forward, formula = bench.step_flops(CONFIG, batch=4, length=5)
    per_position = 2 * 4 * 8 * (6 + 8) + 2 * 4 * 8 * (8 + 8) + 2 * 8 * 50  # two LSTM layers, softmax
    assert total == 3 * per_position * 4 * 5
    assert f"{per_position:,}" in forward and "3 x" in formula and f"{total / 1e9:.4f} GFLOP" in formula


def test_step_parts_time_every_joint_and_leave_the_weights_alone():
    model, rng = lstm_lm.build(CONFIG, seed=0), np.random.default_rng(0)
    start = model.get_weights()
    batch = rng.integers(2, 60, (4, 5), dtype=np.int32), rng.integers(2, 50, (4, 5), dtype=np.int32)
    parts = bench.step_parts(model, NextWordTask(), batch, repeats=2)
    assert list(parts) == [
        "forward",
        "forward + loss",
        "forward + loss + gradients",
        "full step (+ SGD update, clip 5)",
        "cross-entropy alone (forward + backward)",
    ]
    assert all(ms > 0 for ms in parts.values())
    for a, b in zip(start, model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_eval_throughput_runs_the_real_evaluation():
    model = lstm_lm.build(CONFIG, seed=0)
    positions, words = bench.eval_throughput(model, NextWordTask(), CONFIG, n_words=40)
    assert positions > words > 0 and 6 <= positions / words <= 13  # 3 previous words + 3 to 10 characters
