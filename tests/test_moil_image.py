"""MoIL's image experiment: its data (Fashion-MNIST through a Debian package or gzip sources,
scikit-learn's digits), its parameters and its statistics. The notebook itself runs at smoke
scale in tests/test_notebooks.py; the techniques are tested in tests/test_moil_techniques.py."""

import gzip
import hashlib
import shutil

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras
import yaml

from numerics import assert_close_float32
from ondevice.data import digits, fashion_mnist, manifests
from ondevice.data.manifests import DataError
from ondevice.papers.moil import image_data, protocol, report
from ondevice.papers.moil.experiments import moil_image as exp
from ondevice.params import ParameterError
from ondevice.tasks.classification import ClassificationTask
from ondevice.training.trainer import Plateau, Trainer


def _idx(labels: np.ndarray) -> bytes:
    return bytes([0, 0, 0x08, 1]) + np.array([len(labels)], ">u4").tobytes() + labels.astype(np.uint8).tobytes()


def _manifest(tmp_path, content: bytes, sources: list) -> manifests.Manifest:
    doc = {
        "name": "toy_idx",
        "description": "d",
        "license": "MIT",
        "citation": "c",
        "scales": ["smoke"],
        "layout": {"labels": "labels-idx1-ubyte"},
        "artifacts": [
            {
                "file": "labels-idx1-ubyte",
                "sha256": hashlib.sha256(content).hexdigest(),
                "size": len(content),
                "sources": sources,
            }
        ],
    }
    path = tmp_path / "toy_idx.yaml"
    path.write_text(yaml.safe_dump(doc))
    return manifests.load(path)


