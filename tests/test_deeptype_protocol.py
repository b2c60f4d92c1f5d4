"""Every DeepType experiment trains its personal and online models with the personal fields
(`personal_optimizer`, `personal_learning_rate`), never with the global model's `optimizer` and
`global_learning_rate`: with distinctive values for both, every optimizer an experiment's
personal stage creates is the personal one. Also: the global model keeps its old stopping rule."""

import numpy as np
import pytest

from ondevice.data import per_user_text
from ondevice.data.typing_samples import build_samples
from ondevice.device import parity
from ondevice.papers.deeptype import common, protocol
from ondevice.papers.deeptype.experiments import deeptype_ondevice_opt as opt_exp
from ondevice.papers.deeptype.experiments import deeptype_online as online_exp
from ondevice.papers.deeptype.experiments import deeptype_online_latency as latency_exp
from ondevice.papers.deeptype.experiments import deeptype_personal_data as data_exp
from ondevice.papers.deeptype.experiments import deeptype_top3eff as top3_exp
from ondevice.papers.deeptype.experiments import deeptype_top3eff_sensitivity as sens_exp
from ondevice.papers.deeptype.experiments import energy_governors as energy_exp
from ondevice.tasks import typing_protocol
from ondevice.training import step as step_module

GLOBAL = dict(
    optimizer="adam", global_learning_rate=0.00123, global_clip_norm=7.0, crowd_max_words=3000, global_epochs=1
)
PERSONAL = dict(personal_optimizer="sgd", personal_learning_rate=0.0456, personal_clip_norm=3.0, personal_epochs=1)
MINE = ("sgd", 0.0456, 3.0)  # the rate and clipping reach the optimizer as the fields hold them


def params_of(module, **extra):
    return module.Params.for_scale("smoke", seeds=1, **{**GLOBAL, **PERSONAL, **extra})


@pytest.fixture
def created(monkeypatch):
    """(optimizer name, learning rate, clipping norm) of every optimizer created while the test runs."""
    made = []
    for name, cls in list(step_module.OPTIMIZERS.items()):

        def make(lr, n=name, c=cls, **kw):
            made.append((n, lr, kw.get("global_clipnorm")))
            return c(lr, **kw)

        monkeypatch.setitem(step_module.OPTIMIZERS, name, make)
    return made


@pytest.fixture(scope="module")
def setup(speeches):
    params = params_of(top3_exp)
    corpus = per_user_text.load_corpus(params, speeches, log=lambda _: None)
    return corpus, common.train_global(params, corpus, log=lambda _: None)


def test_the_global_model_trains_with_the_global_fields(speeches, created):
    params = params_of(top3_exp, crowd_max_words=2000)  # another cache entry: trained here
    common.train_global(params, per_user_text.load_corpus(params, speeches, log=lambda _: None), log=lambda _: None)
    assert created == [("adam", 0.00123, 7.0)]


def test_accuracy_experiment_d3(setup, created, monkeypatch):
    corpus, models = setup
    params = params_of(top3_exp)
    corpora, both = {"crowd": corpus, "far": corpus}, {"crowd": models, "far": models}
    rows = top3_exp.personalize(params, corpora, both, "continued", log=lambda _: None)
    rows += top3_exp.control(params, corpora, both, "continued", log=lambda _: None)
    assert created and set(created) == {MINE}
    created.clear()
    sens = params_of(sens_exp, sgd_lr_grid=(0.0789,), adam_lr_grid=())
    sens_exp.select_personal(sens, corpus, models, log=lambda _: None)  # the validation users' choice: its candidates
    assert set(created) == {("sgd", 0.0789, 3.0)}
    checked = {}
    monkeypatch.setattr(
        parity,
        "parity_table",
        lambda model, task, lr, b, opt, **kw: checked.update(a=(opt, lr, kw["clip_norm"])),
    )
    top3_exp.on_device(params, corpora, both)
    assert checked["a"] == MINE


