"""YAMNet: MoIL's layer count, the front end, and the weights imported from the published TFLite
model agreeing with that model on real ESC-50 clips."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from ondevice.data import audio_features, esc50, manifests
from ondevice.device import yamnet_tflite
from ondevice.device.tflite import interpreter
from ondevice.models import yamnet
from ondevice.papers.moil.techniques import layer_freezing


@pytest.fixture(scope="module")
def tflite_path():
    try:
        return manifests.resolve("yamnet", "tflite")
    except manifests.DataError as exc:
        pytest.skip(f"yamnet.tflite unavailable: {exc}")


@pytest.fixture(scope="module")
def imported(tflite_path):
    return yamnet_tflite.import_tflite(yamnet.build(), tflite_path)


@pytest.fixture(scope="module")
def clips():
    try:
        return esc50.load_declared()
    except manifests.DataError as exc:
        pytest.skip(f"ESC-50 unavailable: {exc}")


def test_units_are_the_thesis_layers():
    model = yamnet.build()
    units = yamnet.units(model)
    assert len(units) == 15  # 14 conv layers + the classifier
    layers = [l for u in units for l in u]
    assert len(layers) == len(set(map(id, layers))) == len(model.layers) - 1  # every layer but the input, once
    assert [l.name for l in units[-1]] == ["classifier_pool", "classifier_logits"]
    # LF(3) caches the output of layer 12: 6 x 4 x 512 per patch, 960 KB per 10 s (thesis footnote 6)
    frozen, head = layer_freezing.split(model, 3, yamnet.units)
    assert frozen.output_shape[1:] == (6, 4, 512)
    per_10s = audio_features.patches_per_clip(10 * 16000) * 6 * 4 * 512 * 4
    assert per_10s == 960 * 1024
    with pytest.raises(ValueError, match="not a YAMNet"):
        yamnet.units(keras.Sequential([keras.layers.Dense(2, input_shape=(3,))]))


def test_patches_follow_yamnet_framing():
    assert audio_features.patches(np.zeros(80000)).shape == (10, 96, 64)  # a 5 s ESC-50 clip
    assert audio_features.patches_per_clip(160000) == 20  # 10 s of AudioSet
    assert audio_features.patches(np.zeros(15600)).shape == (1, 96, 64)  # what yamnet.tflite takes
    assert audio_features.patches(np.zeros(100)).shape == (1, 96, 64)  # padded up to one patch
    with pytest.raises(ValueError, match="1-D"):
        audio_features.patches(np.zeros((2, 100)))


def test_front_end_is_the_tflite_front_end_without_rounding(tflite_path):
    """The TFLite front end's window is ours exactly; its DFT and mel matrices are ours rounded to int8."""
    interp = interpreter(tflite_path.read_bytes())
    by_name = {t["name"]: t["index"] for t in interp.get_tensor_details()}
    read = lambda name: yamnet_tflite._tflite_tensor(interp, by_name[name])  # noqa: E731
    window = read("yamnet_frames/tf_op_layer_Mul/Mul/y")[0]
    np.testing.assert_allclose(window, tf.signal.hann_window(400).numpy(), atol=1e-6)
    cos = read("yamnet_frames/tf_op_layer_MatMul/MatMul")
    k, n = np.arange(257)[:, None], np.arange(512)
    assert np.abs(cos - np.cos(2 * np.pi * k * n / 512)).max() <= 0.5 / 127 + 1e-6
    mel = read("yamnet_frames/tf_op_layer_MatMul_2/MatMul_2").T
    ours = tf.signal.linear_to_mel_weight_matrix(64, 257, 16000, 125.0, 7500.0).numpy()
    assert np.abs(mel - ours).max() <= 0.51 * 0.00784401036798954


def test_imported_weights_agree_with_tflite_on_real_clips(imported, tflite_path, clips):
    interp = interpreter(tflite_path.read_bytes())
    inp = interp.get_input_details()[0]["index"]
    out = {o["name"]: o["index"] for o in interp.get_output_details()}
    fold4 = np.flatnonzero(clips.meta.fold.to_numpy() == 4)[::10]  # 40 clips, all 50 classes' fold
    net_diff, net_top, e2e_top, e2e_diff = [], [], [], []
    for i in fold4:
        x = clips.waveform(i)[16000 : 16000 + audio_features.PATCH_SAMPLES]  # one patch from 1 s in
        interp.set_tensor(inp, x[None])
        interp.invoke()
        ref, ref_mel = interp.get_tensor(out["Identity"])[0], interp.get_tensor(out["Identity_1"])
        ours_net = tf.sigmoid(imported(ref_mel[None])).numpy()[0]
        ours = tf.sigmoid(imported(audio_features.patches(x))).numpy()[0]
        net_diff.append(np.abs(ours_net - ref).max())
        net_top.append(ours_net.argmax() == ref.argmax())
        e2e_top.append(ours.argmax() == ref.argmax())
        e2e_diff.append(np.abs(ours - ref).mean())
    # the network alone: differences only from TFLite's int8 arithmetic on activations (hybrid
    # kernels quantise each layer's input); on 1 of these 40 clips (a loud vacuum cleaner) the two
    # disagree entirely, on the rest the top class is the same
    assert np.mean(net_top) >= 0.95 and np.median(net_diff) < 0.03 and np.quantile(net_diff, 0.9) < 0.1
    # end to end, the TFLite front end's int8 DFT changes quiet bins; the ranking mostly survives
    assert np.mean(e2e_top) >= 0.75 and np.median(e2e_diff) < 0.005


def test_import_checks_the_model(tflite_path):
    with pytest.raises(ValueError, match="classifier"):
        yamnet_tflite.import_tflite(yamnet.build(classes=10), tflite_path)


def test_class_names_read_and_checked(tmp_path, tflite_path):
    names = yamnet.class_names(manifests.resolve("yamnet", "class_map"))
    assert len(names) == 521 and names[0] == "Speech" and names[69] == "Dog"
    bad = tmp_path / "map.csv"
    bad.write_text("index,name\n0,Speech\n")
    with pytest.raises(ValueError, match="display_name"):
        yamnet.class_names(bad)
