"""AutLearn A3/A4 techniques: EDA over WordNet, image augmentation, the online update from the
inference cache (the same update as the plain last-layer step), and A3's MobileNet ablation."""

from collections import Counter

import numpy as np
import pandas as pd
import pytest

from numerics import assert_close_float32, assert_same_update
from ondevice.data.wordnet import WordNet
from ondevice.papers.autlearn.techniques import eda as eda_mod
from ondevice.papers.autlearn.techniques.eda import EDA, augment_corpus
from ondevice.papers.autlearn.techniques.image_augment import ImageAugmenter, augment_images

HEADER = [
    "  1 This is a fixture in the format of WordNet 3.0's database files.  ",
    "  2 WordNet 3.0 Copyright 2006 by Princeton University.  All rights reserved.  ",
]
# Synsets per part of speech: (lex_filenum, ss_type, lemmas, gloss). Lemma lex ids are 0.
SYNSETS = {
    "noun": [
        ("05", "n", ["dog", "domestic_dog", "Canis_familiaris"], "a member of the genus Canis"),
        ("18", "n", ["cad", "bounder", "dog"], "someone who is morally reprehensible"),
        ("18", "n", ["woman", "adult_female"], "an adult female person"),
    ],
    "verb": [
        ("38", "v", ["chase", "chase_after", "dog"], "go after with the intent to catch"),
        ("38", "v", ["run"], "move fast by using one's feet"),
    ],
    "adj": [
        ("00", "a", ["happy(a)", "glad"], "enjoying or showing or marked by joy"),
        ("00", "s", ["felicitous", "happy(p)", "well-chosen"], "exhibiting an agreeable appropriateness"),
    ],
    "adv": [("02", "r", ["quickly", "speedily", "apace"], "with rapid movements")],
}
EXCEPTIONS = {"noun": ["women woman"], "verb": ["ran run"], "adj": [], "adv": []}


@pytest.fixture(scope="module")
def wordnet(tmp_path_factory):
    """A small database written in wndb(5WN) format: data lines at their byte offsets, index lines
    pointing at them, exception lists."""
    root = tmp_path_factory.mktemp("wordnet")
    for pos, synsets in SYNSETS.items():
        lines, offset, index = list(HEADER), sum(len(h) + 1 for h in HEADER), {}
        for lex, ss_type, lemmas, gloss in synsets:
            words = " ".join(f"{w} 0" for w in lemmas)
            line = f"{offset:08d} {lex} {ss_type} {len(lemmas):02x} {words} 000 | {gloss}  "
            for w in lemmas:
                index.setdefault(w.split("(")[0].lower(), []).append(offset)
            lines.append(line)
            offset += len(line) + 1
        (root / f"data.{pos}").write_text("\n".join(lines) + "\n", encoding="latin-1")
        pos_letter = {"noun": "n", "verb": "v", "adj": "a", "adv": "r"}[pos]
        rows = [
            f"{lemma} {pos_letter} {len(offs)} 0 {len(offs)} 0 " + " ".join(f"{o:08d}" for o in offs) + "  "
            for lemma, offs in sorted(index.items())
        ]
        (root / f"index.{pos}").write_text("\n".join(HEADER + rows) + "\n", encoding="latin-1")
        (root / f"{pos}.exc").write_text("".join(f"{e}\n" for e in EXCEPTIONS[pos]))
    return WordNet(root)


def test_wordnet_reader_finds_synsets_across_parts_of_speech(wordnet):
    assert wordnet.synonyms("dog") == ("bounder", "cad", "canis familiaris", "chase", "chase after", "domestic dog")
    assert wordnet.synset_lemmas("adj", wordnet.index["adj"]["felicitous"][0]) == ("felicitous", "happy", "well-chosen")
    assert wordnet.synonyms("happy") == ("felicitous", "glad", "well chosen")  # markers stripped, '-' as space
    assert wordnet.synonyms("Quickly") == ("apace", "speedily")
    assert wordnet.synonyms("the") == ()


def test_wordnet_reader_reduces_inflections_like_morphy(wordnet):
    assert "domestic dog" in wordnet.synonyms("dogs") and "dog" in wordnet.synonyms("dogs")  # -s detached
    assert (
        wordnet.lemmas("chased", "verb") == ["chase"] and wordnet.lemmas("running", "verb") == []
    )  # -ed detached; no rule gives run
    assert wordnet.synonyms("women") == ("adult female", "woman")  # noun.exc
    assert wordnet.lemmas("ran", "verb") == ["run"]  # verb.exc


