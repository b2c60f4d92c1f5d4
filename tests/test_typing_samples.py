import numpy as np
import pytest

from ondevice.data.typing_samples import CHARS, PAD_ID, UNK_ID, Vocabulary, batch_indices, build_samples, sentences


def decode(vocab, ids):
    return [vocab.words[i] if i < vocab.size else "c:" + CHARS[i - vocab.size] for i in ids]


def test_sentences_lowercase_and_split_on_punctuation():
    assert sentences("Health is priceless! Is't not? Ay; 'tis.") == [
        ["health", "is", "priceless"],
        ["is't", "not"],
        ["ay"],
        ["tis"],
    ]


def test_paper_example_health_is_priceless():
    """DeepType Sec. 2: "is" -> [health, i, s] / [is]*3; "priceless" -> 11 steps, labels [is, priceless x10]."""
    sents = [["health", "is", "priceless"]]
    vocab = Vocabulary.from_sentences(sents, 10)
    s = build_samples(sents, vocab, context_words=10)
    assert len(s) == 3
    a, b = s.offsets[1], s.offsets[2]
    assert decode(vocab, s.inputs[a:b]) == ["health", "c:i", "c:s"]
    assert decode(vocab, s.labels[a:b]) == ["is", "is", "is"]
    a, b = s.offsets[2], s.offsets[3]
    assert b - a == 11
    assert decode(vocab, s.inputs[a:b]) == ["health", "is"] + [f"c:{c}" for c in "priceless"]
    assert decode(vocab, s.labels[a:b]) == ["is"] + ["priceless"] * 10
    # the first word of a sentence has no previous words: only its characters
    assert decode(vocab, s.inputs[: s.offsets[1]]) == [f"c:{c}" for c in "health"]
    assert list(s.n_context) == [0, 1, 2] and list(s.word_len) == [6, 2, 9]


def test_context_is_capped_and_oov_words_become_unk():
    sents = [["a", "b", "c", "d", "zebra"]]
    vocab = Vocabulary.from_sentences([["a", "b", "c", "d"]], 6)
    s = build_samples(sents, vocab, context_words=2)
    last = s.inputs[s.offsets[4] : s.offsets[5]]
    assert decode(vocab, last[:2]) == ["c", "d"]
    assert s.target[4] == UNK_ID and s.labels[s.offsets[5] - 1] == UNK_ID


def test_vocabulary_keeps_most_frequent_words_and_rejects_tiny_sizes():
    vocab = Vocabulary.from_sentences([["b", "a", "a", "c", "c", "c"]], 4)
    assert vocab.words == ("<pad>", "<unk>", "c", "a")
    assert vocab.input_size == 4 + len(CHARS)
    with pytest.raises(ValueError, match="vocab_size"):
        Vocabulary.from_sentences([["a"]], 2)


def test_padding_is_on_the_right_with_pad_labels():
    sents = [["to", "be", "or", "not"]]
    s = build_samples(sents, Vocabulary.from_sentences(sents, 10), 3)
    x, y = s.padded(np.array([0, 3]))
    assert x.shape == (2, 6)  # "not" after 3 words: 3 + 3 steps
    assert list(x[0, 2:]) == [0] * 4 and list(y[0, 2:]) == [PAD_ID] * 4
    for row, j in enumerate([0, 3]):  # the real positions are the sample's, in order
        a, b = s.offsets[j], s.offsets[j + 1]
        assert list(x[row, : b - a]) == list(s.inputs[a:b]) and list(y[row, : b - a]) == list(s.labels[a:b])
    assert x.dtype == y.dtype == np.int32


def test_batches_cover_every_sample_once_and_group_similar_lengths():
    sents = [["w"] * n for n in range(1, 30)]
    s = build_samples(sents, Vocabulary.from_sentences(sents, 5), 8)
    batches = batch_indices(s, 16, np.random.default_rng(0))
    assert sorted(np.concatenate(batches)) == list(range(len(s)))
    spread = np.mean([np.ptp(s.lengths[b]) for b in batches])
    assert spread < np.ptp(s.lengths)
