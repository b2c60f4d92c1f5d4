"""The MoIL audio experiment: FMC trains exactly like LF without the cache, LF is scored on the
frozen part's maps as the whole model scores, GDM's pool stays disjoint from the global evaluation
clips, the forgetting ablation changes the rate alone (to the candidates the rule did not choose),
the forgetting rows are measured at every rate and against the global set's size, and without
ESC-50 the run falls back to labelled stand-in data and still completes."""

import dataclasses

import numpy as np
import pandas as pd
import pytest

from numerics import assert_close_float32, assert_same_update
from ondevice.data import manifests
from ondevice.models import yamnet
from ondevice.papers.moil import audio_data, audio_model, forgetting, global_proxy, protocol
from ondevice.papers.moil.experiments import moil_audio as exp
from ondevice.papers.moil.rate_choice import AUC, LOSS, RATE
from ondevice.params import ParameterError
from ondevice.report import claims


def _synthetic(params):
    return audio_data.load_data(params, log=lambda *_: None)


@pytest.fixture(scope="module")
def tiny():
    params = exp.Params.for_scale(
        "smoke",
        data="synthetic",
        local_classes=2,
        global_classes=2,
        epochs=2,
        alphas=(0.0, 0.5),
        alpha=0.5,
        ns=(1, 3),
        n=3,
    )
    data = _synthetic(params)
    model = yamnet.build(seed=1)
    predict = protocol.forward(model)
    pre = audio_model.Pretrained(
        model.get_weights(),
        "random",
        None,
        audio_model.class_aucs(data.global_eval, audio_model.clip_scores(predict, data.global_eval)),
        audio_model.class_aucs(data.local_val, audio_model.clip_scores(predict, data.local_val)),
    )
    return params, data, pre


def test_fmc_gives_the_same_result_as_lf_without_caching(tiny, tmp_path):
    params, data, pre = tiny
    personal = exp.Personalizer(params, data, pre)
    lf = personal.run(params.alpha, params.n, params.seed, log=lambda *_: None)
    cached = personal.run_fmc(params.alpha, params.n, params.seed, tmp_path, log=lambda *_: None)
    # the cached features vs YAMNet's frozen part run again: another graph, so another float32 order
    # through ~9000 summed terms in all (3x3 convolutions, pointwise sums over 32..1024 channels, 14
    # layers) to a loss ~1; a deep chain, so the typical error sqrt(9000) eps x 10 (~1e-4 of the loss)
    losses = [h["loss"] for h in cached.history[1:]]
    assert_close_float32(losses, [h["loss"] for h in lf.history[1:]], terms=9000, deep=True)
    assert cached.history[1]["loss"] != cached.history[2]["loss"]  # it did train
    # the AUCs on this random YAMNet say nothing (its activations vanish by layer 12, every clip scores
    # alike), so the paths are compared where they differ: the trained weights, moved by the same steps
    # (float32 rounding of those ~9000-term sums, scaled by the move; frozen layers must not move at all)
    for after, want, start in zip(cached.weights, lf.weights, pre.weights):
        assert_same_update(after, want, start, terms=9000)
    assert cached.cache["feature_shape"] == "6x4x512"
    assert sorted(p.name for p in tmp_path.glob("*.npy")) == ["global-0.npy", "local-0.npy", "train-0.npy"]
    table = exp.cache_table(cached, data)
    ten_s = table[table.per == "10 s of audio"].set_index("what").bytes
    assert ten_s["feature-map cache"] / 1024 == 960  # the thesis's 960 KB per 10 s under LF(3)


def test_lf_evaluation_on_the_frozen_parts_maps_scores_as_the_whole_model(tiny):
    """LF(n) scores its head on the frozen part's maps, computed once before training: after training,
    the same logits, bit for bit, and AUCs as the whole trained model on the raw patches."""
    params, data, pre = tiny
    personal = exp.Personalizer(params, data, pre)
    run = personal.run(params.alpha, params.n, params.seed, log=lambda *_: None)
    whole, start = yamnet.build(), yamnet.build()
    whole.set_weights(run.weights)
    start.set_weights(pre.weights)
    trainer, head, maps = personal.trainer(params.n)  # the maps of the run's trainer, from before training
    trainer.model.set_weights(run.weights)
    for k, part in personal.parts.items():
        logits = audio_model.patch_logits(protocol.forward(whole), part)
        np.testing.assert_array_equal(audio_model.patch_logits(head, part, maps[k]), logits)
        assert not np.array_equal(audio_model.patch_logits(protocol.forward(start), part), logits)  # it trained
    expected = personal.score(protocol.forward(whole), personal.evaluation())
    for k, aucs in expected.items():
        pd.testing.assert_series_equal(run.scores[k], aucs)


