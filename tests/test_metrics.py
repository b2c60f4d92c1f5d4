import numpy as np
import pytest
import tensorflow as tf

from ondevice.data.typing_samples import Vocabulary, build_samples
from ondevice.metrics import _position_scores, evaluate, top_k_eff, typed_chars_needed


def test_paper_worked_example_priceless():
    """Sec. 3.2: after "p" the top-3 misses "priceless", after "pr" it is shown, so R = 2."""
    shown = {0: ["is", "health", "priority"], 1: ["priority", "paramount", "precious"],
             2: ["priority", "precious", "priceless"]}
    n_context, length = 2, len("priceless")
    hits = np.zeros(n_context + length, bool)
    for typed, top3 in shown.items():
        hits[n_context - 1 + typed] = "priceless" in top3
    hits[n_context - 1 + 3:] = True
    r = typed_chars_needed(hits, n_context, length)
    assert r == 2
    assert top_k_eff([length], [r]) == pytest.approx(7 / 9)


def test_word_never_suggested_costs_all_its_characters_and_first_words_start_at_one():
    assert typed_chars_needed(np.zeros(5, bool), 1, 4) == 4
    # no previous words: position 0 is after one typed character
    assert typed_chars_needed(np.array([True, True]), 0, 2) == 1
    assert top_k_eff([4, 2], [4, 1]) == pytest.approx(1 / 6)


def test_unk_and_pad_are_never_suggested():
    logits = tf.constant([[[9.0, 8.0, 1.0, 2.0, 3.0]]])  # pad and unk score highest
    hit, _ = _position_scores(logits, tf.constant([[2]]), tf.constant(3))
    assert bool(hit[0, 0])  # word 2 is third among real words
    hit, _ = _position_scores(logits, tf.constant([[2]]), tf.constant(2))
    assert not bool(hit[0, 0])
    hit, _ = _position_scores(logits, tf.constant([[1]]), tf.constant(3))
    assert not bool(hit[0, 0])  # an out-of-vocabulary word is never a hit


def test_evaluate_with_an_oracle_and_a_uniform_model():
    sents = [["to", "be", "or", "not", "to", "be"]]
    vocab = Vocabulary.from_sentences(sents, 8)
    samples = build_samples(sents, vocab, 3)

    def oracle(x, training=False):
        # predicts each position's true label: rebuild labels from the padded batch
        _, y = samples.padded(np.arange(len(samples)))
        return tf.one_hot(y[: x.shape[0], : x.shape[1]], vocab.size) * 20.0

    result = evaluate(oracle, samples, k=1, batch_size=len(samples))
    # every word after the first is known before typing; the first needs one character
    assert result["top_k_eff"] == pytest.approx(1 - 1 / sum(map(len, sents[0])))

    uniform = evaluate(lambda x, training=False: tf.zeros((*x.shape, vocab.size)), samples, k=1)
    assert uniform["perplexity"] == pytest.approx(vocab.size, rel=1e-5)
    assert uniform["top_k_eff"] == 0.0  # ties are not hits: a model that knows nothing saves nothing
