"""DeepType's on-device optimisations (Sec. 5.1-5.4) as composable transforms and hooks, with
real TensorFlow: SVD and vocabulary compression of the softmax, bucketing batch sources, and the
combined variant trained, exported to TFLite and parity-checked."""

import numpy as np
import pytest

from numerics import assert_close_float32, float32_sum_tolerance, lstm_terms
from ondevice.data.typing_samples import PAD_ID, UNK_ID, Vocabulary, build_samples, sentences
from ondevice.device import parity
from ondevice.models import lstm_lm
from ondevice.models import svd_compression as svd
from ondevice.papers.deeptype.techniques import svd_retrain
from ondevice.papers.deeptype.techniques import vocab_compression as vc
from ondevice.tasks.next_word import NextWordTask
from ondevice.training import bucketing as bk
from ondevice.training.fine_tune import FineTune
from ondevice.training.trainer import Trainer

TEXT = (
    "to be or not to be that is the question. whether tis nobler in the mind to suffer the slings "
    "and arrows of outrageous fortune. or to take arms against a sea of troubles and by opposing end them. "
    "to die to sleep no more. and by a sleep to say we end the heartache."
) * 3


@pytest.fixture(scope="module")
def setup():
    sents = sentences(TEXT)
    vocab = Vocabulary.from_sentences(sents, 30)
    samples = build_samples(sents, vocab, context_words=3)
    config = lstm_lm.LSTMConfig(vocab.input_size, vocab.size, 8, 12)
    return vocab, samples, config


def _tokens(samples, n=6):
    return samples.padded(np.arange(n))


def test_svd_full_rank_reproduces_logits_and_small_rank_saves_parameters(setup):
    _, samples, config = setup
    model = lstm_lm.build(config, seed=3)
    x, _ = _tokens(samples)
    full = svd.compress(model, min(config.hidden_units, config.output_vocab))
    # another model over the same LSTM weights (its chain of gate sums), then h @ U @ V (12 + 12 terms and
    # the SVD's own rounding, a few eps of the kernel) vs h @ W (12); rank 2 changes logits by ~1e-2
    assert_close_float32(full(x).numpy(), model(x).numpy(), terms=lstm_terms(x.shape[1], 8, 12) + 12 + 12 + 13)
    small = svd.compress(model, 2)
    assert small.count_params() < model.count_params()
    assert [layer.name for layer in small.layers][-2:] == ["softmax_svd", "softmax"]
    assert small.get_layer("softmax_svd").kernel.shape == (config.hidden_units, 2)
    # the original is unchanged and owns its variables
    assert model.get_layer("softmax").kernel.shape == (config.hidden_units, config.output_vocab)
    with pytest.raises(ValueError, match="SVD rank"):
        svd.compress(model, 0)


def test_vocab_compression_keeps_the_kept_words_logits_and_maps_ids(setup):
    vocab, samples, config = setup
    vmap = vc.VocabMap.from_history(samples, vocab.size)
    assert list(vmap.kept[:2]) == [PAD_ID, UNK_ID] and np.all(np.diff(vmap.kept) > 0)
    assert np.array_equal(vmap.lookup[vmap.kept], np.arange(vmap.size))
    model = lstm_lm.build(config, seed=4)
    for base in (model, svd.compress(model, 3)):
        small = vc.compress(base, vmap)
        x, _ = _tokens(samples)
        # another model over the same weights: the LSTM chain, then the kept columns' 12 (+ rank) + 1 terms;
        # a wrong column would differ by ~the logits themselves
        assert_close_float32(
            small(x).numpy(), base(x).numpy()[..., vmap.kept], terms=lstm_terms(x.shape[1], 8, 12) + 25
        )
    # a word outside the history becomes <unk> (never suggested); pad stays pad
    partial = vc.VocabMap.from_history(build_samples(sentences("to be or not to be"), vocab, 3), vocab.size)
    remapped = partial.remap(samples)
    kept_words = set(vocab.words[i] for i in partial.kept)
    for old, new in zip(samples.target, remapped.target):
        word = vocab.words[old]
        assert new == (partial.lookup[old] if word in kept_words else UNK_ID)
        assert vocab.words[partial.kept[new]] == (word if word in kept_words else "<unk>")
    assert np.array_equal(remapped.inputs, samples.inputs)
    assert np.all((remapped.labels == PAD_ID) == (samples.labels == PAD_ID))


def test_vocab_compressed_evaluation_is_consistent(setup):
    vocab, samples, config = setup
    model = lstm_lm.build(config, seed=5)
    vmap = vc.VocabMap.from_history(samples, vocab.size)
    task = NextWordTask(3)
    result = task.evaluate(vc.compress(model, vmap), vmap.remap(samples))
    assert 0 <= result["top_k_eff"] <= 1 and np.isfinite(result["perplexity"])


def _covered(batches_idx, n):
    idx = np.concatenate(batches_idx)
    return sorted(idx.tolist()) == list(range(n))


