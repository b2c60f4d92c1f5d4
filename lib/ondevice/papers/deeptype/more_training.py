"""The paper's control for "personalization beats more global training for the same steps" (Sec.
6.1.2: a global model given more text). Ours is the other reading the paper allows: the crowd global
model trained on, on crowd text, for as many steps as `personal_epochs` personal epochs of the median
test user (its training lines less the hold-out, in batches of `personal_batch_size`), each of those
epochs at the main step-size reading's rate (`step_size`). The step count is the same for every user
and never 0, so the control is never the global model itself; one continuous run per seed, scored
on each test user's later lines."""

from __future__ import annotations

import itertools

import numpy as np

from ondevice import streams
from ondevice.data.typing_samples import batch_indices
from ondevice.papers.deeptype import protocol


def epoch_steps(params, corpus) -> int:
    """Batches in one personal epoch of the median test user (at least 1)."""
    per_user = [
        sum(1 for _ in batch_indices(corpus.personal_parts(u, params)[0], params.personal_batch_size, None))
        for u in corpus.split.test
    ]
    return max(1, int(np.median(per_user)))


def run(params, corpus, models, schedule, row, condition: str, log=print) -> list[dict]:
    """The control's rows (`row(seed, user, condition, parts, score, steps=...)` builds each): per
    seed, `personal_epochs` blocks of `epoch_steps` crowd batches, block e at `schedule(seed)(e)`."""
    p, out, per_epoch = params, [], epoch_steps(params, corpus)
    personal = protocol.Personal(p, models.model)
    for seed in p.seed_list:
        trainer, rates = personal.trainer(p), schedule(seed)
        trainer.reset(models.weights[seed])
        rng = streams.rng(seed, "control")  # batches without end, each pass over the crowd reshuffled
        batches = (
            b
            for _ in itertools.count()
            for b in personal.task.batches(corpus.crowd_samples, p.personal_batch_size, rng)
        )
        for epoch in range(1, p.personal_epochs + 1):
            trainer.optimizer.learning_rate = rates(epoch)
            for _ in range(per_epoch):
                trainer.step(*next(batches))
        steps = p.personal_epochs * per_epoch
        for user in corpus.split.test:
            parts = corpus.personal_parts(user, p)
            out.append(row(seed, user, condition, parts, personal.score(trainer.model, parts[2]), steps=steps))
        log(f"control, seed {seed}: {steps} more steps of crowd training ({p.personal_epochs} x {per_epoch})")
    return out
