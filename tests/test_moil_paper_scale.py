"""The MoIL notebooks' paper-scale paths on small fixtures written here: a fake ImageNet and bird
species tree of generated JPEGs streamed through every stage of the image experiment (with
Keras's MobileNetV2 ImageNet weights file format, written by keras.applications itself), a fake
AudioSet evaluation set in the official CSV format through the audio loader, and a yamnet.h5
written under the official tensorflow/models layer names loaded back into our YAMNet."""

import shutil

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from numerics import assert_close_float32, keras_terms
from ondevice.data import image_folders
from ondevice.data.manifests import DataError
from ondevice.models import mobilenet_v2, yamnet
from ondevice.papers.moil import audio_data, audio_model
from ondevice.papers.moil.experiments import moil_audio
from ondevice.papers.moil.experiments import moil_image as exp

SIZE, WIDTH = 32, 0.35
WNIDS, SPECIES = ["n01440764", "n01443537", "n01484850"], ["ABBOTTS BABBLER", "ALBATROSS"]


def _jpeg(path, colour, rng, shape=(SIZE, SIZE)):
    """A class-coloured noisy picture, so the classes can be told apart."""
    image = np.clip(np.array(colour)[None, None] + rng.normal(0, 30, (*shape, 3)), 0, 255).astype(np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(tf.io.encode_jpeg(image, quality=95).numpy())


@pytest.fixture(scope="module")
def trees(tmp_path_factory):
    """<imagenet>/{train,val}/<wnid>/*.JPEG, <birds>/{train,test}/<SPECIES>/*.jpg and Keras's
    ImageNet weights file format (keras.applications' own save, 3 'ImageNet' classes)."""
    root, rng = tmp_path_factory.mktemp("paper"), np.random.default_rng(0)
    colours = [(220, 40, 40), (40, 220, 40), (40, 40, 220), (220, 220, 40), (40, 220, 220)]
    for c, wnid in enumerate(WNIDS):
        for i in range(6):
            _jpeg(
                root / "imagenet" / "train" / wnid / f"{wnid}_{i}.JPEG",
                colours[c],
                rng,
                (48, 40) if i == 0 else (SIZE, SIZE),
            )
        for i in range(2):
            _jpeg(root / "imagenet" / "val" / wnid / f"ILSVRC2012_val_{c}{i}.JPEG", colours[c], rng)
    for c, species in enumerate(SPECIES):
        for split, count in (("train", 5), ("test", 2)):
            for i in range(count):
                _jpeg(root / "birds" / split / species / f"{i + 1}.jpg", colours[3 + c], rng)
    keras.utils.set_random_seed(0)
    reference = keras.applications.MobileNetV2(
        input_shape=(SIZE, SIZE, 3), alpha=WIDTH, weights=None, classes=len(WNIDS), classifier_activation=None
    )
    reference.save_weights(root / "weights.h5")
    return root, reference


def _params(root, **kw):
    return exp.Params.for_scale(
        "paper",
        **{
            "imagenet_root": str(root / "imagenet"),
            "birds_root": str(root / "birds"),
            "imagenet_weights": str(root / "weights.h5"),
            "image_size": SIZE,
            "width": WIDTH,
            "bn_momentum": 0.9,
            "batch_size": 4,
            "baseline_epochs": 1,
            "epochs": 1,
            "alpha": 0.5,
            "alphas": (0.0, 0.5),
            "n": 1,
            "ns": (1, 2),
            "seeds": 1,
            "warmup_steps": 1,
            "timing_steps": 2,
            "tflite_check_steps": 0,
            "bootstrap": 100,
            "thesis_size_check": False,
            **kw,
        },
    )


def test_folders_stream_decoded_resized_images(trees):
    root, _ = trees
    paths, labels, classes = image_folders.scan(root / "imagenet", "train", "layout")
    assert classes == WNIDS and np.bincount(labels).tolist() == [6, 6, 6]
    files = image_folders.ImageFiles(paths, SIZE)
    batch = files[np.array([0, 7])]
    assert files.shape == (18, SIZE, SIZE, 3) and batch.shape == (2, SIZE, SIZE, 3) and batch.dtype == np.float32
    assert 0 <= batch.min() and batch.max() <= 1
    assert batch[0, ..., 0].mean() > 0.7 and batch[1, ..., 1].mean() > 0.7  # red class 0, green class 1
    streamed = np.concatenate(list(files.stream(np.arange(len(files))[::-1], 5)))
    np.testing.assert_array_equal(streamed[-1], files[0])  # the requested order, same pixels
    assert files.take(labels == 2).fingerprint() != files.take(labels == 1).fingerprint()


def test_imagenet_weights_load_into_the_union_label_space(trees):
    root, reference = trees
    model = mobilenet_v2.build(SIZE, 3, len(WNIDS) + len(SPECIES), WIDTH)
    fresh = model.get_layer("predictions").get_weights()[0][:, len(WNIDS) :].copy()
    mobilenet_v2.load_imagenet(model, root / "weights.h5", len(WNIDS))
    x = np.random.default_rng(1).uniform(0, 1, (4, SIZE, SIZE, 3)).astype(np.float32)
    ours = model(x, training=False).numpy()
    theirs = reference(2 * x - 1, training=False).numpy()  # keras.applications' preprocessing: [-1, 1]
    # our model (its own input scaling) vs keras.applications' on 2x - 1: another graph of MobileNetV2's
    # ~4,600 chained terms, a deep chain (the logits are ~1e-11 here: a bare atol would pass anything); a
    # layer loaded into the wrong place changes them by ~100%
    assert_close_float32(ours[:, : len(WNIDS)], theirs, terms=keras_terms(model), deep=True)
    np.testing.assert_array_equal(model.get_layer("predictions").get_weights()[0][:, len(WNIDS) :], fresh)
    with pytest.raises(ValueError, match=r"weights\.h5.*layer 'Conv1'.*same width"):
        mobilenet_v2.load_imagenet(mobilenet_v2.build(SIZE, 3, 5, 1.0), root / "weights.h5", len(WNIDS))
    with pytest.raises(ValueError, match=r"weights\.h5: classifier .* expected 1280 x 4 \(the global classes"):
        mobilenet_v2.load_imagenet(mobilenet_v2.build(SIZE, 3, 5, WIDTH), root / "weights.h5", 4)


def test_wrong_layouts_are_named(trees, tmp_path):
    root, _ = trees
    with pytest.raises(DataError, match=r"<imagenet_root>/train/<wnid>/\*\.JPEG"):
        exp.load_data(exp.Params.for_scale("paper"), log=lambda *_: None)
    with pytest.raises(DataError, match=rf"no folder {tmp_path}/train: expected imagenet_root"):
        exp.load_data(_params(root, imagenet_root=str(tmp_path)), log=lambda *_: None)
    (tmp_path / "train" / "n01440764").mkdir(parents=True)
    (tmp_path / "val" / "n01440764").mkdir(parents=True)
    with pytest.raises(DataError, match=r"n01440764 holds no \.jpg/\.jpeg files: expected imagenet_root"):
        exp.load_data(_params(root, imagenet_root=str(tmp_path)), log=lambda *_: None)
    extra = root / "birds" / "test" / "EXTRA BIRD"
    shutil.copytree(root / "birds" / "test" / "ALBATROSS", extra)
    try:
        with pytest.raises(DataError, match=r"birds/train and .*birds/test have different class folders"):
            exp.load_data(_params(root), log=lambda *_: None)
    finally:
        shutil.rmtree(extra)
    with pytest.raises(DataError, match=r"imagenet_weights: no file at"):
        exp.load_data(_params(root, imagenet_weights=str(tmp_path / "missing.h5")), log=lambda *_: None)


@pytest.mark.slow(reason="every stage of the paper-scale path, on streamed fixture files")
def test_paper_path_runs_every_stage_on_streamed_files(trees, tmp_path):
    root, reference = trees
    params = _params(root)
    data = exp.load_data(params, log=lambda *_: None)
    assert isinstance(data.global_train[0], image_folders.ImageFiles) and data.stand_in is None
    assert (data.global_classes, data.local_classes) == (3, 2)
    assert data.table()["images"].tolist() == [18, 6, 10, 4]
    assert sorted(np.unique(data.local_test[1])) == [3, 4]  # local labels after the 3 ImageNet classes
    pre = exp.pretrain(params, data, log=lambda *_: None)
    personal = exp.Personalizer(params, data, pre)
    x, y, _ = personal.mixed(0.5, params.seed)  # GDM by file list: 3 per ImageNet class + all birds
    assert isinstance(x, image_folders.ImageFiles) and np.bincount(y).tolist() == [3, 3, 3, 5, 5]
    runs = exp.gdm_sweep(params, personal, log=lambda *_: None) + exp.lf_sweep(params, personal, log=lambda *_: None)
    cached = personal.run_fmc(params.alpha, params.n, params.seed, tmp_path, log=lambda *_: None)
    features = np.load(tmp_path / f"train-{params.seed}.npy", mmap_mode="r")
    assert features.shape == (len(x), 1280)  # the cache written once, read memory-mapped
    runs.append(cached)
    equal = exp.fmc_vs_lf(runs, params)
    assert equal["max |weight difference|"].iloc[0] == 0 and equal["global predictions equal"].all()
    time_table = exp.timing(params, data, personal, runs, log=lambda *_: None)
    size_table = exp.cache_size(params, data, pre, log=lambda *_: None)
    result = exp.conclude(params, data, pre, runs, time_table, size_table, None, None, 0.0)
    assert result.stand_in_data is None and "stand-in" not in exp.verdict_text(result.tables["effects"], data.stand_in)
    final = result.tables["final"]
    assert set(final.run) == {"GDM(0)", "GDM(0.5)", "GDM(0.5)+LF(1)", "GDM(0.5)+LF(2)", "GDM(0.5)+LF(1)+FMC"}
    assert final[["global_accuracy", "local_accuracy"]].stack().between(0, 1).all()
    assert size_table["cached bytes per sample"].iloc[0] == 5120
    # the pre-trained model is the ImageNet weights file as it is (pretrain_epochs = 0)
    images, labels = data.global_test[0][np.arange(6)], data.global_test[1]
    expected = reference(2 * images - 1, training=False).numpy().argmax(axis=1) == labels
    np.testing.assert_array_equal(pre.correct["pre-trained"]["global"], expected)


def _audioset_tree(root, class_map):
    """eval_segments.csv in the official format (comment lines, ', ' separators, quoted mids) and
    three generated 16-bit wavs at 44.1 kHz, one of them without a YAMNet label."""
    import wave

    mids = class_map.mid.tolist()
    lines = [
        "# Segments csv created Sun Mar  5 10:54:25 2017",
        "# num_ytids=3, num_segs=3, num_unique_labels=4, num_positive_labels=5",
        "# YTID, start_seconds, end_seconds, positive_labels",
        f'--4gqARaEJE, 0.000, 10.000, "{mids[0]},{mids[137]}"',
        f'--BfvyPmVMo, 20.000, 30.000, "{mids[500]}"',
        '--U7joUcTCo, 0.000, 10.000, "/m/notinyamnet"',
        f'--i-y1v8Hy8, 0.000, 10.000, "{mids[3]}"',
    ]  # listed, not downloaded
    (root / "audio").mkdir(parents=True)
    (root / "eval_segments.csv").write_text("\n".join(lines) + "\n")
    rng = np.random.default_rng(0)
    for name in ("--4gqARaEJE_0", "--BfvyPmVMo_20", "--U7joUcTCo_0"):
        with wave.open(str(root / "audio" / f"{name}.wav"), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(44100)
            w.writeframes((rng.uniform(-0.3, 0.3, 44100 * 2) * 32767).astype("<i2").tobytes())


def test_audioset_evaluation_set_in_the_official_format(tmp_path):
    import pandas as pd

    from ondevice.data import manifests

    class_map = pd.read_csv(manifests.resolve("yamnet", "class_map"))
    _audioset_tree(tmp_path, class_map)
    names = class_map.display_name.tolist()
    meta, waves, labels = audio_data.load_audioset(tmp_path, names)
    assert meta.filename.tolist() == ["--4gqARaEJE_0.wav", "--BfvyPmVMo_20.wav"]
    assert [np.flatnonzero(row).tolist() for row in labels] == [[0, 137], [500]] and meta.target.tolist() == [0, 500]
    assert [len(w) for w in waves] == [32000, 32000]  # 2 s resampled to 16 kHz
    params = moil_audio.Params.for_scale(
        "smoke", audioset_root=str(tmp_path), global_classes=0, local_classes=2, global_eval_fraction=0.5
    )
    data = moil_audio.load_data(params, log=lambda *_: None)
    assert len(data.global_pool) + len(data.global_eval) == 2 and data.global_categories == ["AudioSet evaluation set"]
    (tmp_path / "eval_segments.csv").unlink()
    with pytest.raises(DataError, match=r"eval_segments\.csv \(the official CSV"):
        audio_data.load_audioset(tmp_path, names)


def _official_yamnet() -> keras.Model:
    """YAMNet as the tensorflow/models code builds it (its layer names; the logits Dense unnamed)."""
    patches = keras.Input((yamnet.PATCH_FRAMES, yamnet.MEL_BINS))
    x = keras.layers.Reshape((yamnet.PATCH_FRAMES, yamnet.MEL_BINS, 1))(patches)

    def bn_relu(x, name):
        x = keras.layers.BatchNormalization(name=f"{name}/bn", center=True, scale=False, epsilon=1e-4)(x)
        return keras.layers.ReLU(name=f"{name}/relu")(x)

    for i, (kind, stride, filters) in enumerate(yamnet.LAYERS, 1):
        if kind == "conv":
            x = bn_relu(
                keras.layers.Conv2D(filters, 3, stride, "same", use_bias=False, name=f"layer{i}/conv")(x),
                f"layer{i}/conv",
            )
        else:
            x = bn_relu(
                keras.layers.DepthwiseConv2D(3, stride, "same", use_bias=False, name=f"layer{i}/depthwise_conv")(x),
                f"layer{i}/depthwise_conv",
            )
            x = bn_relu(
                keras.layers.Conv2D(filters, 1, 1, "same", use_bias=False, name=f"layer{i}/pointwise_conv")(x),
                f"layer{i}/pointwise_conv",
            )
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(patches, keras.layers.Dense(yamnet.CLASSES)(x))


def test_yamnet_h5_with_the_official_names_round_trips(tmp_path):
    ours = yamnet.build(seed=3)
    rng = np.random.default_rng(0)
    ours.set_weights([w + rng.normal(0, 0.01, w.shape).astype(np.float32) for w in ours.get_weights()])
    for layer in ours.layers:  # non-trivial moving statistics
        if isinstance(layer, keras.layers.BatchNormalization):
            beta, mean, var = layer.get_weights()
            layer.set_weights([beta, rng.normal(0, 0.1, mean.shape), rng.uniform(0.5, 2, var.shape)])
    official = _official_yamnet()
    official.set_weights(ours.get_weights())  # same weighted layers in the same order
    official.save_weights(tmp_path / "yamnet.h5")
    loaded = yamnet.load_h5(yamnet.build(seed=9), tmp_path / "yamnet.h5")
    x = rng.normal(0, 1, (3, yamnet.PATCH_FRAMES, yamnet.MEL_BINS)).astype(np.float32)
    # same code path: the same architecture with the same weights (their exact round trip is checked below)
    np.testing.assert_allclose(loaded(x, training=False).numpy(), ours(x, training=False).numpy(), atol=1e-5)
    # the official code's model: other layers (a Reshape, its own batch norms), YAMNet's ~6,100 chained terms
    assert_close_float32(
        official(x, training=False).numpy(), ours(x, training=False).numpy(), terms=keras_terms(ours), deep=True
    )
    ours.save_weights(tmp_path / "ours.h5")  # our own names are not the published layout
    with pytest.raises(ValueError, match=r"ours\.h5: no weighted layer 'layer1/conv'.*layer1/conv/bn"):
        yamnet.load_h5(yamnet.build(), tmp_path / "ours.h5")
    params = moil_audio.Params.for_scale("smoke", yamnet_h5=str(tmp_path / "yamnet.h5"))
    weights, source = audio_model._import_weights(params, log=lambda *_: None)
    assert source.startswith("yamnet.h5") and all(np.array_equal(a, b) for a, b in zip(weights, ours.get_weights()))
