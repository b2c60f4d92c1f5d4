import numpy as np
import pytest
import tensorflow as tf

from ondevice.data.typing_samples import Vocabulary, build_samples
from ondevice.metrics import accuracy, chars_needed, mean_auc, roc_auc, top_k_eff, typed_chars_needed
from ondevice.tasks.next_word import NextWordTask, position_scores


def test_paper_worked_example_priceless():
    """Sec. 3.2: after "p" the top-3 misses "priceless", after "pr" it is shown, so R = 2."""
    shown = {
        0: ["is", "health", "priority"],
        1: ["priority", "paramount", "precious"],
        2: ["priority", "precious", "priceless"],
    }
    n_context, length = 2, len("priceless")
    hits = np.zeros(n_context + length, bool)
    for typed, top3 in shown.items():
        hits[n_context - 1 + typed] = "priceless" in top3
    hits[n_context - 1 + 3 :] = True
    r = typed_chars_needed(hits, n_context, length)
    assert r == 2
    assert top_k_eff([length], [r]) == pytest.approx(7 / 9)


def test_word_never_suggested_costs_all_its_characters_and_first_words_start_at_one():
    assert typed_chars_needed(np.zeros(5, bool), 1, 4) == 4
    # no previous words: position 0 is after one typed character
    assert typed_chars_needed(np.array([True, True]), 0, 2) == 1
    assert top_k_eff([4, 2], [4, 1]) == pytest.approx(1 / 6)


def test_batched_chars_needed_equals_the_per_sample_definition():
    rng = np.random.default_rng(0)
    n_context = rng.integers(0, 4, 500)
    word_len = rng.integers(1, 9, 500)
    hits = rng.random((500, 12)) < 0.15  # padded to the longest sample (3 + 8 positions) and beyond
    want = [typed_chars_needed(h, int(c), int(w)) for h, c, w in zip(hits, n_context, word_len)]
    np.testing.assert_array_equal(chars_needed(hits, n_context, word_len), want)
    assert {0, 1} <= set(want) and any(w == n for w, n in zip(want, word_len))  # every kind of case occurs


def test_unk_and_pad_are_never_suggested():
    logits = tf.constant([[[9.0, 8.0, 1.0, 2.0, 3.0]]])  # pad and unk score highest
    hit, _ = position_scores(logits, tf.constant([[2]]), tf.constant(3))
    assert bool(hit[0, 0])  # word 2 is third among real words
    hit, _ = position_scores(logits, tf.constant([[2]]), tf.constant(2))
    assert not bool(hit[0, 0])
    hit, _ = position_scores(logits, tf.constant([[1]]), tf.constant(3))
    assert not bool(hit[0, 0])  # an out-of-vocabulary word is never a hit


def test_evaluate_with_an_oracle_and_a_uniform_model():
    sents = [["to", "be", "or", "not", "to", "be"]]
    vocab = Vocabulary.from_sentences(sents, 8)
    samples = build_samples(sents, vocab, 3)

    def oracle(x, training=False):
        # predicts each position's true label: rebuild labels from the padded batch
        _, y = samples.padded(np.arange(len(samples)))
        return tf.one_hot(y[: x.shape[0], : x.shape[1]], vocab.size) * 20.0

    result = NextWordTask(k=1, eval_batch_size=len(samples)).evaluate(oracle, samples)
    # every word after the first is known before typing; the first needs one character
    assert result["top_k_eff"] == pytest.approx(1 - 1 / sum(map(len, sents[0])))

    uniform = NextWordTask(k=1).evaluate(lambda x, training=False: tf.zeros((*x.shape, vocab.size)), samples)
    assert uniform["perplexity"] == pytest.approx(vocab.size, rel=1e-5)
    assert uniform["top_k_eff"] == 0.0  # ties are not hits: a model that knows nothing saves nothing


def test_accuracy_and_auc_by_hand():
    assert accuracy([0, 1, 1], np.array([[2.0, 1.0], [0.0, 1.0], [1.0, 0.0]])) == pytest.approx(2 / 3)
    # positives scored 0.9 and 0.4, negatives 0.5 and 0.1: 3 of 4 pairs ordered right
    assert roc_auc([1, 0, 1, 0], [0.9, 0.5, 0.4, 0.1]) == pytest.approx(0.75)
    assert roc_auc([1, 0], [0.3, 0.3]) == pytest.approx(0.5)  # a tie counts half
    assert np.isnan(roc_auc([1, 1], [0.2, 0.3]))
    labels = np.array([[1, 0], [0, 0], [1, 1]])
    scores = np.array([[0.9, 0.1], [0.2, 0.0], [0.8, 0.7]])
    assert mean_auc(labels, scores) == pytest.approx(1.0)
