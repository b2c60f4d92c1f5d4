"""The exported personal model trains through the TFLite interpreter (Flex delegate) exactly as in
TensorFlow, and its save/restore signatures round-trip the weights."""
import numpy as np
import pytest

from ondevice.device import tflite
from ondevice.data.typing_samples import Vocabulary, build_samples, sentences
from ondevice.models import lstm_lm
from ondevice.training.trainer import seed_everything


@pytest.fixture(scope="module")
def exported():
    seed_everything(0)
    sents = sentences("To be, or not to be, that is the question. Whether 'tis nobler in the mind to suffer. " * 5)
    vocab = Vocabulary.from_sentences(sents, 20)
    samples = build_samples(sents, vocab, 4)
    model = lstm_lm.build(vocab.input_size, vocab.size, 8, 12)
    # batches of different lengths: the exported signatures take any batch and sequence length
    batches = [samples.padded(np.arange(i, i + n)) for i, n in ((0, 4), (4, 3), (10, 5))]
    assert len({x.shape for x, _ in batches}) == 3
    return model, batches


def test_tflite_training_gives_the_same_losses_as_tensorflow(exported):
    model, batches = exported
    result = tflite.compare_training(model, 0.01, batches)
    np.testing.assert_allclose(result["tflite"], result["tensorflow"], rtol=1e-5)
    assert result["tflite"][-1] != result["tflite"][0]  # the weights really changed between steps


def test_infer_matches_keras_and_save_restore_round_trips(exported, tmp_path):
    model, batches = exported
    flatbuffer = tflite.convert(tflite.TrainableModel(model, 0.01))
    trained = tflite.interpreter(flatbuffer)
    x = batches[0][0]
    np.testing.assert_allclose(trained.get_signature_runner("infer")(tokens=x)["logits"], model(x).numpy(), atol=1e-5)
    tflite.train_on_device(trained, batches)
    after = trained.get_signature_runner("infer")(tokens=x)["logits"]
    assert not np.allclose(after, model(x).numpy())
    ckpt = str(tmp_path / "personal.ckpt")
    trained.get_signature_runner("save")(checkpoint_path=np.array(ckpt.encode()))
    fresh = tflite.interpreter(flatbuffer)
    fresh.get_signature_runner("restore")(checkpoint_path=np.array(ckpt.encode()))
    np.testing.assert_allclose(fresh.get_signature_runner("infer")(tokens=x)["logits"], after, atol=1e-6)
