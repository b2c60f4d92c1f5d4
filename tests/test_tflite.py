"""The Flex export's inference matches Keras and its save/restore signatures round-trip the weights
(its training against TensorFlow's: test_step_parity.py)."""

import numpy as np
import pytest

from numerics import assert_close_float32, lstm_terms
from ondevice.data.typing_samples import Vocabulary, build_samples, sentences
from ondevice.device import tflite
from ondevice.models import lstm_lm
from ondevice.tasks.next_word import NextWordTask
from ondevice.training.step import Step
from ondevice.training.trainer import seed_everything


@pytest.fixture(scope="module")
def next_word():
    seed_everything(0)
    sents = sentences("To be, or not to be, that is the question. Whether 'tis nobler in the mind to suffer. " * 5)
    vocab = Vocabulary.from_sentences(sents, 20)
    samples = build_samples(sents, vocab, 4)
    model = lstm_lm.build(lstm_lm.LSTMConfig(vocab.input_size, vocab.size, 8, 12), seed=0)
    # batches of different shapes: the exported signatures take any batch and sequence length
    batches = [samples.padded(np.arange(i, i + n)) for i, n in ((0, 4), (4, 3), (10, 5))]
    assert len({x.shape for x, _ in batches}) == 3
    return model, NextWordTask(), batches


def test_infer_matches_keras_and_save_restore_round_trips(next_word, tmp_path):
    model, task, batches = next_word
    flatbuffer = tflite.convert(Step(model, task, 0.01))
    trained = tflite.interpreter(flatbuffer)
    x = batches[1][0]
    # logits through TFLite's and TensorFlow's kernels: the LSTM chain, then 12 + 1 terms
    assert_close_float32(tflite.infer_on_device(trained, task, x), model(x).numpy(), lstm_terms(x.shape[1], 8, 12) + 13)
    tflite.train_on_device(trained, task, batches)
    after = tflite.infer_on_device(trained, task, x)
    assert not np.allclose(after, model(x).numpy())
    ckpt = str(tmp_path / "personal.ckpt")
    trained.get_signature_runner("save")(checkpoint_path=np.array(ckpt.encode()))
    fresh = tflite.interpreter(flatbuffer)
    fresh.get_signature_runner("restore")(checkpoint_path=np.array(ckpt.encode()))
    np.testing.assert_allclose(tflite.infer_on_device(fresh, task, x), after, atol=1e-6)