def test_gunzip_source_verifies_the_decompressed_artifact(tmp_path, monkeypatch):
    monkeypatch.setenv("ONDEVICE_DATA_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("ONDEVICE_DATA_MIRROR", str(tmp_path / "mirror"))
    content = _idx(np.arange(7) % 3)
    (tmp_path / "mirror").mkdir()
    (tmp_path / "mirror" / "labels.gz").write_bytes(gzip.compress(content))
    m = _manifest(tmp_path, content, [{"kind": "mirror", "path": "labels.gz", "gunzip": True}])
    path = manifests.resolve(m, "labels")
    assert path.read_bytes() == content and not list(path.parent.glob(".*"))
    assert fashion_mnist.read_idx(path).tolist() == [0, 1, 2, 0, 1, 2, 0]


def test_manifest_rejects_incomplete_debian_sources(tmp_path):
    with pytest.raises(DataError, match="debian source needs"):
        _manifest(tmp_path, b"x", [{"kind": "debian", "package": "dataset-fashion-mnist"}])
    with pytest.raises(DataError, match="gunzip"):
        _manifest(tmp_path, b"x", [{"kind": "mirror", "path": "a", "gunzip": "yes"}])


def test_unknown_debian_package_is_a_clear_error(tmp_path, monkeypatch):
    if shutil.which("apt-get") is None:
        pytest.skip("not a Debian-based system")
    monkeypatch.setenv("ONDEVICE_DATA_CACHE", str(tmp_path / "cache"))
    m = _manifest(
        tmp_path, b"x", [{"kind": "debian", "package": "ondevice-no-such-package", "version": "1.0", "path": "a"}]
    )
    with pytest.raises(DataError, match="apt-get download ondevice-no-such-package=1.0 failed"):
        manifests.fetch(m, verbose=False)


def test_fashion_mnist_from_the_debian_package(tmp_path, monkeypatch):
    """The real package, fetched without root (`apt-get download` + `dpkg-deb -x`), verified
    against the manifest's checksums; only its smallest file is kept."""
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        pytest.skip("not a Debian-based system")
    monkeypatch.setenv("ONDEVICE_DATA_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("ONDEVICE_DATA_MIRROR", raising=False)
    m = manifests.load("fashion_mnist")
    artifact = next(a for a in m.artifacts if a.file == "t10k-labels-idx1-ubyte")
    debian = next(s for s in artifact.sources if s["kind"] == "debian")
    only_debian = manifests.Artifact(artifact.file, artifact.sha256, artifact.size, (debian,))
    labels = fashion_mnist.read_idx(manifests.fetch_artifact(m, only_debian, verbose=False))
    assert labels.shape == (10000,) and np.bincount(labels).tolist() == [1000] * 10


def test_read_idx_rejects_other_files(tmp_path):
    bad = tmp_path / "bad"
    bad.write_bytes(b"\x00\x00\x0d\x01\x00\x00\x00\x01\x00")
    with pytest.raises(ValueError, match="not an idx file"):
        fashion_mnist.read_idx(bad)
    short = tmp_path / "short"
    short.write_bytes(_idx(np.arange(4))[:-1])
    with pytest.raises(ValueError, match="holds 3"):
        fashion_mnist.read_idx(short)


def test_digits_are_bundled_and_recorded():
    x, y = digits.load()
    assert x.shape == (1797, 8, 8) and 0 <= x.min() and x.max() == 1.0 and set(y) == set(range(10))
    summary = digits.summary("birds")
    assert summary["stand_in_for"] == "birds" and len(summary["artifacts"][0]["sha256"]) == 64


@pytest.mark.parametrize(
    "bad",
    [
        dict(alphas=(0.05, 0.2)),
        dict(alpha=0.3),
        dict(ns=(1,)),
        dict(n=20, ns=(1, 20)),
        dict(image_size=16),
        dict(global_data="cifar"),
        dict(bn_momentum=1.0),
    ],
)
def test_impossible_parameters_are_refused(bad):
    with pytest.raises(ParameterError):
        exp.Params.for_scale("smoke", **bad)


def test_paper_scale_names_the_manual_downloads():
    params = exp.Params.for_scale("paper")
    with pytest.raises(DataError, match=r"<imagenet_root>/train/<wnid>/\*\.JPEG"):
        exp.load_data(params, log=lambda *_: None)


def test_per_class_sample_is_balanced_and_resize_keeps_the_range():
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(4), 10)
    idx = image_data._per_class(labels, 10, rng)
    assert np.bincount(labels[idx]).tolist() == [3, 3, 2, 2] and len(set(idx)) == 10
    images = np.random.default_rng(1).integers(0, 256, (3, 28, 28)).astype(np.uint8)
    out = image_data._resize(images, 32, 255.0)
    assert out.shape == (3, 32, 32, 1) and out.dtype == np.float32 and 0 <= out.min() and out.max() <= 1


def test_bootstrap_difference_and_verdicts():
    rng = np.random.default_rng(0)
    same = rng.random((2, 200)) < 0.7
    r = report.accuracy_difference(same, same, rng, 500)
    assert r["our change"] == 0 and r["ci low"] == r["ci high"] == 0 and r["verdict"] == "within noise"
    better = np.ones((2, 200), bool)
    worse = rng.random((2, 200)) < 0.5
    r = report.accuracy_difference(better, worse, rng, 500)
    assert r["ci low"] <= r["our change"] <= r["ci high"] and r["verdict"] == "holds"
    assert report.accuracy_difference(worse, better, rng, 500)["verdict"] == "does not hold"


def test_bootstrap_difference_resamples_seeds_too():
    worse = np.zeros((3, 100))
    better = np.stack([np.arange(100) < k for k in (0, 10, 20)]).astype(float)  # seed s is better on 10 s samples
    r = report.accuracy_difference(better, worse, np.random.default_rng(0), 2000)
    assert r["our change"] == pytest.approx(0.1)
    assert r["ci low"] < 0.03 and r["ci high"] > 0.17  # resampling samples alone gives about 0.06 to 0.14


def test_holdout_losses_are_the_softmax_cross_entropy():
    rng = np.random.default_rng(0)
    logits, labels = rng.normal(scale=30, size=(50, 7)).astype(np.float32), rng.integers(0, 7, 50)
    ours = image_data.losses(lambda x: x, (logits, labels))
    reference = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits).numpy()
    # ours in float64 vs TensorFlow's float32: logits - max (up to ~150 here), the 7-class sum of exps, its log
    # and the label's logit subtracted, so that many eps of the largest loss; a wrong label costs ~10s
    assert_close_float32(ours, reference, terms=7 + 3)


def test_track_stops_on_the_plateau_and_keeps_the_lowest_epoch():
    """A real model trained epoch by epoch; the held-out loss (scripted) falls for two epochs, then
    rises: with patience 2, training stops after epoch 4 and the model holds epoch 2's weights."""
    model = keras.Sequential([keras.layers.Input((4,)), keras.layers.Dense(3)])
    trainer = Trainer(model, ClassificationTask((4,), 3), 0.5, "sgd")
    rng = np.random.default_rng(0)
    data = rng.normal(size=(32, 4)).astype(np.float32), rng.integers(0, 3, 32).astype(np.int32)
    scripted, weights = iter([5.0, 3.0, 2.0, 2.5, 2.4, 1.0]), {}

    def evaluate():
        weights[len(weights)] = model.get_weights()
        return {"global": np.ones(3, bool), "holdout_loss": np.array([next(scripted)])}

    stop = Plateau(2, 0.01, keep_lowest=True)
    rows, scores = protocol.track(trainer, data, 10, 8, rng, evaluate, "accuracy", lambda _: None, "toy", stop=stop)
    assert [r["epoch"] for r in rows] == [0, 1, 2, 3, 4] and rows.best_epoch == 2 and rows.plateau
    assert [r["holdout_loss"] for r in rows] == [5.0, 3.0, 2.0, 2.5, 2.4] and "global_accuracy" in rows[1]
    for kept, now in zip(weights[2], model.get_weights()):
        np.testing.assert_array_equal(kept, now)
    assert set(scores) == {"global"}