def test_wordnet_reader_errors_name_the_file(wordnet, tmp_path):
    with pytest.raises(ValueError, match="no synset at byte offset 5"):
        wordnet.synset_lemmas("noun", 5)
    with pytest.raises(FileNotFoundError, match="index.noun"):
        WordNet(tmp_path)
    (tmp_path / "index.noun").write_text("dog n 3 0 3 0 00000001\n")
    with pytest.raises(ValueError, match=r"index.noun:1: 3 synsets announced, 1 listed"):
        WordNet._read_index(tmp_path / "index.noun")


SENTENCE = "the dog ran after the happy woman and the dog ran quickly home".split()


@pytest.fixture
def eda(wordnet):
    return EDA(wordnet.synonyms)


def test_random_swap_keeps_the_multiset_of_words(eda):
    rng = np.random.default_rng(0)
    for n in (1, 3, 10):
        out = eda.random_swap(SENTENCE, n, rng)
        assert Counter(out) == Counter(SENTENCE)
    assert any(eda.random_swap(SENTENCE, 1, rng) != SENTENCE for _ in range(5))
    assert eda.random_swap(["alone"], 3, rng) == ["alone"]


def test_random_deletion_deletes_at_rate_p_and_never_empties_a_sentence(eda):
    rng = np.random.default_rng(1)
    for _ in range(20):
        out = eda.random_deletion(SENTENCE, 1.0, rng)
        assert len(out) == 1 and out[0] in SENTENCE
    assert eda.random_deletion(["alone"], 1.0, rng) == ["alone"]
    assert eda.random_deletion(SENTENCE, 0.0, rng) == SENTENCE
    kept = [len(eda.random_deletion(SENTENCE * 50, 0.3, rng)) for _ in range(10)]
    assert abs(np.mean(kept) / (len(SENTENCE) * 50) - 0.7) < 0.03
    out = eda.random_deletion(SENTENCE, 0.5, rng)  # a subsequence: order kept
    it = iter(SENTENCE)
    assert all(w in it for w in out)


def test_synonym_replacement_uses_wordnet_synonyms_and_skips_stop_words(eda, wordnet):
    rng = np.random.default_rng(2)
    words = "the dog and the happy woman".split()
    # n = 1: one content word replaced, at every occurrence, by one of its WordNet synonyms
    allowed = [
        " ".join(s if t == w else t for t in words).split()
        for w in ("dog", "happy", "woman")
        for s in wordnet.synonyms(w)
    ]
    seen = set()
    for _ in range(30):
        out = eda.synonym_replacement(words, 1, rng)
        assert out in allowed
        seen.add(" ".join(out))
    assert len(seen) > 5
    twice = eda.synonym_replacement("the dog saw the dog".split(), 1, rng)
    assert "dog" not in twice or twice.count("dog") == 2 and "domestic" in twice
    assert eda.synonym_replacement("the and of".split(), 2, rng) == "the and of".split()


def test_random_insertion_adds_a_synonym_and_keeps_the_sentence(eda, wordnet):
    rng = np.random.default_rng(3)
    words = "the dog ran".split()
    for _ in range(20):
        out = eda.random_insertion(words, 1, rng)
        assert len(out) > len(words)
        it = iter(out)
        assert all(w in it for w in words)  # the original is a subsequence
        pool = {t for w in ("dog", "ran") for s in wordnet.synonyms(w) for t in s.split()}
        assert set(out) - set(words) <= pool
    assert eda.random_insertion("the and".split(), 2, rng) == ["the", "and"]


def test_augment_makes_n_aug_sentences_and_the_same_seed_gives_the_same_ones(eda):
    made = eda.augment(SENTENCE, 8, np.random.default_rng(4))
    assert len(made) == 8 and all(made)
    assert made == eda.augment(SENTENCE, 8, np.random.default_rng(4))
    assert made != eda.augment(SENTENCE, 8, np.random.default_rng(5))
    assert eda.augment([], 4, np.random.default_rng(0)) == []
    only_swap = EDA(eda.synonyms, operations=("rs",)).augment(SENTENCE, 3, np.random.default_rng(0))
    assert len(only_swap) == 3 and all(Counter(s) == Counter(SENTENCE) for s in only_swap)


