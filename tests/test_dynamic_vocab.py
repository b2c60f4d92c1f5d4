"""Dynamic vocabulary (DeepType Sec. 4): which ids are swapped, what the samples become, and that
a swapped-in word, out of reach before, becomes predictable after real personal training that
starts from the reused embedding and softmax rows."""

import types

import numpy as np
import pytest

from ondevice.data.typing_samples import UNK_ID, Vocabulary, build_samples, sentences
from ondevice.metrics import top_k_eff
from ondevice.models import lstm_lm
from ondevice.papers.deeptype.protocol import personalize
from ondevice.papers.deeptype.techniques import dynamic_vocab as dv
from ondevice.tasks.next_word import NextWordTask
from ondevice.training.trainer import Trainer

# crowd counts: the 6, king 5, queen 4, sword 3, crown 2, ghost 1 (ids 2..7 in that order)
CROWD = [["the"] * 6, ["king"] * 5, ["queen"] * 4, ["sword"] * 3, ["crown"] * 2, ["ghost"]]
# the user: yorick 3 times, alas twice, poor once (below a threshold of 2); king once, the twice
USER = [["alas", "poor", "yorick"], ["yorick", "the", "king"], ["alas", "yorick", "the"]]


@pytest.fixture(scope="module")
def vocab():
    return Vocabulary.from_sentences(CROWD, 8)


def test_frequent_new_words_replace_the_least_frequent_never_used_global_words(vocab):
    swap = dv.swap(vocab, USER, min_count=2)
    assert swap.added == ("yorick", "alas") and swap.counts == (3, 2)
    # never used by the user: queen, sword, crown, ghost; least frequent (highest id) first
    assert swap.replaced == ("ghost", "crown")
    assert swap.ids == (vocab.word_id("ghost"), vocab.word_id("crown")) == (7, 6)
    assert swap.vocab.words[7] == "yorick" and swap.vocab.words[6] == "alas"
    # everything else is untouched: same size, same ids, words the user typed once kept
    assert swap.vocab.size == vocab.size and swap.vocab.input_size == vocab.input_size
    assert [w for i, w in enumerate(swap.vocab.words) if i not in swap.ids] == [
        w for i, w in enumerate(vocab.words) if i not in swap.ids
    ]
    assert swap.vocab.word_id("king") == vocab.word_id("king")
    # below the threshold: still out of vocabulary
    assert swap.vocab.word_id("poor") == UNK_ID
    assert dv.swap(vocab, USER, min_count=1).added == ("yorick", "alas", "poor")
    assert dv.swap(vocab, USER, min_count=4).size == 0
    with pytest.raises(ValueError, match="min_count"):
        dv.swap(vocab, USER, min_count=0)


def test_more_new_words_than_free_ids_keeps_the_most_frequent(vocab):
    small = Vocabulary.from_sentences(CROWD, 4)  # <pad>, <unk>, the, king: both used by the user
    assert dv.swap(small, USER, 1).size == 0
    one_free = Vocabulary(("<pad>", "<unk>", "the", "ghost"))
    swap = dv.swap(one_free, USER, 1)
    assert swap.added == ("yorick",) and swap.ids == (3,) and swap.replaced == ("ghost",)


def test_samples_of_new_words_get_the_reused_ids(vocab):
    swap = dv.swap(vocab, USER, min_count=2)
    before, after = build_samples(USER, vocab, 3), build_samples(USER, swap.vocab, 3)
    words = [w for s in USER for w in s]
    for word, old, new in zip(words, before.target, after.target):
        assert old == (UNK_ID if word in ("yorick", "alas", "poor") else vocab.word_id(word))
        assert new == {"yorick": 7, "alas": 6}.get(word, vocab.word_id(word))
    # as context the new words carry their ids too; characters keep theirs; lengths are equal
    assert np.array_equal(before.offsets, after.offsets) and np.array_equal(before.word_len, after.word_len)
    changed = before.inputs != after.inputs
    assert set(after.inputs[changed]) == {6, 7} and set(before.inputs[changed]) == {UNK_ID}


def _trained(vocab, sents, seed=0, lr=0.03, epochs=40):
    """A tiny LSTM trained on `sents` encoded with `vocab`, from fixed initial weights."""
    model = lstm_lm.build(lstm_lm.LSTMConfig(vocab.input_size, vocab.size, 16, 24), seed=seed)
    start = model.get_weights()
    trainer = Trainer(model, NextWordTask(3), lr, "adam")
    fields = types.SimpleNamespace(personal_epochs=epochs, personal_batch_size=8)
    personalize(trainer, start, build_samples(sents, vocab, 3), fields, np.random.default_rng(seed))
    return model, start


def test_an_out_of_vocabulary_word_becomes_predictable_after_the_swap():
    crowd = sentences(
        "the king is dead. the queen is here. alas the king. poor queen. a sword and a crown. "
        "the ghost walks. my lord the king. the queen and the king. a crown for the king."
    )
    vocab = Vocabulary.from_sentences(crowd, 24)
    assert vocab.word_id("yorick") == UNK_ID and vocab.word_id("alas") != UNK_ID != vocab.word_id("poor")
    user = sentences("alas poor yorick. " * 12 + "the king is dead. my lord the queen.")
    swap = dv.swap(vocab, user, min_count=2)
    assert swap.added == ("yorick",)
    test = sentences("alas poor yorick.")
    task = NextWordTask(3)
    scores = {}
    for name, v in (("global", vocab), ("dynamic", swap.vocab)):
        model, _ = _trained(v, user)
        samples = build_samples(test, v, 3)
        needed = task.evaluate(model, samples)["chars_needed"]
        scores[name] = top_k_eff(samples.word_len[2:], needed[2:])  # the sample of "yorick"
    assert scores["global"] == 0.0  # <unk> is never suggested: every character must be typed
    assert scores["dynamic"] > 0.5


def test_personal_training_starts_from_the_replaced_words_rows(vocab):
    """The new word's embedding row and softmax column are the replaced word's, moved by training,
    not re-initialised: after a few small steps they are still nearly the old ones."""
    swap = dv.swap(vocab, USER, min_count=2)
    model, start = _trained(swap.vocab, USER, seed=1, lr=1e-3, epochs=2)
    emb_old, emb_new = start[0], model.get_layer("embedding").get_weights()[0]
    ker_old, ker_new = start[-2], model.get_layer("softmax").get_weights()[0]
    cos = lambda a, b: float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))
    for i in swap.ids:
        assert not np.array_equal(emb_old[i], emb_new[i]) and not np.array_equal(ker_old[:, i], ker_new[:, i])
        assert cos(emb_old[i], emb_new[i]) > 0.95 and cos(ker_old[:, i], ker_new[:, i]) > 0.95