def test_equal_length_batches_have_no_padding_and_cover_every_sample_once(setup):
    _, samples, _ = setup
    rng = np.random.default_rng(0)
    idx = bk.equal_length_batches(samples.lengths, 4, rng)
    assert _covered(idx, len(samples))
    assert all(len(set(samples.lengths[b])) == 1 and len(b) <= 4 for b in idx)
    batches = bk.EqualLength().batches(NextWordTask(), samples, 4, np.random.default_rng(0))
    assert bk.padding_stats(batches)["padded_fraction"] == 0
    assert sum(int((y != 0).sum()) for _, y in batches) == int((samples.labels != 0).sum())


@pytest.mark.parametrize("boundaries", [(5, 10, 20, 30), (30,), (4,)])
def test_fixed_buckets_cover_every_sample_once(setup, boundaries):
    _, samples, _ = setup
    out = bk.bucket_batches(samples.lengths, boundaries, 4, np.random.default_rng(1))
    assert _covered([b for _, b in out], len(samples))
    for size, b in out:
        assert size in boundaries
        fits = samples.lengths[b] <= size
        assert fits.all() or size == boundaries[-1]  # only the last bucket cuts longer samples
    batches = bk.FixedBuckets(boundaries).batches(NextWordTask(), samples, 4, np.random.default_rng(1))
    assert all(x.shape[1] in boundaries for x, _ in batches)
    assert sum(len(x) for x, _ in batches) == len(samples)
    with pytest.raises(ValueError):
        bk.FixedBuckets((10, 5))


@pytest.mark.slow(reason="a compressed model trained, converted to TFLite (a few seconds a conversion) and stepped")
def test_combined_variant_trains_exports_and_matches_tflite(setup):
    vocab, samples, config = setup
    task = NextWordTask(3)
    model = svd.compress(lstm_lm.build(config, seed=6), 3)
    vmap = vc.VocabMap.from_history(samples, vocab.size)
    model = vc.compress(model, vmap)
    data = vmap.remap(samples)
    hooks = [FineTune(), bk.EqualLength()]
    trainer = Trainer(model, task, 1e-2, hooks=hooks, warmup_steps=1)
    assert {v.name.split("/")[0] for v in trainer.variables_to_train} == {"softmax"}
    frozen = model.get_layer("softmax_svd").get_weights()[0].copy()
    history = trainer.fit(data, 1, 4, np.random.default_rng(2))
    assert np.isfinite(history[0]["loss"]) and history[0]["steps"] >= len(np.unique(data.lengths))
    np.testing.assert_array_equal(model.get_layer("softmax_svd").get_weights()[0], frozen)
    batches = list(hooks[1].batches(task, data, 4, np.random.default_rng(3)))[:3]
    check = parity.compare_flex(model, task, 1e-2, batches, hooks=hooks)
    # TensorFlow vs TFLite kernels: a loss sums the 2 LSTM layers' gate terms over the batch's length, the
    # factored softmax's 12 then 3 + 1 terms, the log-sum-exp over the kept words and the mean over positions.
    # The outputs after the 3 steps add each step's gradient error (as long a chain again) on how far
    # training moved them (Adam: ~lr a step, so another lr or sign changes that by ~100%).
    terms = max(lstm_terms(x.shape[1], 8, 12) + 12 + 4 + vmap.size + x.size for x, _ in batches)
    assert_close_float32(check["tflite"], check["tensorflow"], terms=terms)
    outputs = check["outputs_tensorflow"]
    moved = np.abs(outputs - model(batches[0][0], training=False).numpy()).max()
    atol = float32_sum_tolerance(terms, np.abs(outputs).max()) + float32_sum_tolerance(3 * terms, moved)
    np.testing.assert_allclose(check["outputs_tflite"], outputs, rtol=0, atol=atol)
    assert check["outputs_tflite"].shape[-1] == vmap.size


def test_svd_retraining_is_cached(setup, tmp_path, monkeypatch):
    _, samples, config = setup
    monkeypatch.setenv("ONDEVICE_MODEL_CACHE", str(tmp_path))
    model = lstm_lm.build(config, seed=7)
    kwargs = dict(
        epochs=1,
        batch_size=8,
        learning_rate=1e-3,
        optimizer="adam",
        clip_norm=0.0,
        rng_factory=lambda: np.random.default_rng(0),
        log=lambda *_: None,
    )
    first = svd_retrain.retrain_global(model, "base", 3, samples, NextWordTask(3), **kwargs)
    again = svd_retrain.retrain_global(model, "base", 3, samples, NextWordTask(3), **kwargs)
    other = svd_retrain.retrain_global(model, "base", 4, samples, NextWordTask(3), **kwargs)
    assert not first.hit and again.hit and not other.hit
    for a, b in zip(first.weights, again.weights):
        np.testing.assert_array_equal(a, b)
    compressed = svd.compress(model, 3)
    compressed.set_weights(first.weights)  # the cached weights fit the compressed architecture