def test_personal_data_experiment_d4(setup, created):
    corpus, models = setup
    params = params_of(data_exp)
    data_exp.personalize(params, corpus, models, log=lambda _: None)
    # the paper's configuration, and the validation users' choice beside it (its optimizer and rate, the personal clip)
    assert set(created) == {MINE, (params.also_optimizer, params.also_learning_rate, 3.0)}
    created.clear()
    data_exp._Personal(params_of(data_exp, also_optimizer=""), corpus, models)
    assert created == [MINE]


@pytest.mark.parametrize("online_training", ["fine_tune", "full"])
def test_online_experiment_d7(setup, created, online_training):
    corpus, models = setup
    params = params_of(online_exp, online_training=online_training)
    short = build_samples(corpus.users[corpus.split.test[0]][:10], corpus.vocab, params.context_words)
    online_exp.Emulator(params, models).run(short, params.seed, train=True)  # its trainer, at the step's rate
    assert created == [MINE]


def test_ondevice_optimisations_d6(setup, created, monkeypatch):
    corpus, models = setup
    built, real = [], protocol.personal_trainer
    monkeypatch.setattr(protocol, "personal_trainer", lambda *a, **kw: built.append(real(*a, **kw)) or built[-1])
    personal = opt_exp.Personal(params_of(opt_exp), corpus, models, None)
    for variant in opt_exp.VARIANTS:
        assert personal.trainer(variant, models.model) is built[-1]
    assert set(created) == {MINE}


def test_energy_experiment(setup, created, monkeypatch):
    corpus, models = setup
    built, real = [], protocol.personal_trainer
    monkeypatch.setattr(protocol, "personal_trainer", lambda *a, **kw: built.append(real(*a, **kw)) or built[-1])
    with pytest.raises(AttributeError):  # no energy meters given: it stops once its trainers are built
        energy_exp.personalize(params_of(energy_exp), corpus, models, None, None, log=lambda _: None)
    assert built and set(created) == {MINE}


def test_online_latency_experiment_d9_through_the_protocol(setup, monkeypatch):
    _, models = setup
    calls = []
    monkeypatch.setattr(protocol, "online_trainer", lambda *a, **kw: calls.append(a))
    latency_exp._online(params_of(latency_exp), models)
    assert calls


def test_online_latency_experiment_d9(setup, created):
    _, models = setup
    latency_exp._online(params_of(latency_exp), models)
    assert created == [MINE]


def test_global_stopping_rule_is_the_old_one(speeches):
    """Global training keeps the last epoch that lowered the hold-out loss by at least
    `global_min_improvement` (relative), stops after `global_patience` epochs without, and reports
    the epoch of the lowest hold-out loss (as the hand-written loop did)."""
    params = params_of(top3_exp, crowd_max_words=2000, global_epochs=4, global_min_improvement=0.2)
    corpus = per_user_text.load_corpus(params, speeches, log=lambda _: None)
    entry = common.global_model(params, corpus, params.seed, log=lambda _: None)
    losses = [h["holdout_loss"] for h in entry.info["history"]]
    kept, reference, waited = 1, losses[0], 0
    for epoch, loss in enumerate(losses[1:], 2):
        if loss < reference * (1 - params.global_min_improvement):
            kept, reference, waited = epoch, loss, 0
        else:
            waited += 1
    assert entry.info["plateau"] == (waited >= params.global_patience)
    assert len(losses) == params.global_epochs or entry.info["plateau"]
    assert entry.info["best_epoch"] == int(np.argmin(losses)) + 1
    assert common.kept_epoch(entry.info) == kept  # what the model-cache table reports as kept_epoch
    model = typing_protocol.build_model(params, corpus, params.seed)
    model.set_weights(entry.weights)
    task = common.task(params)
    # one code path: global training scored each epoch with this evaluation, and the kept weights are returned
    assert np.log(task.evaluate(model, corpus.holdout_samples)["perplexity"]) == pytest.approx(
        losses[kept - 1], rel=1e-5
    )
