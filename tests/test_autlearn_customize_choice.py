"""CloudCustomize's step choice: the CloudTrain it is chosen on pools the validation users as the test
users are pooled, and stops on the only data of theirs it does not pool."""

from types import SimpleNamespace

import numpy as np
import pytest
import tf_keras as keras

from ondevice.data import femnist
from ondevice.data.typing_samples import Vocabulary, build_samples, sentences
from ondevice.papers.autlearn import common, customize_choice


def _images(n: int, first: int) -> tuple[np.ndarray, np.ndarray]:
    """n images whose every pixel is its own number (first, first + 1, ...): each is recognisable in a pool."""
    ids = np.arange(first, first + n, dtype=np.float32)
    return np.broadcast_to(ids[:, None, None, None], (n, femnist.SIDE, femnist.SIDE, 1)).copy(), (ids % 62).astype(int)


def _image_data():
    parts = iter(range(0, 1000, 10))
    split = lambda users, n: {u: _images(n, next(parts)) for u in users}  # noqa: E731
    train, test = split(("t1", "t2"), 3), split(("t1", "t2"), 2)
    validation = common.Validation(("v1",), split(("v1",), 4), split(("v1",), 2))
    pooled = lambda: tuple(np.concatenate([train[u][i] for u in ("t1", "t2")]) for i in (0, 1))  # noqa: E731
    return SimpleNamespace(users=("t1", "t2"), train=train, test=test, validation=validation, pooled_train=pooled)


def _ids(images: np.ndarray) -> set[int]:
    return {int(v) for v in images[:, 0, 0, 0]}


def test_the_choice_pools_every_test_and_validation_users_training_part_and_no_test_part():
    data = _image_data()
    x, y = customize_choice.pool("image", data)
    train_parts = [data.train[u] for u in data.users] + [data.validation.train["v1"]]
    assert _ids(x) == set().union(*(_ids(p[0]) for p in train_parts)) and len(x) == len(y) == 3 + 3 + 4
    test_parts = [data.test[u] for u in data.users] + [data.validation.test["v1"]]
    assert not _ids(x) & set().union(*(_ids(p[0]) for p in test_parts))
    assert {int(v) for v in y} == {i % 62 for i in _ids(x)}  # each label with its image


def test_the_text_choice_pools_the_validation_users_sentences_beside_the_test_users():
    said = {"t": "the king is here. the queen is there.", "v": "a fool and a knave! where is the fool?"}
    train = {u: sentences(t) for u, t in said.items()}
    vocab = Vocabulary.from_sentences([s for part in train.values() for s in part], 20)
    data = SimpleNamespace(users=("t",), train_sentences=train, vocab=vocab, context_words=2)
    data.validation = common.Validation(("v",), {}, {})
    pooled = customize_choice.pool("text", data)
    assert pooled.digest() == build_samples(train["t"] + train["v"], vocab, 2).digest()
    assert len(pooled) > len(build_samples(train["t"], vocab, 2))


def test_the_choice_stops_on_the_validation_users_test_parts_alone():
    data = _image_data()
    inputs = keras.Input((femnist.SIDE, femnist.SIDE, 1))
    logits = keras.layers.Dense(femnist.CLASSES, kernel_initializer=keras.initializers.GlorotUniform(seed=3))(
        keras.layers.Flatten()(inputs / 1000.0)
    )
    model = keras.Model(inputs, logits)
    loss = customize_choice.later_parts_loss("image", data.validation)(model)["holdout_loss"]
    assert loss == pytest.approx(common.image_task().evaluate(model, data.validation.test["v1"])["loss"], rel=1e-6)
    both = tuple(
        np.concatenate([p[i] for p in (data.validation.train["v1"], data.validation.test["v1"])]) for i in (0, 1)
    )
    assert abs(loss - common.image_task().evaluate(model, both)["loss"]) > 1e-3  # the training part would change it


def test_the_step_is_chosen_between_the_papers_sgd_and_our_adam_by_the_same_rule(monkeypatch):
    """Each optimizer's own choice (rate and epochs) on the validation users; the higher score wins,
    a tie goes to SGD (the paper's, listed first); only the winner's row stays chosen."""
    import pandas as pd

    from ondevice.papers.autlearn.experiments.autlearn_accuracy import Params

    params = Params.for_scale("smoke")
    assert params.image_personal_optimizer == "adam" and params.text_personal_optimizer == "sgd"
    scores = {"sgd": 0.80, "adam": 0.83}
    seen = []

    def choose_step(p, kind, data, start, log):
        opt = getattr(p, f"{kind}_personal_optimizer")
        seen.append((opt, getattr(p, f"{kind}_rate_candidates")))
        table = pd.DataFrame({"learning_rate": [0.1, 0.0], "validation mean top-1": [scores[opt], 0.5]})
        return p, table.assign(chosen=[True, False], optimizer=opt)

    monkeypatch.setattr(customize_choice.protocol, "choose_step", choose_step)
    chosen, table = customize_choice.choose_optimizer(params, "image", None, None, lambda *_: None)
    assert seen == [("sgd", params.image_sgd_rate_candidates), ("adam", params.image_rate_candidates)]
    assert chosen.image_personal_optimizer == "adam" and list(table[table.chosen].optimizer) == ["adam"]
    scores["adam"] = 0.80  # a tie: the paper's SGD
    chosen, table = customize_choice.choose_optimizer(params, "image", None, None, lambda *_: None)
    assert chosen.image_personal_optimizer == "sgd" and list(table[table.chosen].optimizer) == ["sgd"]
    seen.clear()  # the LSTM's step is SGD already: nothing beside it
    chosen, _ = customize_choice.choose_optimizer(params, "text", None, None, lambda *_: None)
    assert [s[0] for s in seen] == ["sgd"] and chosen is params
    with pytest.raises(Exception, match="image_sgd_rate_candidates"):
        Params.for_scale("smoke", image_sgd_rate_candidates=(0.1, -0.1))
