"""Kneser-Ney n-gram baselines (DeepType Fig. 1b): proper distributions, a case computed by hand,
and suggestions that respect the typed prefix."""

import numpy as np
import pytest

from ondevice.data.typing_samples import PAD_ID, UNK_ID, Vocabulary, build_samples, sentences
from ondevice.models.ngram import KneserNey, PrefixFilter, chars_needed, histories

TEXT = (
    "The cat sat on the mat. Then the dog sat on the cat! The man then ran to the mat; "
    "a cat ran. The dog and the man sat. Then they ran on and on."
)


def ids(sents, vocab):
    return [[vocab.word_id(w) for w in s] for s in sents]


def test_hand_computed_bigram():
    # ids: 0 <pad>, 1 <unk>, 2 a, 3 b, 4 c; BOS = 5. Bigrams: (5,2) x2, (2,3), (2,4), (5,3).
    model = KneserNey.fit([[2, 3], [2, 4], [3]], order=2, vocab_size=5)
    # unigram continuation counts a:1 b:2 c:1, D1 = 2/(2+2*1) = 0.5, uniform 1/4 over ids 1..4
    unigram = np.array([0, 0.375, 0.875, 1.875, 0.875]) / 4
    # bigram raw counts, D2 = 3/(3+2*1) = 0.6
    after_a = np.array([0, 0, 0, 0.4, 0.4]) / 2 + 0.6 * 2 * unigram / 2
    after_bos = np.array([0, 0, 1.4, 0.4, 0]) / 3 + 0.6 * 2 * unigram / 3
    probs = model.probabilities(np.array([[2], [5], [4]]))
    np.testing.assert_allclose(probs[0], after_a)
    np.testing.assert_allclose(probs[0, 3], 0.48125)
    np.testing.assert_allclose(probs[1], after_bos)
    np.testing.assert_allclose(probs[2], unigram)  # c was never followed: back off entirely


@pytest.mark.parametrize("order", [1, 2, 3])
def test_probabilities_sum_to_one_over_the_vocabulary(order):
    sents = sentences(TEXT)
    vocab = Vocabulary.from_sentences(sents, 12)  # small: some words become <unk>
    model = KneserNey.fit(ids(sents, vocab), order, vocab.size)
    bos, the, cat = vocab.size, vocab.word_id("the"), vocab.word_id("cat")
    contexts = np.array([[bos, bos], [bos, the], [the, cat], [cat, the], [UNK_ID, UNK_ID], [cat, cat]])
    probs = model.probabilities(contexts)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-12)
    assert np.all(probs[:, PAD_ID] == 0) and np.all(probs[:, 1:] > 0)
    if order > 1:  # a seen context changes the distribution
        assert not np.allclose(probs[1], probs[4])


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="<pad>"):
        KneserNey.fit([[2, 0]], 2, 5)
    with pytest.raises(ValueError, match="previous words"):
        KneserNey.fit([[2, 3]], 3, 5).probabilities(np.array([[2]]))


def test_prefix_filtering_never_suggests_an_inconsistent_word():
    sents = sentences(TEXT)
    vocab = Vocabulary.from_sentences(sents, 30)
    model = KneserNey.fit(ids(sents, vocab), 2, vocab.size)
    filt = PrefixFilter(vocab)
    probs = model.probabilities(np.array([[vocab.size], [vocab.word_id("the")]]))
    for p in probs:
        for prefix in ("", "t", "th", "the", "then", "ca", "m", "x", "an"):
            shown = [w for w in vocab.words[2:] if w.startswith(prefix)]
            got = filt.suggest(p, prefix, 3)
            assert all(w.startswith(prefix) for w in got), (prefix, got)
            assert len(got) == min(3, len(shown)) and UNK_ID not in got
            best = sorted(shown, key=lambda w: -p[vocab.word_id(w)])[:3]
            assert {p[vocab.word_id(w)] for w in got} == {p[vocab.word_id(w)] for w in best}
        assert len(filt.suggest(p, "t", 3, filtered=False)) == 3


def test_chars_needed_by_hand():
    # unigram counts the 4, then 3, them 2, cat 1: P(the) > P(then) > P(them) > P(cat)
    train = [["the"]] * 4 + [["then"]] * 3 + [["them"]] * 2 + [["cat"]]
    vocab = Vocabulary.from_sentences(train, 6)
    model = KneserNey.fit(ids(train, vocab), 1, vocab.size)
    filt = PrefixFilter(vocab)
    test = build_samples([["cat", "them"], ["cat", "then"], ["cat", "dog"]], vocab, 4)
    # samples: cat (no previous word: first suggestion after 1 character), them, cat, then, cat, dog (<unk>)
    cases = {
        (1, True): [1, 4, 1, 4, 1, 3],  # top-1 with the prefix: 'them'/'then' only once fully typed
        (2, True): [1, 4, 1, 0, 1, 3],  # top-2 is {the, then} before any character
        (1, False): [3, 4, 3, 4, 3, 3],  # without the prefix the top-1 is always 'the'
        (3, False): [3, 0, 3, 0, 3, 3],  # {the, then, them}; cat and the unknown dog are never shown
    }
    for (k, filtered), expected in cases.items():
        needed, log_prob = chars_needed(model, test, filt, k, filtered)
        assert needed.tolist() == expected, (k, filtered)
    np.testing.assert_allclose(np.exp(log_prob[1]), model.probabilities(np.zeros((1, 0)))[0, vocab.word_id("them")])


def test_histories_are_the_previous_words_bos_padded():
    sents = [["the", "cat", "sat", "on", "the", "mat"]]
    vocab = Vocabulary.from_sentences(sents, 10)
    samples = build_samples(sents, vocab, 4)
    hist = histories(samples, 2, vocab.size)
    w = vocab.word_id
    assert hist.tolist()[:3] == [[vocab.size, vocab.size], [vocab.size, w("the")], [w("the"), w("cat")]]
    assert hist.tolist()[5] == [w("on"), w("the")]
