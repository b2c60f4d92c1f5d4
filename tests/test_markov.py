"""The non-neural baselines give the answers worked out by hand."""

import numpy as np
import pytest

from ondevice.models.markov import Markov, most_frequent


def test_most_frequent_takes_the_smallest_id_among_ties_and_minus_one_for_nothing():
    assert most_frequent(np.array([3, 1, 3, 1, 2])) == 1
    assert most_frequent(np.array([5, 5, 2])) == 5
    assert most_frequent(np.array([], int)) == -1


def test_markov_predicts_the_most_frequent_successor_and_falls_back_for_unseen_symbols():
    # home(0) -> work(1) twice, home -> gym(2) once; work -> home always; gym -> home
    current = np.array([0, 1, 0, 1, 0, 2])
    following = np.array([1, 0, 1, 0, 2, 0])
    model = Markov(current, following)
    np.testing.assert_array_equal(model.predict(np.array([0, 1, 2, 7])), [1, 0, 0, 0])  # 7 unseen: overall mode 0
    tie = Markov(np.array([4, 4]), np.array([9, 8]))
    assert tie.predict(np.array([4]))[0] == 8


def test_markov_rejects_mismatched_inputs():
    with pytest.raises(ValueError, match="one shape"):
        Markov(np.array([1, 2]), np.array([1]))
