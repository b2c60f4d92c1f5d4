"""The Trainer: real TensorFlow steps on a tiny next-word model and a tiny classifier, with hooks."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from ondevice.data.typing_samples import Vocabulary, build_samples, sentences
from ondevice.models import lstm_lm
from ondevice.tasks.classification import ClassificationTask
from ondevice.tasks.next_word import NextWordTask
from ondevice.training.step import Hook
from ondevice.training.trainer import StepTimer, Trainer, seed_everything

TEXT = "To be, or not to be, that is the question. " * 20 + "Whether 'tis nobler in the mind to suffer. " * 20


def small_setup(seed=0):
    seed_everything(0)
    sents = sentences(TEXT)
    vocab = Vocabulary.from_sentences(sents, 20)
    samples = build_samples(sents, vocab, 4)
    model = lstm_lm.build(lstm_lm.LSTMConfig(vocab.input_size, vocab.size, 16, 24), seed=seed)
    return samples, model


def test_a_few_real_training_steps_lower_the_loss_and_raise_top_k_eff():
    samples, model = small_setup()
    task = NextWordTask(k=3)
    before = task.evaluate(model, samples)
    history = Trainer(model, task, 0.01).fit(samples, epochs=4, batch_size=16, rng=np.random.default_rng(0))
    after = task.evaluate(model, samples)
    assert history[-1]["loss"] < history[0]["loss"]
    assert after["perplexity"] < before["perplexity"]
    assert after["top_k_eff"] > before["top_k_eff"]
    assert history[-1]["steady_step_seconds"] > 0


def test_reset_restores_weights_and_clears_optimizer_state():
    samples, model = small_setup()
    start = [w.copy() for w in model.get_weights()]
    trainer = Trainer(model, NextWordTask(), 0.01)
    trainer.fit(samples, 1, 16, np.random.default_rng(0))
    assert any(not np.array_equal(a, b) for a, b in zip(start, model.get_weights()))
    trainer.reset(start)
    assert all(np.array_equal(a, b) for a, b in zip(start, model.get_weights()))
    assert all(not np.any(v.numpy()) for v in trainer.optimizer.variables)


def test_same_seed_same_numbers_and_model_seed_decides_initial_weights():
    results = []
    for _ in range(2):
        samples, model = small_setup()
        Trainer(model, NextWordTask(), 0.01).fit(samples, 1, 16, np.random.default_rng(0))
        results.append(NextWordTask().evaluate(model, samples)["perplexity"])
    assert results[0] == results[1]
    a, b = small_setup(seed=1)[1], small_setup(seed=2)[1]
    assert not np.array_equal(a.get_weights()[0], b.get_weights()[0])
    assert np.array_equal(a.get_weights()[0], small_setup(seed=1)[1].get_weights()[0])


class FreezeAllBut(Hook):
    """Train only the named layer (what fine-tuning and layer freezing do)."""

    def __init__(self, layer):
        self.layer = layer

    def trainable(self, model, variables):
        keep = {id(v) for v in model.get_layer(self.layer).trainable_variables}
        return [v for v in variables if id(v) in keep]


def test_trainable_hook_freezes_everything_else():
    samples, model = small_setup()
    start = {w.name: w.numpy().copy() for w in model.weights}
    Trainer(model, NextWordTask(), 0.01, hooks=[FreezeAllBut("softmax")]).fit(samples, 1, 16, np.random.default_rng(0))
    changed = {w.name for w in model.weights if not np.array_equal(w.numpy(), start[w.name])}
    assert changed and all(name.startswith("softmax") for name in changed)


def test_gradient_hook_and_batch_source_hook_are_used():
    samples, model = small_setup()

    class ZeroEmbeddingGradient(Hook):
        def gradients(self, grads, variables):
            return [tf.zeros_like(g) if "embedding" in v.name else g for g, v in zip(grads, variables)]

    class FirstThreeBatches(Hook):
        def batches(self, task, data, batch_size, rng):
            return list(task.batches(data, batch_size, None))[:3]

    embedding = model.get_layer("embedding").get_weights()[0].copy()
    history = Trainer(model, NextWordTask(), 0.01, hooks=[ZeroEmbeddingGradient(), FirstThreeBatches()]).fit(
        samples, 1, 16, np.random.default_rng(0)
    )
    assert history[0]["steps"] == 3
    # Adam with zero gradients leaves the variable where it was
    np.testing.assert_array_equal(model.get_layer("embedding").get_weights()[0], embedding)


def test_extra_loss_hook_enters_the_gradient():
    def final_softmax_norm(hooks):
        samples, model = small_setup()
        Trainer(model, NextWordTask(), 0.01, optimizer="sgd", hooks=hooks).fit(samples, 1, 16, np.random.default_rng(0))
        return float(np.linalg.norm(model.get_layer("softmax").get_weights()[0]))

    class SmallLogits(Hook):
        def extra_loss(self, inputs, labels, outputs):
            return 5.0 * tf.reduce_mean(tf.square(outputs))

    assert final_softmax_norm([SmallLogits()]) < final_softmax_norm([])


def test_step_timer_excludes_warm_up():
    timer = StepTimer(warmup=2)
    assert np.isnan(timer.steady())
    for s in (5.0, 3.0, 0.1, 0.3, 0.2):
        timer.add(s)
    assert timer.steady() == pytest.approx(0.2)


def test_classification_tasks_train_and_score():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 6)).astype("float32")
    y = (x[:, 0] + x[:, 1] > 0).astype("int32")
    task = ClassificationTask((6,), 2)
    seed_everything(0)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(2)])
    before = task.evaluate(model, (x, y))["accuracy"]
    Trainer(model, task, 0.05).fit((x, y), 5, 32, rng)
    assert task.evaluate(model, (x, y))["accuracy"] > max(before, 0.9)

    multi = ClassificationTask((6,), 3, multi_label=True)
    labels = np.stack([x[:, 0] > 0, x[:, 1] > 0, x[:, 2] > 0], axis=1).astype("float32")
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
    Trainer(model, multi, 0.05).fit((x, labels), 5, 32, rng)
    assert multi.evaluate(model, (x, labels))["auc"] > 0.95


def test_unknown_optimizer_and_nothing_to_train_are_errors():
    samples, model = small_setup()
    with pytest.raises(ValueError, match="optimizer"):
        Trainer(model, NextWordTask(), 0.01, optimizer="adagrad")

    class FreezeAll(Hook):
        def trainable(self, model, variables):
            return []

    with pytest.raises(ValueError, match="no variable"):
        Trainer(model, NextWordTask(), 0.01, hooks=[FreezeAll()])


def test_per_sample_loss_is_the_per_position_loss_times_positions_per_sample():
    """PTB's loss (summed over a sample's positions, mean over samples) against ours (mean over positions)."""
    samples, model = small_setup()
    x, y = samples.padded(np.arange(8))
    logits = model(x, training=False)
    per_position = float(NextWordTask().loss(y, logits))
    per_sample = float(NextWordTask(loss_per="sample").loss(y, logits))
    # one code path: the same masked sum of the same logits, divided by a count or by len(y) (an ulp or two)
    assert per_sample == pytest.approx(per_position * (y != 0).sum() / len(y), rel=1e-5)
    with pytest.raises(ValueError, match="loss_per"):
        NextWordTask(loss_per="token")


def test_clipping_bounds_the_update_and_the_schedule_sets_each_epochs_rate():
    """SGD with clip_norm c moves the weights by at most lr * c per step; the schedule's rate is
    the optimizer's during its epoch, recorded per epoch, and `reset` restores the base rate."""
    samples, model = small_setup()
    start = [w.copy() for w in model.get_weights()]
    trainer = Trainer(model, NextWordTask(loss_per="sample"), 1.0, "sgd", clip_norm=0.01)
    trainer.step(*samples.padded(np.arange(16)))
    moved = np.sqrt(sum(float(np.sum((a - b) ** 2)) for a, b in zip(start, model.get_weights())))
    assert 0 < moved <= 0.01 * (1 + 1e-3)  # float32 rounding of the moved weights
    trainer.reset(start)
    history = trainer.fit(samples, 3, 16, np.random.default_rng(0), schedule=lambda epoch: 0.5**epoch)
    assert [h["learning_rate"] for h in history] == [0.5, 0.25, 0.125]
    assert float(trainer.optimizer.learning_rate.numpy()) == 0.125
    trainer.reset(start)
    assert float(trainer.optimizer.learning_rate.numpy()) == 1.0
    with pytest.raises(ValueError, match="clip_norm"):
        Trainer(model, NextWordTask(), 0.01, clip_norm=-1.0)


def test_even_batches_train_every_example_once_in_batches_that_differ_by_at_most_one():
    """No short remainder batch (what batch statistics would normalise by), nothing left out."""
    from ondevice.training.even_batches import EvenBatches

    x, y = np.arange(140, dtype=np.float32)[:, None], np.arange(140)
    batches = EvenBatches().batches(None, (x, y), 32, np.random.default_rng(0))
    sizes = [len(b[1]) for b in batches]
    assert len(batches) == 5 and max(sizes) - min(sizes) <= 1 and sum(sizes) == 140  # not 4 x 32 + 12
    assert sorted(np.concatenate([b[1] for b in batches])) == list(range(140))
    assert all(np.array_equal(bx[:, 0], by) for bx, by in batches)  # inputs stay with their labels
    small = EvenBatches().batches(None, (x[:7], y[:7]), 32, np.random.default_rng(0))
    assert [len(b[1]) for b in small] == [7]
