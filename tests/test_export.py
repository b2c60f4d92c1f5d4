"""On-device artifacts: the reuse export (its training against TensorFlow's: test_step_parity.py)
round-trips through save/restore, its Flex ops are inventoried, and the standalone runner
personalises an exported file from a user data file and writes a timing log (a device profile)."""

import json
import struct
import subprocess
import sys

import numpy as np
import pytest
import tf_keras as keras

from ondevice import REPO_ROOT
from ondevice.data.typing_samples import Vocabulary, build_samples, sentences
from ondevice.device import device_profile, tflite, tflite_reuse
from ondevice.models import lstm_lm
from ondevice.papers.deeptype import export, protocol
from ondevice.tasks.classification import ClassificationTask
from ondevice.tasks.next_word import NextWordTask
from ondevice.training import inference_reuse
from ondevice.training.step import Step
from ondevice.training.trainer import seed_everything


@pytest.fixture(scope="module")
def exported():
    seed_everything(0)
    sents = sentences("To be, or not to be, that is the question. Whether 'tis nobler in the mind to suffer. " * 8)
    vocab = Vocabulary.from_sentences(sents, 20)
    samples = build_samples(sents, vocab, 4)
    model = lstm_lm.build(lstm_lm.LSTMConfig(vocab.input_size, vocab.size, 8, 12), seed=0)
    task = NextWordTask()
    flatbuffer = tflite.convert(inference_reuse.OnlineTrainer(model, task, 0.05), tflite.REUSE_SIGNATURES)
    data = protocol.user_batches(samples, 16)
    batches = [(data["tokens"][i, :, :n], data["labels"][i, :, :n]) for i, n in enumerate(data["lengths"])]
    return model, task, flatbuffer, data, batches


def test_save_new_interpreter_restore_infer_reproduces(exported, tmp_path):
    _, _, flatbuffer, _, batches = exported
    trained = tflite.interpreter(flatbuffer)
    for x, y in batches[:3]:
        trained.get_signature_runner("train")(tokens=x, labels=y)
    probe = batches[0][0]
    expected = trained.get_signature_runner("infer")(tokens=probe)["logits"]
    ckpt = np.array(str(tmp_path / "personal.ckpt").encode())
    trained.get_signature_runner("save")(checkpoint_path=ckpt)
    fresh = tflite.interpreter(flatbuffer)
    assert not np.allclose(fresh.get_signature_runner("infer")(tokens=probe)["logits"], expected, atol=1e-4)
    fresh.get_signature_runner("restore")(checkpoint_path=ckpt)
    np.testing.assert_allclose(fresh.get_signature_runner("infer")(tokens=probe)["logits"], expected, atol=1e-6)


def test_flex_inventory(exported):
    _, _, flatbuffer, _, _ = exported
    ops = tflite_reuse.flex_ops(flatbuffer)
    assert {"Save", "Restore"} <= set(ops) and any(op.startswith("TensorList") for op in ops)
    dense = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    module = Step(dense, ClassificationTask((4,), 3), 0.1)
    assert tflite_reuse.flex_ops(tflite.convert(module, ("infer",))) == []
    # a name is a Select op only as a whole flatbuffer string: length prefix and NUL must agree
    fake = b"\x00" * 8 + struct.pack("<I", 7) + b"FlexFoo\x00" + b"xxFlexBar\x00"
    assert tflite_reuse.flex_ops(fake) == ["Foo"]


def test_manifest_entry_lists_signatures_shapes_and_flex(exported):
    _, _, flatbuffer, data, _ = exported
    entry = export.describe(flatbuffer)
    assert set(entry["signatures"]) == set(tflite.REUSE_SIGNATURES)
    assert entry["signatures"]["train_from_cache"]["inputs"]["features"]["shape"] == [-1, -1, 12]
    assert entry["signatures"]["train"]["inputs"]["tokens"]["dtype"] == "int32"
    assert entry["needs_flex"] and entry["size_bytes"] == len(flatbuffer)
    json.dumps(entry)
    assert data["tokens"].shape == data["labels"].shape and data["tokens"].shape[1] == 16
    assert (data["lengths"] <= data["tokens"].shape[2]).all()


def test_runner_personalises_an_exported_file_and_writes_a_device_profile(exported, tmp_path):
    _, _, flatbuffer, data, _ = exported
    (tmp_path / "m.tflite").write_bytes(flatbuffer)
    np.savez(tmp_path / "user_0.npz", **data)
    log = tmp_path / "log.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "tools" / "ondevice_runner.py"),
            "--model",
            str(tmp_path / "m.tflite"),
            "--data",
            str(tmp_path / "user_0.npz"),
            "--out",
            str(log),
            "--reuse",
            "--warmup",
            "1",
            "--device",
            "test-board",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    profile = device_profile.load_device_profile(log)
    assert profile["device"] == "test-board" and profile["variant"] == "m+reuse"
    assert profile["steps"] == len(data["lengths"]) == len(profile["step_seconds"]) == len(profile["inference_seconds"])
    assert profile["peak_rss_mb"] > 10 and profile["restore_max_abs_diff"] < 1e-5
    assert np.all(np.isfinite(profile["losses"]))
    e = device_profile.extrapolate_seconds(profile, 10, profile["mean_length"] * 2)
    assert e["label"] == "extrapolated" and e["seconds"] == pytest.approx(20 * profile["steady_step_seconds"])
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "something else"}))
    with pytest.raises(ValueError, match="not a device profile"):
        device_profile.load_device_profile(bad)
