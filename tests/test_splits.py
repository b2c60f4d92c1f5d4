import numpy as np
import pytest

from ondevice.data.splits import choose_heldout, split_history


def test_split_history_keeps_order_and_fraction():
    items = [f"s{i}" for i in range(10)]
    train, test = split_history(items, [10] * 10, 0.7)
    assert train == items[:7] and test == items[7:]
    train, test = split_history(["a", "b"], [100, 1], 0.5)  # never an empty side
    assert train == ["a"] and test == ["b"]


def test_choose_heldout_is_seeded_and_respects_minimum():
    sizes = {f"u{i}": i * 100 for i in range(50)}
    a = choose_heldout(sizes, 5, 2000, np.random.default_rng(1))
    assert a == choose_heldout(sizes, 5, 2000, np.random.default_rng(1))
    assert len(set(a)) == 5 and all(sizes[u] >= 2000 for u in a)
    with pytest.raises(ValueError, match="only 30 users"):
        choose_heldout(sizes, 31, 2000, np.random.default_rng(0))