def test_augment_corpus_caps_the_generated_count(eda):
    corpus = [SENTENCE, "the happy dog".split(), "a woman ran".split(), "quickly home".split()] * 5
    for cap, n_aug in ((1.0, 4), (0.5, 4), (1.0, 0.5), (2.0, 1)):
        made = augment_corpus(eda, corpus, np.random.default_rng(6), n_aug=n_aug, cap=cap)
        assert len(made) <= cap * len(corpus)
    assert len(augment_corpus(eda, corpus, np.random.default_rng(6), n_aug=4, cap=1.0)) == len(corpus)
    a = augment_corpus(eda, corpus, np.random.default_rng(7))
    assert a == augment_corpus(eda, corpus, np.random.default_rng(7))


def test_eda_rejects_bad_settings(eda):
    with pytest.raises(ValueError, match="alpha_sr"):
        EDA(eda.synonyms, alpha_sr=1.5)
    with pytest.raises(ValueError, match="operations"):
        EDA(eda.synonyms, operations=("sr", "shuffle"))
    assert "the" in eda_mod.STOP_WORDS and "thou" in eda_mod.STOP_WORDS


def test_clean_keeps_letters_only():
    assert eda_mod.clean("Don't -- stop, well-chosen!") == ["dont", "stop", "well", "chosen"]


@pytest.fixture(scope="module")
def images():
    rng = np.random.default_rng(0)
    x = rng.random((12, 28, 28)).astype(np.float32)
    x[:, 10:18, 10:18] = 1.0
    return x, np.arange(12) % 4


def test_image_augmentation_keeps_shapes_dtypes_and_labels_and_changes_pixels(images):
    x, y = images
    aug = ImageAugmenter()
    gx, gy = augment_images(aug, x, y, np.random.default_rng(1), n_aug=1, cap=1.0)
    assert gx.shape == x.shape and gx.dtype == x.dtype and gy.tolist() == y.tolist()  # cap 1, n_aug 1: each once
    assert np.abs(gx - x).mean() > 0.01
    rgb = np.repeat(x[..., None], 3, axis=-1)
    gx3, gy3 = augment_images(
        ImageAugmenter(("flip", "scale", "noise")), rgb, y, np.random.default_rng(1), n_aug=3, cap=0.5
    )
    assert gx3.shape == (6, 28, 28, 3) and len(gy3) == 6
    unique = np.arange(len(x))  # one label per image: the label names the source image
    gn, gl = augment_images(ImageAugmenter(("noise",)), x, unique, np.random.default_rng(2), n_aug=2, cap=1.0)
    nearest = np.abs(gn[:, None] - x[None]).mean(axis=(2, 3)).argmin(axis=1)
    np.testing.assert_array_equal(nearest, gl)


def test_image_augmentation_is_seeded_and_capped(images):
    x, y = images
    aug = ImageAugmenter(("crop", "rotation", "translation", "noise"))
    a = augment_images(aug, x, y, np.random.default_rng(2), n_aug=4, cap=1.0)
    b = augment_images(aug, x, y, np.random.default_rng(2), n_aug=4, cap=1.0)
    c = augment_images(aug, x, y, np.random.default_rng(3), n_aug=4, cap=1.0)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert not np.array_equal(a[0], c[0])
    assert len(a[0]) == len(x)
    assert len(augment_images(aug, x, y, np.random.default_rng(2), n_aug=4, cap=0.25)[0]) == 3
    assert len(augment_images(aug, x, y, np.random.default_rng(2), n_aug=0, cap=1.0)[0]) == 0
    with pytest.raises(ValueError, match="subset"):
        ImageAugmenter(("rotate",))


# the classifier's logits: a 3x3 convolution (9 terms + bias), the mean of its 10 x 10 outputs, then
# 4 features + bias: a chain of 115 float32 terms
CLASSIFIER_TERMS = 10 + 100 + 5


