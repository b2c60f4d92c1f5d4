"""Personal step size: the paper's two readings of its personal configuration, "almost the same
with that of the global model, except smaller batch size" for 5 epochs (Sec. 4.1, Table 1's
caption), both with per-user stopping on held-out training lines:

- "continued": the global schedule carried on from the rate its kept epoch ran at: with the global
  model kept at epoch k, personal epoch e runs at the schedule's rate of epoch k + e - 1 (PTB: kept
  epoch 6 -> 1.0 x 0.5^2 = 0.25, then 0.125, ...);
- "restarted": the global schedule from its start (1.0 for 4 epochs, then halved per epoch).

The schedule's shape is the global one (`global_lr_decay` after `global_decay_after` epochs), its
start the personal rate (`personal_learning_rate`, 1.0 as the global model's), so the personal
fields still set personal training's rate.

RULE, fixed before any test run: the main rows use the reading with the higher median top-k-eff
gain (personalized minus global, in points as `planted`'s) on the validation users (the crowd model
of the first seed); when the two are within `step_size_tie` of each other, the higher gain on the
validation users planted at `planted_dose_star` (`planted`) decides; when that ties too,
"continued" (the nearer reading of "the same configuration"). The other reading runs on the test
users for the sensitivity table."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ondevice import streams
from ondevice.engine.stage import resumable
from ondevice.papers.deeptype import common, planted, protocol

READINGS = ("continued", "restarted")


def kept_epoch(models: common.GlobalModels, seed: int) -> int:
    """The epoch whose weights the seed's global model holds (without a hold-out: its last epoch)."""
    info = models.entries[seed].info
    kept = common.kept_epoch(info)
    return kept if kept is not None else len(info["history"])


def schedule(params, reading: str, kept: int):
    """Personal epoch (1-based) -> learning rate under `reading`, for a global model kept at epoch `kept`."""
    rate, decay, after = params.personal_learning_rate, params.global_lr_decay, params.global_decay_after
    if reading == "continued":
        return lambda epoch: rate * decay ** max(0, kept + epoch - 1 - after)
    if reading == "restarted":
        return lambda epoch: rate * decay ** max(0, epoch - after)
    raise ValueError(f"a step-size reading is one of {READINGS}, got {reading!r}")


def schedules(params, models: common.GlobalModels, reading: str):
    """seed -> `reading`'s schedule for that seed's global model."""
    return lambda seed: schedule(params, reading, kept_epoch(models, seed))


def _validation(params, corpus, models, reading: str, dose: float) -> dict:
    """`reading` on the validation users (first seed), planted at `dose`: median gain, share of epoch 0."""
    data = planted.planted(corpus, dose, params.seed, params.planted_words) if dose else corpus
    personal, start = protocol.Personal(params, models.model), models.weights[params.seed]
    gains, kept = [], []
    for user in corpus.split.validation:
        fit, held, test = data.personal_parts(user, params)
        before = personal.score_weights(start, test)["top_k_eff"]
        rng, rates = streams.rng(params.seed, f"step-size/{user}"), schedules(params, models, reading)(params.seed)
        after = personal.train((fit, test), start, params, rng, held=held, schedule=rates)[0]
        gains.append(after["top_k_eff"] - before)
        kept.append(after["kept_epoch"])
    first_rates = [schedules(params, models, reading)(params.seed)(e) for e in range(1, params.personal_epochs + 1)]
    return {
        "reading": reading,
        "dose": dose,
        "rates": ", ".join(f"{r:g}" for r in first_rates),
        "median_gain_points": float(np.median(gains)),
        "kept_epoch_0": float(np.mean(np.asarray(kept) == 0)),
        "median_kept_epoch": float(np.median(kept)),
    }


@resumable("step_size")
def select(params, corpus, models: common.GlobalModels, log=print) -> tuple[str, pd.DataFrame]:
    """Both readings on the validation users, unplanted and planted at `planted_dose_star`; the RULE's
    choice and the table (one row per reading and dose, the chosen reading marked)."""
    doses = (0.0, params.planted_dose_star)
    table = pd.DataFrame([_validation(params, corpus, models, r, d) for r in READINGS for d in doses])
    gain = table.pivot(index="reading", columns="dose", values="median_gain_points")
    chosen = choose(gain[0.0].to_dict(), gain[params.planted_dose_star].to_dict(), params.step_size_tie)
    log(f"step size: {chosen} (validation users: {gain.round(4).to_dict()})")
    return chosen, table.assign(chosen=table.reading == chosen)


def choose(real: dict[str, float], planted_gain: dict[str, float], tie: float) -> str:
    """The RULE: higher gain on the real validation users; within `tie`, on the planted ones; else "continued"."""
    for gains in (real, planted_gain):
        a, b = (gains[r] for r in READINGS)
        if abs(a - b) > tie:
            return READINGS[0] if a > b else READINGS[1]
    return READINGS[0]


def other(reading: str) -> str:
    return next(r for r in READINGS if r != reading)
