"""The variants of the energy study (D9, Fig. 9b) trained inside the meters' windows: un-optimised
(full incremental training), fine-tune training alone, and all four of DeepType's optimisations
combined, each `techniques/combined.py`'s variant as Table 2 builds it (the combined one: the SVD
global model at the rule's rank, cut to the user's words, fine-tuned on equal-length batches)."""

from __future__ import annotations

import time

import numpy as np

from ondevice import streams
from ondevice.device.energy.base import measuring
from ondevice.device.energy.workload import step_flops
from ondevice.papers.deeptype import protocol
from ondevice.papers.deeptype.techniques import combined
from ondevice.training.trainer import StepTimer

VARIANTS = {
    "full": "un-optimised (full training)",
    "fine_tune": "fine-tune alone",
    "combined": "optimised (all combined)",
}
SPECS = {"full": combined.VARIANTS["baseline"], "fine_tune": combined.VARIANTS["fine_tune"]}
SPECS["combined"] = combined.VARIANTS["combined"]


def setup(params, variant: str, shared: dict, models, compressed, data, seed: int):
    """(trainer, starting weights, train, test) of one variant: the full and fine-tune trainers are
    shared; the combined variant's model is the user's own (`combined.Variant.for_seed`: the SVD
    global model cut to the user's words), its trainer built and traced before any window opens."""
    spec = SPECS[variant]
    model, weights, train, test, _ = spec.for_seed(models, compressed, seed, *data)
    if not spec.vocab:
        return shared[variant], weights, train, test
    trainer = protocol.personal_trainer(params, model, shared["full"].task, spec.hooks(params))
    warm_up({variant: trainer}, weights, train, params, seed)
    return trainer, weights, train, test


def warm_up(trainers, weights, train, params, seed: int, steps: int = 3) -> None:
    """Trace each trainer's step before any window opens, so no window pays for compilation; the
    reset before each user undoes these steps."""
    for variant, trainer in trainers.items():
        rng = streams.rng(seed, "energy/warm-up")
        batches = SPECS[variant].batch_list(trainer.task, train, params, rng)[:steps]
        trainer.reset(weights)
        for x, y in batches:
            trainer.step(x, y)


def train(params, variant, setup_, models, env, test0, seed, user, governor, evaluate: bool) -> dict:
    """One personal training inside the meters' window, with its counted work (the same batches,
    from the same stream) and, on the baseline governor, top-k-eff of the global model (on the
    user's test words, `test0`) and of the personal one (on the variant's own test ids)."""
    trainer, weights, train, test = setup_
    task, model = trainer.task, trainer.model
    row = dict(governor=governor, seed=seed, user=user, variant=variant)
    if evaluate:
        models.model.set_weights(models.weights[seed])
        before = task.evaluate(models.model, test0)["top_k_eff"]
    trainer.timer = StepTimer(trainer.timer.warmup)
    start_epoch, start = time.time(), time.perf_counter()
    with measuring(env.measured) as readings:
        history = protocol.personalize(trainer, weights, train, params, streams.rng(seed, f"personal/{user}"))
    seconds, stop_epoch = time.perf_counter() - start, time.time()
    steady = trainer.timer.steady()
    if not np.isfinite(steady):  # fewer steps than the warm-up: all of them
        steady = float(np.mean(trainer.timer.durations))
    rng, tokens, flops = streams.rng(seed, f"personal/{user}"), 0, 0.0
    for _ in range(params.personal_epochs):
        for x, _ in SPECS[variant].batch_list(task, train, params, rng):
            tokens += int(x.size)
            flops += step_flops(model, trainer.variables_to_train, int(x.size), model.output_shape[-1])
    row.update(steps=sum(h["steps"] for h in history), tokens=tokens, gflops=flops / 1e9)
    row.update(trained_parameters=int(sum(v.shape.num_elements() for v in trainer.variables_to_train)))
    row.update(steady_step_seconds=steady, train_seconds=seconds, start_time_epoch=start_epoch)
    row.update(stop_time_epoch=stop_epoch, _readings=readings)
    if evaluate:
        row.update(top_k_eff_global=before, top_k_eff_personalized=task.evaluate(model, test)["top_k_eff"])
    return row