@pytest.fixture(scope="module")
def classifier():
    """A small CNN whose last layer is named like MobileNet's head, on pooled features."""
    import tf_keras as keras

    from ondevice.tasks.classification import ClassificationTask
    from ondevice.training.trainer import seed_everything

    seed_everything(0)
    inputs = keras.Input((12, 12, 1))
    x = keras.layers.Conv2D(4, 3, activation="relu")(inputs)
    x = keras.layers.GlobalAveragePooling2D()(x)
    model = keras.Model(inputs, keras.layers.Dense(5, name="logits")(x))
    rng = np.random.default_rng(0)
    x, y = rng.random((48, 12, 12, 1)).astype(np.float32), rng.integers(0, 5, 48).astype(np.int32)
    return model, ClassificationTask((12, 12, 1), 5), x, y


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_online_update_from_the_cache_equals_the_plain_last_layer_step(classifier, optimizer):
    from ondevice.training.fine_tune import FineTune
    from ondevice.training.inference_reuse import OnlineTrainer
    from ondevice.training.trainer import Trainer

    model, task, x, y = classifier
    start = model.get_weights()
    plain = Trainer(model, task, 0.05, optimizer, hooks=[FineTune("logits")])
    plain.reset(start)
    for i in (0, 16, 32):
        plain.step(x[i : i + 16], y[i : i + 16])
    expected = model.get_weights()
    online = OnlineTrainer(model, task, 0.05, optimizer, head="logits")
    online.reset(start)
    for i in (0, 16, 32):
        cached = online.infer_and_cache(x[i : i + 16])
        # one graph vs two: the convolution's 3x3 sums, then the head's sums over its features
        assert_close_float32(cached["logits"].numpy(), model(x[i : i + 16]).numpy(), terms=CLASSIFIER_TERMS)
        online.train_from_cache(cached["features"], y[i : i + 16])
    got = model.get_weights()
    # the head's gradient adds a sum over the batch of 16 to the forward sums; 3 steps. With Adam the
    # moves are ~lr whatever the gradient: a wrong lr or sign still changes them by ~100%.
    for a, b, s in zip(expected, got, start):
        assert_same_update(b, a, s, terms=3 * (CLASSIFIER_TERMS + 16))
    np.testing.assert_array_equal(got[0], start[0])  # the convolution never moves
    assert not np.allclose(got[-2], start[-2])
    model.set_weights(start)


def test_stream_predicts_before_learning_and_updates_once_per_full_buffer(classifier):
    from ondevice.papers.autlearn.online_learning import stream_pass
    from ondevice.training.inference_reuse import OnlineTrainer

    model, task, x, y = classifier
    start = model.get_weights()
    trainer = OnlineTrainer(model, task, 0.5, "sgd", head="logits")
    x, y = x[:40], y[:40]
    batch = lambda idx: (x[idx], y[idx])
    hits = lambda logits, idx, labels: (logits.argmax(1) == labels).astype(float)
    frozen, steps = stream_pass(trainer, start, 40, batch, hits, 16, train=False)
    assert steps == 0
    model.set_weights(start)
    np.testing.assert_array_equal(frozen, (model(x).numpy().argmax(1) == y).astype(float))
    online, steps = stream_pass(trainer, start, 40, batch, hits, 16, train=True)
    assert steps == 2  # 16 + 16, the last 8 are never trained on
    np.testing.assert_array_equal(online[:16], frozen[:16])  # the first buffer meets the start model
    moved = model.get_weights()
    model.set_weights(start)
    assert not np.allclose(moved[-2], start[-2])
    # the third buffer is predicted by the model after two updates
    model.set_weights(moved)
    np.testing.assert_array_equal(online[32:], (model(x[32:]).numpy().argmax(1) == y[32:]).astype(float))
    model.set_weights(start)


# ---- A3's MobileNet change taken apart (augment_ablation) ----------------------------------------


def _ablation_params(**overrides):
    from ondevice.papers.autlearn.experiments.autlearn_augment_online import Params

    return Params.for_scale("smoke", **{"image_personal_epochs": 2, "ablation_epochs": (1,), **overrides})


@pytest.fixture(scope="module")
def writers():
    """Three writers of 10 training and 4 test images each, and a random MobileNet at 32 pixels."""
    from ondevice.data import femnist
    from ondevice.models import mobilenet_v1
    from ondevice.papers.autlearn.common import ImageData, Pretrained

    rng, users = np.random.default_rng(0), ("w1", "w2", "w3")
    part = lambda n: {u: (rng.random((n, 28, 28, 1)).astype(np.float32), rng.integers(0, 4, n)) for u in users}
    images = ImageData(None, [], users, part(10), part(4), len(users))
    model = mobilenet_v1.build(None, 0.25, 32, femnist.CLASSES, seed=0)
    return images, Pretrained(model, model.get_weights(), {}, False)


