"""Personal training of many users as `engine` jobs, for top3eff's switched-back protocols
(`sensitivity`) and its planted control (`planted_condition`): a job is a group of one seed's users
(`per_job`); each user's start model is scored on its later lines, then personalized from it as the
main rows are (`protocol.Personal.train`: the hold-out, the step-size reading's rates, the main rows'
random stream). With an engine of several workers (`make reproduce ENGINE=dask`), users train in parallel
processes; the rows are those of training one at a time (`tests/test_engine.py`)."""

from __future__ import annotations

import functools
import math

from ondevice import engine, streams
from ondevice.models import lstm_lm
from ondevice.papers.deeptype import protocol, step_size
from ondevice.papers.deeptype.common import GlobalModels


@functools.cache  # per process: one model and its trainers per (params, architecture)
def _personal(params, config: lstm_lm.LSTMConfig) -> protocol.Personal:
    return protocol.Personal(params, lstm_lm.build(config))


def users_job(shared: dict, seed: int, users: list[str], data: list[dict]) -> list[dict]:
    """Each user of `data` ({"parts": (fit, held, test)}, and "scored": the test lines the start is
    scored on when they differ, e.g. in the global vocabulary): the start's and the personal model's rows."""
    p, start = shared["params"], shared["weights"][seed]
    personal, reading = _personal(p, shared["config"]), shared["reading"]
    rates = step_size.schedule(p, reading, shared["kept"][seed]) if reading else None
    rows = []
    for user, d in zip(users, data):
        fit, held, test = d["parts"]
        before = personal.score_weights(start, d.get("scored", test))["top_k_eff"]
        rng = streams.rng(seed, f"personal/{user}")
        after = personal.train((fit, test), start, p, rng, held=held, schedule=rates)[0]
        row = {"seed": seed, "user": user, "top_k_eff_global": before}
        rows.append(row | {k: v for k, v in after.items() if not k.startswith("_")})
    return rows


def per_job(users: int) -> int:
    """Users per job: two jobs per worker of the engine, so a job process's start (TensorFlow's import,
    the model's build and tracing: seconds) is paid a few times per run, not once per user."""
    return max(1, math.ceil(users / (2 * engine.EngineSpec.from_env().workers)))


def run(params, models: GlobalModels, config, reading: str | None, users: list[str], data, name: str, log) -> list:
    """`users_job` for every seed and user (`data(user)`: its dict), from `models`' weights at the
    step-size `reading` (None: the constant personal rate); resumable under `name` in the run's jobs directory."""
    shared = {"params": params, "config": config, "weights": models.weights, "reading": reading}
    shared["kept"] = {s: step_size.kept_epoch(models, s) for s in params.seed_list}
    jobs = protocol.group_jobs(params.seed_list, users, per_job(len(users)), users_job, data)
    results = engine.run_jobs(jobs, shared, run_dir=engine.jobs_dir(name), log=log)
    return [r for got in results for r in got]
