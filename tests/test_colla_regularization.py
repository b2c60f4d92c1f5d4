"""Colla's M-RNN regularization (techniques/regularization.py): feature dropout keeps the plain
model's weights and inference, drops whole non-place features per sample in training; weight decay
adds exactly its term and shrinks the weights a real training run leaves."""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from ondevice.models import mrnn
from ondevice.papers.colla.techniques import regularization
from ondevice.tasks.classification import ClassificationTask
from ondevice.training.trainer import Trainer

CONFIG = mrnn.MRNNConfig(locations=12, outputs=12, embedding_dim=4, hidden_units=8, history=3)
SLOTS = mrnn.MRNNConfig(locations=12, outputs=6, embedding_dim=4, hidden_units=8, history=3, slots=True)


def samples(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    highs = [CONFIG.locations, 24, 60, 7, 144, 144]
    return np.stack([rng.integers(1, h, (n, CONFIG.history)) for h in highs], axis=-1).astype(np.int32)


@pytest.mark.parametrize("config", [CONFIG, SLOTS], ids=["cloud", "slots"])
def test_feature_dropout_keeps_the_plain_models_weights_and_inference(config):
    plain, dropped = mrnn.build(config, 3), regularization.build(config, 3, 0.5)
    assert [(w.name, w.shape) for w in plain.weights] == [(w.name, w.shape) for w in dropped.weights]
    for a, b in zip(plain.get_weights(), dropped.get_weights()):
        np.testing.assert_array_equal(a, b)
    x = samples(16)
    np.testing.assert_allclose(plain(x, training=False), dropped(x, training=False), rtol=1e-6)
    assert not np.allclose(plain(x, training=False), dropped(x, training=True))
    assert regularization.build(config, 3, 0.0).count_params() == plain.count_params()


def test_feature_dropout_drops_whole_time_features_per_sample_never_the_place():
    model = regularization.build(CONFIG, 0, 0.5)
    features = keras.Model(model.input, model.get_layer("feature_dropout").output)
    plain = keras.Model(model.input, model.get_layer("features").input)  # the six embeddings, undropped
    x = samples(200)
    got, want = features(x, training=True).numpy(), [e.numpy() for e in plain(x, training=False)]
    d = CONFIG.embedding_dim
    np.testing.assert_array_equal(got[..., :d], want[0])  # the place: never dropped
    kept = []
    for i in range(1, 6):
        block = got[..., i * d : (i + 1) * d]
        zero = np.all(block == 0, axis=(1, 2))
        np.testing.assert_allclose(block[~zero], 2 * want[i][~zero], rtol=1e-6)  # kept: scaled by 1 / (1 - 0.5)
        kept.append(1 - zero.mean())
    assert 0.35 < np.mean(kept) < 0.65


def test_weight_decay_adds_its_term_and_shrinks_what_training_leaves():
    x, y = samples(64), np.random.default_rng(1).integers(0, CONFIG.outputs, 64)
    task = ClassificationTask((CONFIG.history, 6), CONFIG.outputs, input_dtype=tf.int32)
    norms = {}
    for decay in (0.0, 0.05):
        model = mrnn.build(CONFIG, 0)
        hook = regularization.WeightDecay(model, decay)
        expected = decay * sum(float(np.sum(w.numpy() ** 2)) for w in model.trainable_weights if "bias" not in w.name)
        assert float(hook.extra_loss(None, None, None)) == pytest.approx(expected, rel=1e-5)
        Trainer(model, task, 0.01, hooks=[hook] if decay else []).fit((x, y), 5, 16, np.random.default_rng(0))
        norms[decay] = sum(float(np.sum(w**2)) for w in model.get_weights()[:-2])
    assert norms[0.05] < norms[0.0]
    with pytest.raises(ValueError, match="weight decay"):
        regularization.WeightDecay(mrnn.build(CONFIG, 0), -1.0)
    with pytest.raises(ValueError, match="feature dropout"):
        regularization.build(CONFIG, 0, 1.0)