def test_copies_and_generated_images_come_from_the_same_sampled_sources(writers):
    from ondevice.papers.autlearn import augment_ablation as ab

    images, _ = writers
    params = _ablation_params(augment_cap=0.5)
    (x, y), made = ab.training_set(params, images, "w1")
    assert made == 0 and x is images.train["w1"][0]
    (cx, cy), n_copies = ab.training_set(params, images, "w1", ab.Copies())
    (gx, gy), n_generated = ab.training_set(params, images, "w1", ImageAugmenter(("rotation",)))
    assert n_copies == n_generated == 5  # cap 0.5 x 10 originals
    np.testing.assert_array_equal(cy, gy)  # the same draw of sources
    originals = images.train["w1"][0].reshape(10, -1)
    sources = [int(np.flatnonzero((originals == c.reshape(1, -1)).all(1))[0]) for c in cx[10:]]
    np.testing.assert_array_equal(cy[10:], images.train["w1"][1][sources])  # copies are their sources unchanged
    assert not np.array_equal(gx[10:], cx[10:])  # generated ones are not


def test_ablation_reuses_a3_runs_exactly_and_summarises_against_the_originals(writers):
    from ondevice.papers.autlearn import augment_ablation as ab
    from ondevice.papers.autlearn.experiments import autlearn_augment_online as exp

    images, pre = writers
    params = _ablation_params(image_personal_learning_rate=0.03, seeds=1)
    runs = ab.runs(params)
    assert len(runs) == 2 * 3 + 3 and (ab.GENERATED, "rotation", 2) in runs and (ab.COPIES, "-", 1) in runs
    a3 = exp.augment_images(
        params, type("D", (), {"images": images}), {"image": {params.seed: pre}}, log=lambda m: None
    )
    reused = ab.rows(params, images, pre, a3, log=lambda m: None)
    trained = ab.rows(params, images, pre, None, log=lambda m: None)
    pd.testing.assert_frame_equal(reused, trained)  # A3's two runs, trained again, give A3's numbers
    assert len(trained) == len(runs) * 3
    assert (trained[trained.training != ab.ORIGINAL].generated_images == 10).all()
    summary = ab.table(params, trained)
    assert summary[summary.training == ab.ORIGINAL][ab.CHANGE].isna().all()
    row = summary[(summary.training == ab.COPIES) & (summary.epochs == 2)].iloc[0]
    base = trained[(trained.training == ab.ORIGINAL) & (trained.epochs == 2)].top1.mean()
    assert row["mean top-1"] == pytest.approx(
        trained[(trained.training == ab.COPIES) & (trained.epochs == 2)].top1.mean()
    )
    assert base > 0 and row[ab.CHANGE] == pytest.approx(row["mean top-1"] / base - 1)
    assert row["ci low"] <= row[ab.CHANGE] <= row["ci high"]


def _summary(changes: dict) -> pd.DataFrame:
    from ondevice.papers.autlearn import augment_ablation as ab

    return pd.DataFrame(
        [dict(training=t, operations=o, epochs=e, **{ab.CHANGE: v}) for (t, o, e), v in changes.items()]
    )


def test_diagnosis_quotes_the_table_and_only_when_it_shows_the_cause():
    from ondevice.papers.autlearn import augment_ablation as ab

    params, ops = _ablation_params(), "crop + rotation + translation"
    changes = {
        (ab.COPIES, "-", 1): 0.27, (ab.GENERATED, ops, 1): 0.20,
        (ab.COPIES, "-", 2): -0.003, (ab.GENERATED, ops, 2): -0.026,
        (ab.GENERATED, "crop", 2): 0.006, (ab.GENERATED, "rotation", 2): 0.016,
        (ab.GENERATED, "translation", 2): -0.006,
    }  # fmt: skip
    why = ab.diagnosis(params, _summary(changes))
    assert why.section == ab.SECTION
    assert "1: +20.0% vs +27.0%" in why.text and "2 (ours): -2.6% vs -0.3%" in why.text
    assert why.text.endswith("crop +0.6%, rotation +1.6%, translation -0.6%")
    effects = pd.DataFrame({"effect": ["augmentation raises MobileNet accuracy", "other"]})
    claim = {"MobileNet": "augmentation raises MobileNet accuracy", "LSTM": "other"}
    filled = ab.diagnose(params, effects, claim, _summary(changes).assign(model="MobileNet"))
    assert filled.diagnosis.tolist() == [why.text, ""] and filled.section.tolist() == [ab.SECTION, ""]
    # copies no better than the generated images at some epochs: no cause shown, the row stays unexplained
    assert ab.diagnosis(params, _summary(changes | {(ab.COPIES, "-", 1): 0.10})) is None
    # the generated images do not lower top-1 at the preset's epochs: nothing to explain
    assert ab.diagnosis(params, _summary(changes | {(ab.GENERATED, ops, 2): 0.01, (ab.COPIES, "-", 2): 0.02})) is None
    unexplained = _summary(changes | {(ab.COPIES, "-", 1): 0.1}).assign(model="MobileNet")
    assert ab.diagnose(params, effects, claim, unexplained).diagnosis.eq("").all()


