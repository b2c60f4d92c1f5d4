"""AutLearn's shared layer: the Sent140 and FEMNIST readers, the top-users rule, the privacy
invariant (no personal token reaches the cloud side) and the on-device last-layer step."""

import dataclasses
import json

import numpy as np
import pytest

from ondevice import streams
from ondevice.data import femnist, manifests, sent140, shakespeare
from ondevice.data.shakespeare import Speech
from ondevice.papers.autlearn import common, protocol
from ondevice.training.trainer import Trainer


class P(common.AutLearnParams):
    PRESETS = common.presets({})


def tiny(**overrides) -> P:
    values = dict(
        vocab_size=300,
        embedding_dim=8,
        hidden_units=8,
        pretrain_epochs=1,
        pretrain_max_tweets=300,
        text_users=0,
        text_top_fraction=0.01,
        user_max_words=0,
        image_size=32,
    )
    return P.for_scale("smoke", **{**values, **overrides})


# ---- readers --------------------------------------------------------------------------------------


def test_sent140_mirror_file_reads_all_tweets():
    users, files = sent140.load()
    assert len(users) == 7086 and sum(map(len, users.values())) == 8692
    assert files[0].name == "all_data_niid_05_keep_3_test_9.json"


@pytest.mark.parametrize(
    "doc, message",
    [
        ("not json", "not a readable JSON"),
        ({"users": ["a"]}, "expected LEAF's format"),
        ({"users": ["a"], "user_data": {"a": {"x": [["1", "d", "q", "a"]], "y": [0]}}}, "tweet 0"),
        (
            {"users": ["a"], "user_data": {"a": {"x": [["1", "d", "q", "a", "hi", "test"]], "y": [0, 1]}}},
            "1 tweets but 2 labels",
        ),
        (
            {"users": ["a"], "user_data": {"a": {"x": [["1", "d", "q", "a", "hi", "test"]], "y": [7]}}},
            "label other than 0 or 1",
        ),
    ],
)
def test_sent140_rejects_malformed_files_naming_them(tmp_path, doc, message):
    path = tmp_path / "broken_sent140.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    with pytest.raises(manifests.DataError, match=message) as err:
        sent140.read_file(path)
    assert "broken_sent140.json" in str(err.value)


def _femnist_doc(x, y):
    return {"users": ["w1"], "num_samples": [len(y)], "user_data": {"w1": {"x": x, "y": y}}}


@pytest.mark.parametrize(
    "doc, message",
    [
        (_femnist_doc([[0.5] * 10], [1]), "rows of 784 pixels"),
        (_femnist_doc([[1.5] * 784], [1]), r"pixels must lie in \[0, 1\]"),
        (_femnist_doc([[0.5] * 784], [62]), "one class in 0..61"),
        (_femnist_doc([[0.5] * 784], [1, 2]), "one class in 0..61"),
        ({"users": ["w1"], "user_data": {}}, "writer 'w1' has no 'x' and 'y'"),
    ],
)
def test_femnist_rejects_malformed_files_naming_them(tmp_path, doc, message):
    path = tmp_path / "broken_femnist_train_9.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(manifests.DataError, match=message) as err:
        femnist.read_file(path)
    assert "broken_femnist_train_9.json" in str(err.value)


def test_femnist_needs_train_and_test_pairs(tmp_path):
    good = json.dumps(_femnist_doc([[0.5] * 784], [3]))
    (tmp_path / "all_data_1_train_9.json").write_text(good)
    with pytest.raises(manifests.DataError, match="pairs"):
        femnist.load(tmp_path)
    (tmp_path / "all_data_1_test_9.json").write_text(
        json.dumps(
            {**_femnist_doc([[0.5] * 784], [3]), "users": ["w2"], "user_data": {"w2": {"x": [[0.5] * 784], "y": [3]}}}
        )
    )
    with pytest.raises(manifests.DataError, match="different writers"):
        femnist.load(tmp_path)


def test_femnist_mirror_keeps_leafs_split_per_writer():
    train, test, files = femnist.load(pairs=1)
    assert len(files) == 2 and set(train) == set(test) and len(train) == 5
    for w in train:
        x, y = train[w]
        assert x.shape[1:] == (28, 28, 1) and x.dtype == np.float32 and 0 <= x.min() and x.max() <= 1
        assert len(test[w][1]) < len(y)  # LEAF's 90/10