def test_gdm_mixes_pool_clips_only(tiny):
    params, data, _ = tiny
    assert not set(data.global_pool.ids) & set(data.global_eval.ids)
    assert not set(data.local_train.ids) & set(data.local_val.ids)
    assert not set(data.local_train.classes) & set(data.global_eval.classes)
    none = audio_data.mixed_training_set(data, 0.0, params.seed)
    assert list(none.ids) == list(data.local_train.ids)
    whole = audio_data.mixed_training_set(data, 1.0, params.seed)
    assert set(whole.ids) == set(data.local_train.ids) | set(data.global_pool.ids)
    half = audio_data.mixed_training_set(data, 0.5, params.seed)
    picked = set(half.ids) - set(data.local_train.ids)
    assert picked < set(data.global_pool.ids) and len(picked) == len(data.global_pool) // 2
    assert len(half.patches) == len(half.clip) and half.clip.max() == len(half) - 1


def test_forgetting_ablation_retrains_at_the_other_candidate_rates_only(tiny):
    params, data, pre = tiny
    params = dataclasses.replace(params, learning_rates=(5e-4, 1e-9), learning_rate=5e-4, epochs=1)
    quiet = lambda *_: None  # noqa: E731
    personal = exp.Personalizer(params, data, pre)
    alpha_runs = [personal.run(a, None, params.seed, quiet) for a in params.alphas]
    lf_runs = [personal.run(params.alpha, params.n, params.seed, quiet)]
    ablation = exp.forgetting_ablation(params, data, pre, alpha_runs, lf_runs, quiet)
    assert list(ablation.runs) == [5e-4, 1e-9]  # the chosen rate, then the other candidates
    ours = ablation.runs[params.learning_rate]
    assert ours["GDM(0)"] is alpha_runs[0] and ours["GDM(alpha) + LF(n)"] is lf_runs[0]  # not trained again
    tiny_rate = ablation.runs[1e-9]
    assert [r.name for r in tiny_rate.values()] == ["GDM(0)", "GDM(0.5)", "GDM(0.5) + LF(3)"]
    assert ours["GDM(0)"].history[1]["loss"] != tiny_rate["GDM(0)"].history[1]["loss"]  # retrained, at its own rate
    for run in tiny_rate.values():  # a vanishing step leaves the pre-trained weights
        assert max(float(np.abs(a - b).max()) for a, b in zip(run.weights, pre.weights)) < 1e-6
    assert list(ablation.changes["Adam rate"]) == [1e-9] * 3 and not ablation.changes.chosen.any()
    assert (ablation.changes["ci low"] <= ablation.changes["our change"]).all()
    lowest = min(float(r.scores["local"].mean()) for r in tiny_rate.values())
    assert (ablation.changes["lowest local AUC"] == lowest).all()
    summary = ablation.summary()
    assert list(summary.chosen) == [True] * 3 + [False] * 3

    measured = {e.claim: (pre.global_auc.to_numpy(), pre.global_auc.to_numpy()) for e in exp.PAPER.effects}
    effects = claims.effects_table(exp.PAPER, measured, np.random.default_rng(0), n_boot=100)
    effects["effect"] = effects.effect.str.replace("LF(n)", "LF(3)", regex=False)
    effects["our change"] = [0.1, 0.2, 0.3, 0.4]  # told apart, so the rows taken can be checked
    table = ablation.table(params.n, effects)
    assert list(table["Adam rate"]) == [params.learning_rate] * 3 + [1e-9] * 3
    assert list(table.chosen) == [True] * 3 + [False] * 3
    assert list(table["our change"][:3]) == [0.1, 0.2, 0.3]  # the effects table's own rows, FMC's left out
    assert set(table.effect) == {
        "GDM(0) loses global AUC (catastrophic forgetting)",
        "mixing global data keeps more global AUC than GDM(0)",
        "LF(3) keeps more global AUC than full training",
    }

    choice = pd.DataFrame({RATE: [1e-9, 5e-4], AUC: [0.9, 0.8], LOSS: [0.2, 0.1]})
    by_rate = forgetting.by_rate(table, choice, seeds=3)
    assert list(by_rate[RATE]) == [5e-4, 1e-9] and list(by_rate[LOSS]) == [0.1, 0.2]  # one row per candidate
    assert list(by_rate.seeds) == [3, 1] and list(by_rate["GDM(0) forgetting %"])[0] == pytest.approx(10)
    size = ablation.size  # the forgetting rows on subsets of the global clips, at every rate
    assert set(size["Adam rate"]) <= {5e-4, 1e-9} and (size.clips <= len(data.global_eval)).all()
    full = size[size.fraction == 1.0]
    assert (full.draws == 1).all() and (full.clips == len(data.global_eval)).all()
    at_full = full.set_index("Adam rate")["GDM(0) loses global AUC (catastrophic forgetting)"]
    gdm0 = {r: runs["GDM(0)"].scores["global"] for r, runs in ablation.runs.items()}
    for rate, change in at_full.items():  # the whole set's change is the ablation's own
        assert change == pytest.approx(np.median(pre.global_auc) / np.median(gdm0[rate]) - 1)

    # a smaller chosen rate: the larger candidate is the one trained again
    smaller = dataclasses.replace(params, learning_rates=(1e-9, 5e-4), learning_rate=1e-9)
    sweeps = list(tiny_rate.values())  # the sweeps' runs at 1e-9 are the ablation's above
    again = exp.forgetting_ablation(smaller, data, pre, sweeps[:2], sweeps[2:], quiet)
    assert list(again.runs) == [1e-9, 5e-4] and list(again.changes["Adam rate"]) == [5e-4] * 3
    assert again.runs[5e-4]["GDM(0)"].history[1]["loss"] == ours["GDM(0)"].history[1]["loss"]  # same rate, same run