def test_svd_retraining_to_a_plateau_records_the_untrained_epoch_and_keeps_the_best(setup, tmp_path, monkeypatch):
    from ondevice.training.trainer import Plateau

    _, samples, config = setup
    monkeypatch.setenv("ONDEVICE_MODEL_CACHE", str(tmp_path))
    model, task = lstm_lm.build(config, seed=7), NextWordTask(3)
    training = dict(epochs=4, batch_size=8, learning_rate=1e-2, optimizer="adam", clip_norm=5.0, log=lambda *_: None)
    rng = lambda: np.random.default_rng(0)  # noqa: E731
    with pytest.raises(ValueError, match="held-out"):
        svd_retrain.retrain_global(model, "base", 3, samples, task, rng_factory=rng, stop=Plateau(1), **training)
    entry = svd_retrain.retrain_global(
        model, "base", 3, samples, task, rng_factory=rng, holdout=samples, stop=Plateau(1), **training
    )
    history = entry.info["history"]
    assert history[0]["epoch"] == 0 and np.isnan(history[0]["loss"])  # the compressed model, not re-trained
    kept = entry.info["kept_epoch"]
    compressed = svd.compress(model, 3)
    compressed.set_weights(entry.weights)
    held = float(np.log(task.evaluate(compressed, samples)["perplexity"]))
    # the kept epoch's weights are returned: the same evaluation of the same weights (one code path)
    assert held == pytest.approx(history[kept]["holdout_loss"], rel=1e-5)
    sweep = svd.rank_sweep(model, (0.25, 1.0), 12, task, samples)
    full = float(np.log(task.evaluate(model, samples)["perplexity"]))
    # full rank: h @ U @ V (12 + 12 terms and the SVD's rounding) vs h @ W (12 + 1) after the LSTM chain, then
    # the 30-word log-sum-exp and the sum over the held-out positions
    positions = int((samples.labels != PAD_ID).sum())
    terms = lstm_terms(int(samples.lengths.max()), 8, 12) + 12 + 12 + 13 + 30 + positions
    assert list(sweep["rank"]) == [3, 12]
    assert sweep.holdout_loss.iloc[1] == pytest.approx(full, rel=float32_sum_tolerance(terms, 1.0))


def test_global_rate_is_the_global_trainers_schedule():
    from ondevice.papers.deeptype import common
    from ondevice.papers.deeptype.experiments import deeptype_ondevice_opt as opt

    params = opt.Params.for_scale("default")
    schedule = common.global_trainer(params, lstm_lm.build(lstm_lm.LSTMConfig(40, 30, 8, 12), seed=1))[1]
    assert [common.global_rate(params, e) for e in range(1, 10)] == [schedule(e) for e in range(1, 10)]


def test_experiment_reuses_d3_global_models_and_cuts_samples(setup):
    from ondevice.papers.deeptype import common
    from ondevice.papers.deeptype.experiments import deeptype_ondevice_opt as opt
    from ondevice.papers.deeptype.experiments import deeptype_top3eff as d3

    for scale in ("smoke", "default"):
        a, b = opt.Params.for_scale(scale), d3.Params.for_scale(scale)
        assert all(getattr(a, f) == getattr(b, f) for f in common.GLOBAL_FIELDS + ("k", "seed"))
        assert a.split_rule() == b.split_rule()
    assert opt.Params.for_scale("default").personal_learning_rate == 3e-4
    _, samples, _ = setup
    head = opt.first_samples(samples, 5)
    assert len(head) == 5 and np.array_equal(head.padded(np.arange(5))[0], samples.padded(np.arange(5))[0])
    from ondevice.params import ParameterError

    with pytest.raises(ParameterError, match="tflite_variants"):
        opt.Params.for_scale("smoke", tflite_variants=("nope",))


def test_table2_baseline_batches_at_a_fixed_length_as_each_technique_alone_and_bucketing_removes_padding(setup):
    """Table 2's baseline has no bucketing: Sec. 5.3's naive batches, every one padded (or cut) to
    30, the batching each technique alone keeps; bucketing and all combined pad nothing."""
    from types import SimpleNamespace

    from ondevice.papers.deeptype.techniques.combined import VARIANTS

    _, samples, _ = setup
    params = SimpleNamespace(personal_batch_size=4, buckets=(5, 10, 20, 30), fixed_length=30)
    shapes = {}
    for name, spec in VARIANTS.items():
        batches = spec.batch_list(NextWordTask(), samples, params, np.random.default_rng(0))
        shapes[name] = ({x.shape[1] for x, _ in batches}, bk.padding_stats(batches)["padded_fraction"])
    for name in ("baseline", "fine_tune", "svd", "vocab"):
        assert shapes[name][0] == {30}, name
    assert shapes["baseline"][1] > shapes["windows"][1] > 0
    assert shapes["bucketing"][1] == shapes["combined"][1] == 0