def test_top_users_takes_the_heaviest_fraction_then_validation_then_a_sample():
    sizes = {f"u{i:02d}": i for i in range(25)}
    assert common.top_users(sizes, 0.1, 0, 0, 0, "t") == (("u22", "u23", "u24"), ())  # ceil(2.5) = 3 heaviest
    drawn, held = common.top_users(sizes, 0.4, 4, 3, 0, "t")
    top = {f"u{i}" for i in range(15, 25)}
    assert len(drawn) == 4 and len(held) == 3 and set(drawn) <= top and set(held) <= top
    assert not set(drawn) & set(held)  # validation users are never test users
    assert (drawn, held) == common.top_users(sizes, 0.4, 4, 3, 0, "t") and drawn == tuple(sorted(drawn))
    everyone, held = common.top_users(sizes, 0.4, 0, 3, 0, "t")
    assert set(everyone) == top - set(held)  # n = 0: all of the rest
    with pytest.raises(ValueError, match="leave no test user"):
        common.top_users(sizes, 0.1, 0, 3, 0, "t")


# ---- privacy: nothing of a personal user reaches the cloud side -------------------------------------

MARKERS = ("zqxmarkerone", "zqxmarkertwo")


def _with_markers(speeches):
    """Two planted users, each the heaviest of all, typing unique marker words."""
    planted = [
        Speech("plantedplay", f"MARKER{i}", " ".join([word] * 20 + ["and", "the", "king"]) + ".")
        for i, word in enumerate(MARKERS)
        for _ in range(600)
    ]
    return list(speeches) + planted


def test_marker_users_never_reach_vocabulary_or_pretraining(speeches, tmp_path, monkeypatch):
    monkeypatch.setenv("ONDEVICE_MODEL_CACHE", str(tmp_path))
    params = tiny()
    tweets, _ = sent140.load()
    clean = common.load_text(params, lambda *a: None, speeches=speeches, tweets=tweets)
    planted = common.load_text(params, lambda *a: None, speeches=_with_markers(speeches), tweets=tweets)
    marker_users = [u for u in planted.users + planted.validation_users if u.startswith("plantedplay/")]
    assert len(marker_users) == 2  # they are personal (test or validation) users...
    assert any(MARKERS[0] in s for u in marker_users for s in planted.train_sentences[u])  # ...with their words
    assert not set(MARKERS) & set(planted.vocab.words)
    assert planted.vocab == clean.vocab
    assert planted.public_train.digest() == clean.public_train.digest()
    assert planted.public_holdout.digest() == clean.public_holdout.digest()
    first = common.pretrained_text(params, clean, lambda *a: None)
    again = common.pretrained_text(params, planted, lambda *a: None)
    assert not first.from_cache and again.from_cache  # the same key: the users are not in it
    assert all(np.array_equal(a, b) for a, b in zip(first.weights, again.weights))
    # the check can fail: the same markers in the PUBLIC text do reach the vocabulary
    leaked = {**tweets, "leaker": [" ".join([MARKERS[0]] * 500)]}
    assert (
        MARKERS[0]
        in common.load_text(tiny(pretrain_max_tweets=0), lambda *a: None, speeches=speeches, tweets=leaked).vocab.words
    )


def test_personal_split_is_by_order(speeches):
    data = common.load_text(tiny(), lambda *a: None, speeches=speeches)
    users = shakespeare.users(speeches)
    for u in data.users:
        train, test = data.train_sentences[u], data.test_sentences[u]
        assert train and test and train + test == users[u]  # earlier sentences train, later ones test
        assert len(data.train[u]) == sum(map(len, train))  # one sample per word
        assert sum(map(len, train)) <= 0.8 * sum(map(len, users[u])) < sum(map(len, train + test[:1]))
    capped = common.load_text(tiny(user_max_words=500), lambda *a: None, speeches=speeches)
    for u in capped.users:  # the first sentences up to 500 words, then the same split by order
        kept = capped.train_sentences[u] + capped.test_sentences[u]
        assert kept == users[u][: len(kept)] and sum(map(len, kept)) <= 500 < sum(map(len, users[u][: len(kept) + 1]))


# ---- the on-device step -------------------------------------------------------------------------


def test_image_head_step_equals_last_layer_hook_on_the_whole_model():
    params = tiny(image_personal_optimizer="sgd", image_personal_learning_rate=0.5, image_personal_batch_size=8)
    pre = common.pretrained_image(params, None, lambda *a: None)
    rng = np.random.default_rng(0)
    x, y = rng.random((8, 28, 28, 1), dtype=np.float32), rng.integers(0, 62, 8).astype(np.int32)
    step = protocol.PersonalTrainer(params, "image", pre.model)
    step.fit(pre.weights, (x, y), streams.rng(0, "t"), epochs=1)
    via_head = step.model.get_weights()
    pre.model.set_weights(pre.weights)
    hook = Trainer(pre.model, common.image_task(), 0.5, "sgd", hooks=[protocol.last_layer("image")])
    assert [v.name for v in hook.variables_to_train] == [
        v.name for v in pre.model.get_layer("logits").trainable_variables
    ]
    hook.step(x, y)
    whole = pre.model.get_weights()
    changed = [i for i, (a, b) in enumerate(zip(pre.weights, whole)) if not np.array_equal(a, b)]
    assert len(changed) == 2  # the head's kernel and bias; BatchNorm statistics untouched
    # Both paths update the head from the same features, but compute them through different graphs
    # (the cached backbone output vs the whole model), so float32 summation order differs: through
    # the backbone's ~14 layers of sums over hundreds of terms the features, and so the gradient,
    # agree to ~1e-5 relative (measured: up to 4.1e-6 absolute on another CPU at lr 0.5). Compare
    # each tensor's update with 1e-4 of its largest change (10x that), plus 4 float32 ulps of the
    # weights themselves for the final addition w - lr * g.
    for before, a, b in zip(pre.weights, via_head, whole):
        update = np.abs(b - before).max()
        atol = 1e-4 * update + 4 * np.finfo(np.float32).eps * np.abs(before).max()
        np.testing.assert_allclose(a - before, b - before, rtol=0, atol=atol)