def test_copies_eda_repeats_the_sources_of_edas_own_draws():
    from ondevice.papers.autlearn import augment_ablation as ab
    from ondevice.papers.autlearn.techniques import eda

    made = eda.EDA(lambda w: ["other"], 0.3, 0.3, 0.3, 0.3, ("sr", "ri", "rs", "rd"))
    sents = [["a", "b", "c", "d"], ["e", "f", "g"], ["h", "i", "j", "k", "l"]]
    generated = eda.augment_corpus(made, sents, np.random.default_rng(3), 4, 0.7)
    copies = eda.augment_corpus(ab.CopiesEDA(made), sents, np.random.default_rng(3), 4, 0.7)
    assert len(copies) == len(generated) == 2 and all(c in sents for c in copies)
    assert copies != generated  # EDA changed its sentences, the copies are their sources


def test_text_ablation_is_explained_by_extra_steps_only_when_copies_do_as_well():
    from ondevice.papers.autlearn import augment_ablation as ab

    params = _ablation_params(seeds=1)
    a3 = pd.DataFrame(
        {
            "user": ["u1", "u2", "u1", "u2"],
            "augmentation": ["without", "without", "with", "with"],
            "generated_sentences": [0, 0, 5, 6],
            "top1": [0.10, 0.20, 0.12, 0.22],
        }
    )
    copies = a3.assign(top1=[0.10, 0.20, 0.13, 0.23])
    summary = ab.table(params, ab.text_rows(params, a3, copies))
    assert summary.training.tolist() == [ab.ORIGINAL, ab.GENERATED, ab.COPIES]
    assert summary[ab.CHANGE].iloc[1] == pytest.approx(0.34 / 0.30 - 1)
    why = ab.text_diagnosis(summary)
    assert why.section == ab.SECTION and "EDA's sentences" in why.text and "+20.0% (first seed)" in why.text
    assert ab.text_diagnosis(ab.table(params, ab.text_rows(params, a3, a3.assign(top1=[0.1, 0.2, 0.1, 0.2])))) is None


# ---- the augmentation's strength, chosen on validation writers (augment_choice) ------------------------


def test_augmentation_strength_is_chosen_on_validation_writers_only(writers):
    """Every candidate scale is scored on the validation writers (a reference without augmentation
    beside it), the test writers' data cannot change the choice, the chosen scale is the best one
    and sets each operation's strength (capped at 1), and the public weights are restored."""
    from ondevice.papers.autlearn import augment_choice
    from ondevice.papers.autlearn.common import ImageData, Validation
    from ondevice.papers.autlearn.techniques.image_augment import STRENGTH

    images, pre = writers
    params = _ablation_params(image_strength_candidates=(0.5, 30.0))
    val = Validation(
        ("w1", "w2"), {u: images.train[u] for u in ("w1", "w2")}, {u: images.test[u] for u in ("w1", "w2")}
    )

    def choose(test_writer):
        data = ImageData(None, [], (test_writer,), images.train, images.test, 3, val)
        return augment_choice.choose_strength(params, data, pre, lambda *a: None)

    chosen, table = choose("w3")
    assert table.strength_scale.tolist() == [0.5, 30.0, 0.0] and table.chosen.tolist()[2] is False
    scores = table["validation mean top-1"].to_numpy()
    best = 0 if scores[0] >= scores[1] else 1  # ties go to the weaker
    assert chosen.image_strength == table.strength_scale[best] and table.chosen[best]
    assert scores[2] == augment_choice._validation_top1(params, ImageData(None, [], (), {}, {}, 0, val), pre, 0.0)
    assert all(np.array_equal(a, b) for a, b in zip(pre.model.get_weights(), pre.weights))
    again, other = choose("w1")  # another test writer: the same table
    assert again == chosen and other["validation mean top-1"].tolist() == scores.tolist()
    assert augment_choice.strengths(params, 30.0)["rotation"] == 1.0  # 30 x 0.05 capped
    assert augment_choice.strengths(params, 0.5) == {op: s * 0.5 for op, s in STRENGTH.items()}
