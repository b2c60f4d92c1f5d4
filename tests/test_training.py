import numpy as np

from ondevice.data.typing_samples import Vocabulary, build_samples, sentences
from ondevice.metrics import evaluate
from ondevice.models import lstm_lm
from ondevice.training.trainer import Trainer, seed_everything

TEXT = "To be, or not to be, that is the question. " * 20 + "Whether 'tis nobler in the mind to suffer. " * 20


def small_setup():
    seed_everything(0)
    sents = sentences(TEXT)
    vocab = Vocabulary.from_sentences(sents, 20)
    samples = build_samples(sents, vocab, 4)
    model = lstm_lm.build(vocab.input_size, vocab.size, 16, 24)
    return samples, model


def test_a_few_real_training_steps_lower_the_loss_and_raise_top_k_eff():
    samples, model = small_setup()
    before = evaluate(model, samples, k=3)
    history = Trainer(model, 0.01).fit(samples, epochs=4, batch_size=16, rng=np.random.default_rng(0))
    after = evaluate(model, samples, k=3)
    assert history[-1]["loss"] < history[0]["loss"]
    assert after["perplexity"] < before["perplexity"]
    assert after["top_k_eff"] > before["top_k_eff"]


def test_reset_restores_weights_and_clears_optimizer_state():
    samples, model = small_setup()
    start = [w.copy() for w in model.get_weights()]
    trainer = Trainer(model, 0.01)
    trainer.fit(samples, 1, 16, np.random.default_rng(0))
    assert any(not np.array_equal(a, b) for a, b in zip(start, model.get_weights()))
    trainer.reset(start)
    assert all(np.array_equal(a, b) for a, b in zip(start, model.get_weights()))
    assert all(not np.any(v.numpy()) for v in trainer.optimizer.variables)


def test_same_seed_same_numbers():
    results = []
    for _ in range(2):
        samples, model = small_setup()
        Trainer(model, 0.01).fit(samples, 1, 16, np.random.default_rng(0))
        results.append(evaluate(model, samples, k=3)["perplexity"])
    assert results[0] == results[1]
