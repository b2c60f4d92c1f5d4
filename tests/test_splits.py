import numpy as np
import pytest

from ondevice import streams
from ondevice.data.splits import SplitRule, make_split, split_history

SIZES = {f"u{i:02d}": i * 100 for i in range(50)}
RULE = SplitRule(
    test_users=5, test_min_words=3000, validation_users=4, validation_min_words=2000, validation_max_words=3000
)


def test_split_history_keeps_order_and_fraction():
    items = [f"s{i}" for i in range(10)]
    train, test = split_history(items, [10] * 10, 0.7)
    assert train == items[:7] and test == items[7:]
    train, test = split_history(["a", "b"], [100, 1], 0.5)  # never an empty side
    assert train == ["a"] and test == ["b"]


def test_split_is_disjoint_follows_the_rule_and_depends_on_its_own_seed_only():
    split = make_split("toy", SIZES, RULE)
    assert len(split.test) == 5 and all(SIZES[u] >= 3000 for u in split.test)
    assert len(split.validation) == 4 and all(2000 <= SIZES[u] < 3000 for u in split.validation)
    roles = [split.role(u) for u in SIZES]
    assert roles.count("crowd") == 41 and set(split.crowd).isdisjoint(split.test + split.validation)
    assert make_split("toy", SIZES, RULE) == split and make_split("toy", SIZES, RULE).digest == split.digest
    other = make_split("toy", SIZES, SplitRule(**{**RULE.__dict__, "seed": 1}))
    assert other.test != split.test and other.digest != split.digest
    assert split.to_dict()["test"] == list(split.test)


def test_impossible_split_is_a_clear_error():
    with pytest.raises(ValueError, match="only 20 users qualify as test users"):
        make_split("toy", SIZES, SplitRule(21, 3000, 0, 1, 2))


def test_random_streams_are_stable_and_independent():
    assert streams.stream_id("crowd") == streams.stream_id("crowd") != streams.stream_id("split")
    a = streams.rng(0, "personal/u1").random(3)
    np.testing.assert_array_equal(a, streams.rng(0, "personal/u1").random(3))
    assert not np.array_equal(a, streams.rng(0, "personal/u2").random(3))
    assert not np.array_equal(a, streams.rng(1, "personal/u1").random(3))
    with pytest.raises(ValueError):
        streams.rng(0, "")
