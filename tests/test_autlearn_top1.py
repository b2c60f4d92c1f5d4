"""`common.top1_text` runs the softmax at one position per sample; it must count the same hits as
the full forward pass, read at that position (the definition it replaces)."""

import gc
import weakref

import numpy as np
import tensorflow as tf
import tf_keras as keras

from ondevice.data.typing_samples import UNK_ID, Vocabulary, build_samples
from ondevice.models import lstm_lm
from ondevice.papers.autlearn import common
from ondevice.tasks.next_word import position_scores


def full_forward_top1(model, samples) -> float:
    with_context = np.flatnonzero(samples.n_context > 0)
    x, y = samples.padded(with_context)
    hit, _ = position_scores(model(x, training=False), tf.constant(y), tf.constant(1))
    return float(hit.numpy()[np.arange(len(with_context)), samples.n_context[with_context] - 1].mean())


def low_rank_head(model, rank: int) -> keras.Model:
    """The model with its softmax replaced by two Dense layers (as an SVD-compressed head)."""
    x = model.get_layer("lstm_2").output
    x = keras.layers.Dense(rank, use_bias=False, name="softmax_u")(x)
    return keras.Model(model.inputs, keras.layers.Dense(model.output_shape[-1], name="softmax_v")(x))


def sharing_layers(model) -> keras.Model:
    """A second model made of the same layers (as a pruned copy keeps the layers it does not cut)."""
    x = tokens = keras.Input((None,), dtype="int32")
    for layer in model.layers[1:]:
        x = layer(x)
    return keras.Model(tokens, x)


def test_top1_at_one_position_matches_the_full_forward_pass():
    rng = np.random.default_rng(0)
    words = ["".join(rng.choice(list("abcdefgh"), 3)) for _ in range(40)]
    sents = [list(rng.choice(words, rng.integers(2, 9))) for _ in range(60)]
    vocab = Vocabulary.from_sentences(sents, 25)  # some words are <unk>: never a hit
    samples = build_samples(sents, vocab, 4)
    x, y = samples.padded(np.arange(len(samples)))
    with_context = samples.n_context > 0
    assert (y[np.arange(len(samples)), samples.n_context - 1][with_context] == UNK_ID).any()
    model = lstm_lm.build(lstm_lm.LSTMConfig(vocab.input_size, vocab.size, 8, 12, 2), seed=1)
    for m in (model, low_rank_head(model, 4)):
        # trained a little, so the predictions are not uniform and hits happen
        m.compile(keras.optimizers.Adam(0.05), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        m.fit(x, y, epochs=8, batch_size=64, verbose=0)
        expected = full_forward_top1(m, samples)
        assert 0 < expected < 1, expected
        assert common.top1_text(m, samples, batch_size=37) == expected
        assert common.top1_text(sharing_layers(m), samples) == expected
        # its parts are kept per model (traced once), and not past the model's life
        assert common._last_position_parts(m) is common._last_position_parts(m)
    gone = weakref.ref(model)
    del model, m
    gc.collect()
    assert gone() is None
