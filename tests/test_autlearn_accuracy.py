"""AutLearn A1/A2: FedAvg against the pooled gradient step, and the experiment's parameters."""

import numpy as np
import pytest
import tf_keras as keras

from ondevice.papers.autlearn.experiments import autlearn_accuracy as exp
from ondevice.papers.autlearn.techniques.fedavg import average, fedavg
from ondevice.params import ParameterError
from ondevice.tasks.classification import ClassificationTask
from ondevice.training.trainer import Trainer


def _model():
    inputs = keras.Input((5,))
    hidden = keras.layers.Dense(6, activation="tanh", kernel_initializer=keras.initializers.GlorotUniform(seed=1))(
        inputs
    )
    return keras.Model(
        inputs, keras.layers.Dense(3, kernel_initializer=keras.initializers.GlorotUniform(seed=2))(hidden)
    )


def _clients(sizes):
    rng = np.random.default_rng(0)
    return {
        f"c{i}": (rng.normal(size=(n, 5)).astype(np.float32), rng.integers(0, 3, n).astype(np.int32))
        for i, n in enumerate(sizes)
    }


def _fedavg_and_pooled(sizes, local_epochs=1, batch_size=None):
    clients = _clients(sizes)
    task = ClassificationTask((5,), 3)
    model = _model()
    start = model.get_weights()
    trainer = Trainer(model, task, 0.5, "sgd")
    fed, history = fedavg(
        trainer,
        start,
        clients,
        rounds=1,
        clients_per_round=len(clients),
        local_epochs=local_epochs,
        batch_size=batch_size or max(sizes),
        seed=0,
    )
    assert history[0]["clients"] == len(clients) and history[0]["examples"] == sum(sizes)
    x = np.concatenate([c[0] for c in clients.values()])
    y = np.concatenate([c[1] for c in clients.values()])
    trainer.reset(start)
    trainer.step(x, y)  # one full-batch gradient step on the pooled data
    return fed, model.get_weights(), start


def test_fedavg_with_all_clients_and_one_full_batch_step_is_one_pooled_gradient_step():
    fed, pooled, start = _fedavg_and_pooled([8, 8, 8, 8])
    assert not all(np.allclose(a, b) for a, b in zip(fed, start))  # it did train
    for a, b in zip(fed, pooled):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_fedavg_differs_from_the_pooled_step_with_several_local_steps():
    fed, pooled, _ = _fedavg_and_pooled([8, 8, 8, 8], local_epochs=3)
    assert max(float(np.abs(a - b).max()) for a, b in zip(fed, pooled)) > 1e-3


def test_fedavg_weights_clients_by_their_examples():
    a, b = [np.array([0.0, 2.0])], [np.array([4.0, 6.0])]
    np.testing.assert_allclose(average([a, b], [3, 1])[0], [1.0, 3.0])
    with pytest.raises(ValueError, match="clients_per_round"):
        model = _model()
        fedavg(
            Trainer(model, ClassificationTask((5,), 3), 0.1, "sgd"),
            model.get_weights(),
            _clients([4, 4]),
            rounds=1,
            clients_per_round=3,
            local_epochs=1,
            batch_size=4,
            seed=0,
        )


def test_paper_claims_follow_the_papers_direction():
    changes = {e.claim: e for e in exp.PAPER.effects}
    values = {n.quantity: n.value for n in exp.PAPER.numbers}
    for claim, effect in changes.items():
        assert values[effect.better] > values[effect.worse], claim  # every paper change is positive
    assert {c for c, *_ in exp.ORDERINGS} == {
        f"CloudCustomize beats {m} ({k})" for m in (exp.AUT, exp.CLOUD, exp.FED) for k in ("LSTM", "MobileNet")
    }


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("fedavg_clients", 0, "at least 1"),
        ("cloud_init", "imagenet", "'public' or 'scratch'"),
        ("mobilenet_alpha", 0.5, "declared ImageNet weights"),
        ("text_top_fraction", 0.0, r"\(0, 1\]"),
        ("image_size", 16, "at least 32"),
        ("text_personal_optimizer", "rmsprop", "'sgd' or 'adam'"),
    ],
)
def test_bad_parameters_fail_naming_the_parameter(name, value, message):
    with pytest.raises(ParameterError, match=f"'{name}' .*{message}"):
        exp.Params.for_scale("smoke", **{name: value})


def test_fedavg_setting_per_kind():
    p = exp.Params.for_scale("default")
    assert p.fedavg_setting("text") == (p.fedavg_rounds, p.fedavg_clients)
    assert p.fedavg_setting("image") == (p.image_fedavg_rounds, p.image_fedavg_clients)
