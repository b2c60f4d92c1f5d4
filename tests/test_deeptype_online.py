"""D7 online-training emulation: the stream is the user's history in order, each sample is scored
before the model learns from it, only the softmax trains, and without training the emulator
scores exactly as the standard evaluation does."""

import dataclasses

import numpy as np
import pandas as pd
import pytest

from ondevice.data import per_user_text
from ondevice.data.typing_samples import build_samples
from ondevice.papers.deeptype import common, planted, step_size
from ondevice.papers.deeptype.experiments import deeptype_online as exp
from ondevice.params import ParameterError
from ondevice.tasks.next_word import NextWordTask
from smoke_runs import reading


@pytest.fixture(scope="module")
def setup(speeches, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ONDEVICE_MODEL_CACHE", str(tmp_path_factory.mktemp("models")))
        params = exp.Params.for_scale("smoke", crowd_max_words=3000, global_epochs=1, personal_learning_rate=0.5)
        quiet = lambda _: None
        corpus = per_user_text.load_corpus(params, speeches, quiet)
        models = common.train_global(params, corpus, quiet)
    user = corpus.split.test[0]
    short = build_samples(corpus.users[user][:25], corpus.vocab, params.context_words)  # about 200 samples
    return params, corpus, models, short


def test_stream_is_the_earlier_then_the_later_lines(setup):
    params, corpus, _, _ = setup
    user = corpus.split.test[0]
    data, later = exp.stream(corpus, user, params.personal_train_fraction)
    first, second = corpus.personal(user, params.personal_train_fraction)
    assert len(data) == len(first) + len(second) and later == len(first)
    whole = build_samples(corpus.users[user], corpus.vocab, params.context_words)
    for name in ("inputs", "labels", "offsets", "n_context", "word_len", "target"):
        np.testing.assert_array_equal(getattr(data, name), getattr(whole, name), err_msg=name)


def test_without_training_the_emulator_scores_as_the_evaluation(setup):
    params, _, models, short = setup
    needed, steps = exp.Emulator(params, models).run(short, params.seed, train=False)
    models.model.set_weights(models.weights[params.seed])
    reference = NextWordTask(params.k).evaluate(models.model, short)["chars_needed"]
    assert steps == 0
    np.testing.assert_array_equal(needed, reference)


def test_online_training_scores_before_learning_and_trains_only_the_softmax(setup):
    params, _, models, short = setup
    emulator = exp.Emulator(params, models)
    plain, _ = emulator.run(short, params.seed, train=False)
    online, steps = emulator.run(short, params.seed, train=True)
    b = params.online_batch_size
    assert steps == len(short) // b
    np.testing.assert_array_equal(online[:b], plain[:b])  # the first buffer is suggested by the global model
    assert not np.array_equal(online[b:], plain[b:])  # later suggestions come from the trained model
    after = models.model.get_weights()
    softmax = {id(v) for v in models.model.get_layer("softmax").weights}
    for var, w, g in zip(models.model.weights, after, models.weights[params.seed]):
        assert np.array_equal(w, g) != (id(var) in softmax), var.name
    again, _ = emulator.run(short, params.seed, train=True)  # reset: a fresh optimizer from the global weights
    np.testing.assert_array_equal(again, online)


def test_online_training_steps_at_the_fixed_readings_first_personal_epoch_rate(setup):
    """The shared protocol's step (`step_size`): the stream is one pass, so its rate is the reading's
    rate of personal epoch 1 from the start's kept epoch; the optimizer that trains runs at it."""
    params, _, models, short = setup
    kept = step_size.kept_epoch(models, params.seed)
    emulator = exp.Emulator(dataclasses.replace(params, global_decay_after=0), models)
    expected = params.personal_learning_rate * params.global_lr_decay**kept  # continued: kept + 1 - 1 - 0 halvings
    assert params.step_reading == "continued" and expected < params.personal_learning_rate
    assert emulator.rate(params.seed) == pytest.approx(expected)
    emulator.run(short, params.seed, train=True)
    assert float(emulator.trainer.optimizer.learning_rate.numpy()) == pytest.approx(expected)


def test_full_training_changes_every_layer(setup):
    params, _, models, short = setup
    full = exp.Params.for_scale(
        "smoke", crowd_max_words=3000, global_epochs=1, online_training="full", personal_learning_rate=0.5
    )
    exp.Emulator(full, models).run(short, params.seed, train=True)
    changed = [not np.array_equal(w, g) for w, g in zip(models.model.get_weights(), models.weights[params.seed])]
    assert all(changed)


def test_parts_and_effects():
    parts = exp._parts(100, 70, 0.1)
    assert (
        parts["last"].tolist() == list(range(90, 100)) and parts["later_lines"][0] == 70 and len(parts["stream"]) == 100
    )
    rows = []
    for i, user in enumerate("abcde"):
        for condition, bump in (("global", 0.0), ("online", 0.05)):
            rows.append(
                {
                    "seed": 0,
                    "user": user,
                    "condition": condition,
                    "top_k_eff_stream": 0.3 + 0.01 * i + bump,
                    "top_k_eff_last": 0.3 + 0.01 * i + 2 * bump,
                    "top_k_eff_later_lines": 0.3 + bump,
                }
            )
    table = exp.effects(exp.Params.for_scale("smoke"), pd.DataFrame(rows))
    assert table.verdict.tolist() == ["holds", "holds"]
    assert table["our change"].iloc[1] > table["our change"].iloc[0] > 0
    assert table["paper change"].tolist() == [0.095, 0.169]


def test_a_passing_planted_control_names_the_data_behind_a_flagged_online_effect():
    """Online training loses (the paper gains), so both rows are flagged: once the planted control has
    passed, the cause is the data (the control's gain, the median stream), with the validation line
    after it; with a failing control, the validation line alone, still open."""
    rows = [
        {"seed": 0, "user": u, "condition": c, "stream_words": 1000 * (i + 1)}
        | {f"top_k_eff_{p}": 0.3 + 0.01 * i + bump for p in ("stream", "last", "later_lines")}
        for i, u in enumerate("abcde")
        for c, bump in (("global", 0.0), ("online", -0.03), (exp.ALSO, 0.01))
    ]
    curve = pd.DataFrame({"dose": [0.0, 0.5], "gain": [0.01, 0.09], "ci low": [0.0, 0.07], "ci high": [0.02, 0.1]})
    more = {"planted_curve": curve, "planted_verdict": pd.DataFrame([{"passes": True, "text": "x"}])}
    params = exp.Params.for_scale("smoke")
    table = exp.effects(params, pd.DataFrame(rows), more)
    assert set(table["diagnosis kind"]) == {"data"} and set(table.section) == {exp.PLANTED_SECTION}
    assert table.diagnosis[0].startswith("the planted-signal control passes: personalization gains +0.090")
    assert "a median 3,000 personal training words" in table.diagnosis[0]
    assert "; with the validation users' choice (adam 0.0003) online training changes +" in table.diagnosis[0]
    more["planted_verdict"] = pd.DataFrame([{"passes": False, "text": "x"}])
    failed = exp.effects(params, pd.DataFrame(rows), more)
    assert set(failed["diagnosis kind"]) == {"open"} and set(failed.section) == {exp.SECTION}


def test_the_validation_choice_trains_with_its_own_optimizer_and_explains_a_flagged_effect(setup):
    params, _, models, short = setup
    also = exp.Emulator(params, models).also()
    assert also.params.personal_optimizer == params.also_optimizer == "adam"
    assert also.rate(params.seed) == also.params.personal_learning_rate == params.also_learning_rate  # constant
    also.run(short, params.seed, train=True)
    assert type(also.trainer.optimizer).__name__.lower() == "adam"
    rows = [
        {"seed": 0, "user": u, "condition": c}
        | {f"top_k_eff_{p}": 0.3 + 0.01 * i + bump for p in ("stream", "last", "later_lines")}
        for i, u in enumerate("abcde")
        for c, bump in (("global", 0.0), ("online", -0.03), (exp.ALSO, 0.01))
    ]
    table = exp.effects(params, pd.DataFrame(rows))  # online loses: the paper's gains are of the other sign
    assert set(table.verdict) == {"does not hold"} and set(table.section) == {exp.SECTION}
    assert table.diagnosis[0].startswith("with the validation users' choice (adam 0.0003) online training changes +")
    without = exp.effects(params, pd.DataFrame([r for r in rows if r["condition"] != exp.ALSO]))
    assert set(without.diagnosis) == {""}  # nothing measured, nothing said


def test_bad_parameters_are_named():
    with pytest.raises(ParameterError, match="online_training"):
        exp.Params.for_scale("smoke", online_training="sometimes")
    with pytest.raises(ParameterError, match="last_fraction"):
        exp.Params.for_scale("smoke", last_fraction=1.0)


@pytest.fixture(scope="module", params=reading("deeptype_online"))
def result(request, smoke_runs):
    """The notebook's one smoke run (tests/smoke_runs.py), read back from its files: both starts, the
    planted control."""
    saved = smoke_runs(request.param).saved()
    return saved.params_as(exp.Params), saved


def test_the_public_start_is_judged_and_the_crowd_start_stands_beside_it(result):
    params, r = result
    every, users = r.tables["users_every_start"], r.tables["users"]
    assert set(every.global_text) == {"sent140", "crowd"} and set(users.condition) == {"global", "online", exp.ALSO}
    main = every[every.global_text == "sent140"].drop(columns="global_text").reset_index(drop=True)
    pd.testing.assert_frame_equal(main, users.reset_index(drop=True))  # the judged rows are the public start's
    assert set(every[every.global_text == "crowd"].condition) == {"global", "online"}
    assert r.tables["starts"].global_text.tolist() == ["sent140", "crowd"]
    assert set(r.tables["global_model_cache"].global_text) == {"sent140", "crowd"}
    gains = r.tables["start_gains"]
    assert len(gains) == 2 * len(exp.PARTS) and gains.verdict.isin(["holds", "does not hold", "within noise"]).all()


def test_the_planted_control_runs_the_emulation_at_every_dose(result):
    params, r = result
    curve, per_user = r.tables["planted_curve"], r.tables["planted"]
    assert curve.dose.tolist() == sorted(params.planted_doses) and (curve.users == params.test_users).all()
    assert len(per_user) == len(params.planted_doses) * params.test_users * params.seeds
    users = r.tables["users"]
    online = users[users.condition == "online"].set_index("user").top_k_eff_stream.sort_index()
    dose0 = per_user[per_user.dose == 0].set_index("user").top_k_eff.sort_index()
    assert np.allclose(online, dose0)  # dose 0 is the main rows
    assert set(per_user.condition) == {"online"}  # the table names the condition it ran in
    rates = users[users.condition == "online"].learning_rate
    assert (rates > 0).all() and rates.nunique() == 1  # one start model, one step-size rate
    assert (curve["ci low"] <= curve.gain).all() and (curve.gain <= curve["ci high"]).all()
    verdict = r.tables["planted_verdict"].iloc[0]
    assert verdict.passes == planted.verdict(curve, params.planted_dose_star)[0]
    # a fully planted user's frequent words are the habit's: the global model, which never saw them, loses
    assert curve.set_index("dose").top_k_eff_global[1.0] < curve.set_index("dose").top_k_eff_global[0.0]
