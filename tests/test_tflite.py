"""The exported personal model trains through the TFLite interpreter (Flex delegate) exactly as in
TensorFlow, for any task's signature, and its save/restore signatures round-trip the weights."""

import numpy as np
import pytest
import tf_keras as keras

from numerics import assert_close_float32, float32_sum_tolerance, lstm_terms
from ondevice.data.typing_samples import Vocabulary, build_samples, sentences
from ondevice.device import tflite
from ondevice.models import lstm_lm
from ondevice.tasks.classification import ClassificationTask
from ondevice.tasks.next_word import NextWordTask
from ondevice.training.trainer import Hook, seed_everything


@pytest.fixture(scope="module")
def next_word():
    seed_everything(0)
    sents = sentences("To be, or not to be, that is the question. Whether 'tis nobler in the mind to suffer. " * 5)
    vocab = Vocabulary.from_sentences(sents, 20)
    samples = build_samples(sents, vocab, 4)
    model = lstm_lm.build(lstm_lm.LSTMConfig(vocab.input_size, vocab.size, 8, 12), seed=0)
    # batches of different shapes: the exported signatures take any batch and sequence length
    batches = [samples.padded(np.arange(i, i + n)) for i, n in ((0, 4), (4, 3), (10, 5))]
    assert len({x.shape for x, _ in batches}) == 3
    return model, NextWordTask(), batches


@pytest.mark.slow(reason="a Flex-mode conversion of the training signatures, then steps in both runtimes")
def test_tflite_training_matches_tensorflow_and_really_trains(next_word):
    model, task, batches = next_word
    before = model(batches[0][0]).numpy()
    same_batch = [batches[0]] * 4  # the loss on one repeated batch falls only if the weights change
    result = tflite.compare_training(model, task, 0.05, same_batch)
    # TensorFlow vs TFLite kernels: a loss sums the 2 LSTM layers' gate terms over the batch's length, the
    # softmax's 12 + 1, the ~20-word log-sum-exp and the mean over positions (earlier steps' rounding moves
    # the weights by lr x that relative error of the gradient: negligible on the loss). The outputs after
    # 4 steps differ by that forward error plus each step's gradient error (as long a chain again) on
    # how far training moved them, > 1e-3 (below): a step at another lr changes them 10x the tolerance.
    x = batches[0][0]
    terms = lstm_terms(x.shape[1], 8, 12) + 13 + 20 + x.size
    assert_close_float32(result["tflite"], result["tensorflow"], terms=terms)
    assert all(b < a for a, b in zip(result["tflite"], result["tflite"][1:]))
    outputs = result["outputs_tensorflow"]
    moved = np.abs(outputs - before).max()
    atol = float32_sum_tolerance(terms, np.abs(outputs).max()) + float32_sum_tolerance(4 * terms, moved)
    np.testing.assert_allclose(result["outputs_tflite"], outputs, rtol=0, atol=atol)
    assert not np.allclose(result["outputs_tflite"], before, atol=1e-3)
    np.testing.assert_array_equal(model(batches[0][0]).numpy(), before)  # the model itself is untouched


def test_infer_matches_keras_and_save_restore_round_trips(next_word, tmp_path):
    model, task, batches = next_word
    flatbuffer = tflite.convert(tflite.TrainableModel(model, task, 0.01))
    trained = tflite.interpreter(flatbuffer)
    x = batches[1][0]
    # logits through TFLite's and TensorFlow's kernels: the LSTM chain, then 12 + 1 terms
    assert_close_float32(tflite.infer_on_device(trained, task, x), model(x).numpy(), lstm_terms(x.shape[1], 8, 12) + 13)
    tflite.train_on_device(trained, task, batches)
    after = tflite.infer_on_device(trained, task, x)
    assert not np.allclose(after, model(x).numpy())
    ckpt = str(tmp_path / "personal.ckpt")
    trained.get_signature_runner("save")(checkpoint_path=np.array(ckpt.encode()))
    fresh = tflite.interpreter(flatbuffer)
    fresh.get_signature_runner("restore")(checkpoint_path=np.array(ckpt.encode()))
    np.testing.assert_allclose(tflite.infer_on_device(fresh, task, x), after, atol=1e-6)


def test_a_classification_task_exports_with_its_own_signature_and_hooks():
    """An image classifier: float images in, class ids as labels; with a hook that trains only
    the last layer, on device as in TensorFlow."""
    seed_everything(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 8, 8, 1)).astype("float32")
    y = rng.integers(0, 3, size=8).astype("int32")
    model = keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(4, 3, name="conv"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(3, name="head"),
        ]
    )

    class HeadOnly(Hook):
        def trainable(self, m, variables):
            return list(m.get_layer("head").trainable_variables)

    task = ClassificationTask((8, 8, 1), 3)
    result = tflite.compare_training(model, task, 0.1, [(x, y)] * 3, optimizer="sgd", hooks=[HeadOnly()])
    # TensorFlow vs TFLite: a 3x3 convolution (9 terms), the mean of its 6 x 6 outputs, the head's 4 + 1
    # terms, the 3-class log-sum-exp and the batch mean of 8
    assert_close_float32(result["tflite"], result["tensorflow"], terms=9 + 36 + 5 + 3 + 8)
    assert result["tflite"][-1] < result["tflite"][0]
    interp = tflite.interpreter(result["flatbuffer"])
    inputs = interp.get_signature_runner("train").get_input_details()
    assert set(inputs) == {"inputs", "labels"}


@pytest.mark.slow(reason="two conversions (Flex and builtin) of the training graph, then steps in each")
def test_parity_table_has_a_column_per_export_mode(next_word):
    """The one parity table: TensorFlow, the Flex export and the builtin export on the same steps."""
    model, task, batches = next_word
    table, flatbuffer = tflite.parity_table(model, task, 0.05, batches, "sgd")
    assert len(table) == len(batches) and flatbuffer
    assert (table.builtin == "all").all()
    # as in test_tflite_training_matches_tensorflow_and_really_trains, each step on its own batch
    terms = max(lstm_terms(x.shape[1], 8, 12) + 13 + 20 + x.size for x, _ in batches)
    assert_close_float32(table.loss_builtin, table.loss_tensorflow, terms=terms)
    assert_close_float32(table.loss_tflite, table.loss_tensorflow, terms=terms)
    assert table.max_weight_difference_builtin.iloc[0] < 1e-4


def test_parity_table_says_why_a_set_up_has_no_builtin_form():
    """A conv layer that trains has no builtin gradient kernel: the Flex columns stay, the builtin
    ones are empty and say why."""
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(4, 6, 6, 1)).astype("float32"), rng.integers(0, 2, size=4).astype("int32")
    model = keras.Sequential(
        [
            keras.Input((6, 6, 1)),
            keras.layers.Conv2D(2, 3, name="conv"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(2, name="head"),
        ]
    )
    table, _ = tflite.parity_table(model, ClassificationTask((6, 6, 1), 2), 0.1, [(x, y)] * 2, "sgd")
    assert table.loss_builtin.isna().all() and table.loss_tflite.notna().all()
    assert table.builtin.iloc[0].startswith("no builtin form:") and "conv" in table.builtin.iloc[0]