def test_text_step_trains_only_the_softmax(speeches, tmp_path, monkeypatch):
    monkeypatch.setenv("ONDEVICE_MODEL_CACHE", str(tmp_path))
    params = tiny()
    data = common.load_text(params, lambda *a: None, speeches=speeches)
    pre = common.pretrained_text(params, data, lambda *a: None)
    user = data.users[0]
    step = protocol.PersonalTrainer(params, "text", pre.model)
    history = step.fit(pre.weights, data.train[user], streams.rng(0, "t"), epochs=1)
    assert history[0]["steps"] >= 1
    after = step.model.get_weights()
    softmax = {id(v) for v in pre.model.get_layer("softmax").weights}
    for var, a, b in zip(pre.model.weights, pre.weights, after):
        assert np.array_equal(a, b) != (id(var) in softmax), var.name
    scores = common.score_text(step.model, data.test[user], params.k)
    assert 0 <= scores["top1"] <= 1 and 0 <= scores["top_k_eff"] <= 1


def test_rate_and_epochs_are_chosen_on_validation_users_only():
    """Each (epochs, rate) candidate is scored on the validation writers; the test writers' data cannot
    change the choice; the public model's weights are restored; a rate that learns their labels wins,
    with the fewest epochs that reach it; a pair scored within one longer run equals its own run."""
    params = tiny(image_rate_candidates=(1e-6, 0.05), image_epoch_candidates=(3, 1))
    pre = common.pretrained_image(params, None, lambda *a: None)
    rng = np.random.default_rng(0)
    writer = lambda label, n: (rng.random((n, 28, 28, 1), dtype=np.float32), np.full(n, label, np.int32))
    val = common.Validation(
        ("v1", "v2"), {"v1": writer(5, 24), "v2": writer(5, 24)}, {"v1": writer(5, 8), "v2": writer(5, 8)}
    )

    def choose(test_label):
        data = common.ImageData(
            None, [], ("t1",), {"t1": writer(test_label, 24)}, {"t1": writer(test_label, 8)}, 3, val
        )
        return protocol.choose_step(params, "image", data, pre, lambda *a: None)

    chosen, table = choose(7)
    assert list(zip(table.epochs, table.learning_rate)) == [(1, 1e-6), (1, 0.05), (3, 1e-6), (3, 0.05), (0, 0.0)]
    best = table[table.chosen].iloc[0]
    assert (
        best.learning_rate == 0.05 and best["validation mean top-1"] == 1.0
    )  # learns class 5 of the validation writers
    assert (chosen.image_personal_learning_rate, chosen.image_personal_epochs) == (0.05, best.epochs)
    one_epoch = table[(table.epochs == 1) & (table.learning_rate == 0.05)]["validation mean top-1"].iloc[0]
    assert best.epochs == (1 if one_epoch == 1.0 else 3)  # ties go to fewer epochs
    assert table.validation_users.iloc[0] == 2
    assert all(np.array_equal(a, b) for a, b in zip(pre.model.get_weights(), pre.weights))
    again, other = choose(11)  # other test writers: the same table
    assert again == chosen and other["validation mean top-1"].tolist() == table["validation mean top-1"].tolist()
    # epoch 1 inside the 3-epoch run scores as a run of 1 epoch alone (the batches do not look ahead), and
    # the head's top-1 on the features is the whole model's
    step = protocol.PersonalTrainer(dataclasses.replace(params, image_personal_learning_rate=0.05), "image", pre.model)
    alone = []
    for u in val.users:
        rows = step.fit(pre.weights, val.train[u], streams.rng(params.seed, f"validation/image/{u}"), 1, val.test[u])
        assert rows[-1]["top1"] == common.score_image(pre.model, val.test[u])["top1"]
        alone.append(rows[-1]["top1"])
    assert np.mean(alone) == one_epoch
    kept, empty = protocol.choose_step(
        tiny(image_rate_candidates=()), "image", common.ImageData(None, [], (), {}, {}, 0, val), pre, lambda *a: None
    )
    assert kept.image_personal_learning_rate == tiny().image_personal_learning_rate and empty.empty