@pytest.mark.slow(reason="a whole smoke run without ESC-50: the fallback is a property of the run's outputs")
def test_without_esc50_the_run_falls_back_to_labelled_stand_in_data(monkeypatch, tmp_path):
    monkeypatch.delenv("ONDEVICE_DATA_MIRROR", raising=False)
    monkeypatch.setenv("ONDEVICE_DATA_CACHE", str(tmp_path / "data"))
    monkeypatch.setenv("ONDEVICE_MODEL_CACHE", str(tmp_path / "models"))
    with pytest.raises(manifests.DataError):
        audio_data.load_data(exp.Params.for_scale("smoke", data="esc50"), log=lambda *_: None)
    params = exp.Params.for_scale(
        "smoke",
        local_classes=2,
        global_classes=2,
        epochs=1,
        ns=(1,),
        n=1,
        timing_steps=2,
        warmup_steps=1,
        tflite_check_steps=0,
        seeds=1,
        learning_rates=(5e-4,),  # one candidate: the other-rate ablation on 8 synthetic clips per class
        learning_rate=5e-4,  # can leave a class AUC median of 0 (tested in the ablation's own test)
    )
    lines = []
    result = exp.run(params, log=lines.append)
    assert "STAND-IN" in lines[0] and result.stand_in_data and "synthetic" in result.stand_in_data
    assert "stand-in data" in audio_data.data_banner(audio_data.load_data(params, log=lambda *_: None)).lower()
    assert result.data[0]["stand_in_for"]
    assert set(result.tables["effects"].verdict) <= {"holds", "does not hold", "within noise"}
    assert np.isfinite(result.tables["paper_vs_ours"].ours).all()
    saved = result.save(tmp_path / "out")
    assert (saved / "run.json").is_file() and (saved / "tables" / "fmc_equality.csv").is_file()


def test_bad_parameters_are_named():
    for bad, name in (
        (dict(alpha=0.3), "alpha"),
        (dict(n=15), "n"),
        (dict(alphas=(0.5,), alpha=0.5), "alphas"),
        (dict(local_classes=40, global_classes=20), "global_classes"),
        (dict(data="web"), "data"),
        (dict(learning_rates=(1e-4, 1e-4), learning_rate=1e-4), "learning_rates"),
        (dict(learning_rates=(), learning_rate=1e-4), "learning_rates"),
        (dict(learning_rates=(5e-4, -1e-4)), "learning_rates"),
        (dict(learning_rate=1e-3), "learning_rate"),  # not one of the candidates
        (dict(holdout_fraction=1.0), "holdout_fraction"),
    ):
        with pytest.raises(ParameterError, match=name):
            exp.Params.for_scale("smoke", **bad)


def test_the_size_rule_says_toward_only_beyond_the_small_sets_spread():
    claim = global_proxy.MEASURED[0]

    def table(small, low, high, full):
        rows = [(0.25, small, low, high), (1.0, full, full, full)]
        return pd.DataFrame(
            [
                {"Adam rate": 1e-4, "fraction": f, claim: c, f"{claim}, draws low": lo, f"{claim}, draws high": hi}
                for f, c, lo, hi in rows
            ]
        )

    assert global_proxy.moves_toward(table(0.4, 0.35, 0.45, 0.2), 1e-4, claim, 0.03)
    assert not global_proxy.moves_toward(table(0.4, 0.1, 0.7, 0.2), 1e-4, claim, 0.03)  # within the draws' spread
    assert not global_proxy.moves_toward(table(0.2, 0.15, 0.25, 0.4), 1e-4, claim, 0.03)  # away from the thesis
