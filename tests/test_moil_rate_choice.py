"""MoIL's incremental rate choice: the rule picks by held-out local training data alone (the user's
training clips, never the validation or global evaluation clips), follows its stated order, and
stops on bad input."""

import dataclasses

import numpy as np
import pandas as pd
import pytest

from ondevice.models import yamnet
from ondevice.papers.moil import audio_data, audio_model, protocol, rate_choice
from ondevice.papers.moil.experiments import moil_audio as exp
from ondevice.papers.moil.rate_choice import AUC, LOSS, RATE

QUIET = lambda *_: None  # noqa: E731


def _table(rows):
    return pd.DataFrame(rows, columns=[RATE, AUC, LOSS])


def test_the_rule_takes_the_lowest_held_out_loss_and_breaks_a_tie_by_the_smaller_rate():
    assert rate_choice.choose(_table([[5e-4, 0.95, 0.1], [1.5e-4, 0.97, 0.3], [5e-5, 0.96, 0.05]])) == 5e-5
    assert rate_choice.choose(_table([[5e-4, 1.0, 0.2], [1.5e-4, 1.0, 0.1], [5e-5, 1.0, 0.15]])) == 1.5e-4  # AUC ties
    assert rate_choice.choose(_table([[5e-4, 0.97, 0.1], [1.5e-4, 0.99, 0.1 + 1e-13], [5e-5, 0.9, 0.2]])) == 1.5e-4
    assert rate_choice.choose(_table([[5e-4, 0.97, 0.1], [1.5e-4, 0.99, 0.1 + 1e-9]])) == 5e-4  # beyond the tie
    assert rate_choice.choose(_table([[5e-4, 0.9, 0.1]])) == 5e-4


@pytest.mark.parametrize(
    "table, message",
    [
        (_table([]), "no candidate"),
        (_table([[5e-4, float("nan"), 0.1], [5e-5, 0.9, 0.1]]), "finite"),
        (_table([[5e-4, 0.9, float("inf")]]), "finite"),
        (_table([[5e-4, 0.9, 0.1], [5e-4, 0.8, 0.1]]), "distinct"),
        (_table([[0.0, 0.9, 0.1]]), "positive"),
        (pd.DataFrame({RATE: [5e-4], AUC: [0.9]}), "columns"),
    ],
)
def test_the_rule_refuses_bad_input(table, message):
    with pytest.raises(ValueError, match=message):
        rate_choice.choose(table)


class _Scripted:
    """A personalizer whose GDM(alpha) run reports scripted held-out scores for its rate."""

    def __init__(self, params, script, trained):
        self.params, self.script, self.trained = params, script, trained

    def run(self, alpha, n, seed, log):
        self.trained.append((self.params.learning_rate, alpha, n, seed))
        auc, loss = self.script[self.params.learning_rate]
        history = [{"epoch": e, "loss": 1.0, "holdout_auc": auc - 0.1 * (1 - e), "holdout_loss": loss} for e in (0, 1)]
        return dataclasses.make_dataclass("R", ["history"])(history)


def test_select_trains_every_candidate_once_and_chooses_by_the_last_epoch():
    params = exp.Params.for_scale("smoke", learning_rates=(5e-4, 1.5e-4, 5e-5))
    script, trained = {5e-4: (0.90, 0.2), 1.5e-4: (0.95, 0.3), 5e-5: (0.95, 0.1)}, []
    choice = rate_choice.select(params, lambda p: _Scripted(p, script, trained), {"held-out": 3}, QUIET)
    assert trained == [(r, params.alpha, None, params.seed) for r in (5e-4, 1.5e-4, 5e-5)]
    assert choice.rate == 5e-5 and choice.params.learning_rate == 5e-5  # the lowest held-out loss
    assert list(choice.table.chosen) == [False, False, True]
    assert list(choice.table[AUC]) == [0.90, 0.95, 0.95]  # the last epoch's, not the first
    assert len(choice.history) == 6 and set(choice.history.epoch) == {0, 1}
    with pytest.raises(ValueError, match="finite"):
        rate_choice.select(params, lambda p: _Scripted(p, {**script, 5e-4: (np.nan, 0.1)}, []), {}, QUIET)


@pytest.fixture(scope="module")
def tiny():
    params = exp.Params.for_scale(
        "smoke",
        data="synthetic",
        local_classes=2,
        global_classes=2,
        epochs=1,
        alphas=(0.0, 0.5),
        alpha=0.5,
        ns=(1, 3),
        n=3,
        learning_rates=(5e-4, 1e-9),
    )
    data = exp.load_data(params, log=QUIET)
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


def test_the_audio_choice_holds_out_training_clips_and_scores_them_alone(tiny):
    params, data, pre = tiny
    fit, held = audio_data.hold_out(data, params.holdout_fraction, params.seed)
    train = set(data.local_train.ids)
    assert set(held.ids) < train and set(fit.local_train.ids) == train - set(held.ids)
    assert set(held.classes) == set(data.local_train.classes)  # every class keeps some held out
    assert not set(held.ids) & (set(data.local_val.ids) | set(data.global_eval.ids))
    assert fit.local_val is data.local_val and fit.global_pool is data.global_pool

    choice = exp.choose_rate(params, data, pre, QUIET)
    assert list(choice.table[RATE]) == [5e-4, 1e-9]
    assert choice.rate == rate_choice.choose(choice.table) and choice.params.learning_rate == choice.rate
    assert choice.clips == {"held-out training clips": len(held), "training clips without them": len(fit.local_train)}
    assert set(choice.history.columns) == {RATE, "epoch", AUC, LOSS, "loss"}
    # epoch 0 is the pre-trained model on the held-out clips: its loss is the training task's loss there
    model = yamnet.build()
    model.set_weights(pre.weights)
    logits = protocol.forward(model)(held.patches)
    want = float(audio_model.tagging_task().loss(held.patch_labels(), logits))
    first = choice.history[choice.history.epoch == 0]
    np.testing.assert_allclose(first[LOSS], want, rtol=1e-5)
    trained = choice.history[(choice.history.epoch == 1) & (choice.history[RATE] == 5e-4)][LOSS].item()
    assert trained != pytest.approx(want, rel=1e-4)  # a real step moved the held-out loss
