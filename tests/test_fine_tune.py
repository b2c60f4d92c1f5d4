"""Fine-tune training: only the softmax layer's weights change, and the training step is cheaper."""

import numpy as np

from ondevice.data.typing_samples import Vocabulary, build_samples, sentences
from ondevice.device.energy.workload import step_flops
from ondevice.models import lstm_lm
from ondevice.tasks.next_word import NextWordTask
from ondevice.training.fine_tune import FineTune
from ondevice.training.trainer import Trainer, seed_everything

TEXT = "To be, or not to be, that is the question. " * 10 + "Whether 'tis nobler in the mind to suffer. " * 10


def setup():
    seed_everything(0)
    sents = sentences(TEXT)
    vocab = Vocabulary.from_sentences(sents, 20)
    return build_samples(sents, vocab, 4), lstm_lm.build(
        lstm_lm.LSTMConfig(vocab.input_size, vocab.size, 16, 24), seed=0
    )


def test_only_softmax_weights_change():
    samples, model = setup()
    start = {w.name: w.numpy().copy() for w in model.weights}
    trainer = Trainer(model, NextWordTask(), 0.01, hooks=[FineTune()])
    assert {v.name for v in trainer.variables_to_train} == {"softmax/kernel:0", "softmax/bias:0"}
    history = trainer.fit(samples, 1, 16, np.random.default_rng(0))
    assert history[0]["steps"] > 1
    changed = {w.name for w in model.weights if not np.array_equal(w.numpy(), start[w.name])}
    assert changed == {"softmax/kernel:0", "softmax/bias:0"}


def test_fine_tuning_counts_less_work_than_full_training():
    _, model = setup()
    full = step_flops(model, model.trainable_variables, tokens=100, loss_classes=20)
    tuned = step_flops(model, FineTune().trainable(model, model.trainable_variables), tokens=100, loss_classes=20)
    assert 0 < tuned < full
