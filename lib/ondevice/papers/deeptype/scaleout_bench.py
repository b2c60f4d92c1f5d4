"""Scale-out measurement: how the per-user personalization of DeepType spreads over workers.

    python -m ondevice.papers.deeptype.scaleout_bench --scale default --workers 1 2 [--compare] [--out DIR]

Printed and written as CSV (timings depend on the machine): with `--compare`, Ray against Dask
here (start-up, per-job overhead on a reused and a fresh worker, memory), the numbers the engine
was chosen by; then the personalization stage (each seed and test user: score, train, score)
through `ondevice.engine` with 1, 2, ... workers: wall time, speed-up, peak worker memory and the
cost per user, from which paper-scale wall time is estimated. `personal_job` is also the smoke
experiment of tests/test_engine.py: a job depends only on its arguments, so rows match anywhere.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import threading
import time
import types
from pathlib import Path

import numpy as np
import pandas as pd
import psutil

from ondevice import engine, streams
from ondevice.report import facts

# TensorFlow (through papers.deeptype.common and tasks.typing_protocol) is imported inside functions
# only: spawned processes re-import the module that `python -m` ran, and Dask's workers must stay
# free of TensorFlow.
_VALUES = facts.load("deeptype")["scaleout_bench"]["values"]  # DeepType Sec. 6: test users, personal epochs
PAPER_USERS, PAPER_EPOCHS = _VALUES["test_users"], _VALUES["personal_epochs"]


def bench_params(scale: str, seed: int = 0, **overrides):
    """DeepType's shared parameters at `scale` (model, split, personal training); one personal
    epoch at smoke and default scale: the cost of more is estimated from it."""
    from ondevice.tasks import typing_protocol

    class Params(typing_protocol.DeepTypeParams):
        personal_holdout_fraction: float = 0.0  # fixed epochs: a benchmark of the same work
        PRESETS = typing_protocol.presets({"smoke": dict(personal_epochs=1), "default": dict(personal_epochs=1)})

    return Params.for_scale(scale, seed, **overrides)


_trainers: dict = {}  # per process: a worker that runs several jobs compiles its train step once
PERSONAL = ("personal_optimizer", "personal_learning_rate", "personal_epochs", "personal_batch_size")
PERSONAL += ("personal_clip_norm", "personal_loss_per")


def personal_job(shared: dict, seed: int, user: str, train, test) -> dict:
    """One (seed, user) of the personalization stage: the global model's score on the user's
    later lines, incremental training on the earlier ones (DeepType's protocol, the personal
    fields in `shared`), the score again. Every random draw comes from the user's own stream, so
    the row does not depend on where or after what it runs."""
    from ondevice.models import lstm_lm
    from ondevice.papers.deeptype import protocol
    from ondevice.tasks.next_word import NextWordTask
    from ondevice.training.trainer import seed_everything

    start = time.perf_counter()
    seed_everything(seed)  # op determinism, in a fresh worker as in this process
    fields = types.SimpleNamespace(**shared["personal"])
    key = (shared["config"], shared["k"], *shared["personal"].values())
    if key not in _trainers:
        _trainers[key] = protocol.personal_trainer(
            fields, lstm_lm.build(shared["config"]), NextWordTask(shared["k"], loss_per=fields.personal_loss_per)
        )
    trainer, weights = _trainers[key], shared["weights"][seed]
    trainer.reset(weights)
    before = trainer.task.evaluate(trainer.model, test)
    history = protocol.personalize(trainer, weights, train, fields, streams.rng(seed, f"personal/{user}"))
    after = trainer.task.evaluate(trainer.model, test)
    last = history[-1] if history else {"loss": float("nan"), "steady_step_seconds": float("nan")}
    row = dict(seed=seed, user=user, train_samples=len(train), test_samples=len(test))
    row.update(top_k_eff_global=before["top_k_eff"], top_k_eff_personalized=after["top_k_eff"])
    row.update(perplexity_global=before["perplexity"], perplexity_personalized=after["perplexity"])
    row.update(final_loss=last["loss"], steps=sum(h["steps"] for h in history))
    row.update(train_seconds=sum(h["seconds"] for h in history), steady_step_seconds=last["steady_step_seconds"])
    return row | {"job_seconds": time.perf_counter() - start, "pid": os.getpid()}


def personal_jobs(params, corpus, models, users: list[str]) -> tuple[list[engine.Job], dict]:
    """The stage's jobs, one per (seed, user), and what they share: the global weights per seed
    (trained once in this process) and the personal training settings."""
    from ondevice.tasks import typing_protocol

    shared = dict(config=typing_protocol.model_config(params, corpus), weights=models.weights, k=params.k)
    shared["personal"] = {name: getattr(params, name) for name in PERSONAL}
    jobs = []
    for seed in params.seed_list:
        for user in users:
            train, test = corpus.personal(user, params.personal_train_fraction)
            kwargs = {"seed": seed, "user": user, "train": train, "test": test}
            jobs.append(engine.Job(f"seed={seed}/user={user}", personal_job, kwargs))
    return jobs, shared


class MemoryPeak(threading.Thread):
    """Samples, every `every` seconds, the resident memory of this process's descendants that
    `is_worker` selects (summed) and of all of them; keeps the peaks."""

    def __init__(self, is_worker, every: float = 0.2):
        super().__init__(daemon=True)
        self.is_worker, self.every, self.done = is_worker, every, threading.Event()
        self.workers_peak = self.total_peak = 0

    def sample(self) -> None:
        sizes = []
        for p in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                sizes.append((p.memory_info().rss, self.is_worker(p)))
        self.total_peak = max(self.total_peak, sum(rss for rss, _ in sizes))
        self.workers_peak = max(self.workers_peak, sum(rss for rss, worker in sizes if worker))

    def run(self) -> None:
        while not self.done.wait(self.every):
            self.sample()

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.join()


def _ray_worker(p: psutil.Process) -> bool:
    return p.name().startswith("ray::") or "default_worker.py" in " ".join(p.cmdline())


def _dask_worker(p: psutil.Process) -> bool:
    """Dask's worker processes (spawned by multiprocessing) and their job processes (started by
    ondevice.engine.process)."""
    command = " ".join(p.cmdline())
    return "spawn_main" in command or "ondevice.engine.process" in command


def stage_table(params, workers: list[int], log=print) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The personalization stage with each worker count (the same jobs, global models trained once
    here): a summary row per setting and every job's row. `overhead_per_job_seconds`: wall time
    per job beyond the job's own seconds (its process, TensorFlow's import)."""
    from ondevice.data import per_user_text
    from ondevice.papers.deeptype import common

    corpus = per_user_text.load_corpus(params, log=log)
    models = common.train_global(params, corpus, log)
    jobs, shared = personal_jobs(params, corpus, models, list(corpus.split.test))
    summary, rows = [], []
    for n in workers:
        spec = engine.EngineSpec("dask", workers=n)
        start = time.perf_counter()
        with MemoryPeak(_dask_worker) as memory, engine.open_engine(spec) as eng:
            started = time.perf_counter()
            results = engine.run_jobs(jobs, shared, eng, log=log)
            wall = time.perf_counter() - started
        job_seconds = float(np.mean([r["job_seconds"] for r in results]))
        row = dict(engine="dask", workers=n, jobs=len(jobs), startup_seconds=started - start, wall_seconds=wall)
        row.update(workers_peak_rss_mb=memory.workers_peak / 2**20, engine_peak_rss_mb=memory.total_peak / 2**20)
        row.update(
            mean_job_seconds=job_seconds, mean_train_seconds=float(np.mean([r["train_seconds"] for r in results]))
        )
        summary.append(row | {"overhead_per_job_seconds": wall * n / len(jobs) - job_seconds})
        rows += [{"workers": n, **r} for r in results]
        log(f"{n} worker(s): {len(jobs)} jobs in {wall:.1f}s, peak worker RSS {memory.workers_peak / 2**20:.0f} MB")
    table = pd.DataFrame(summary)
    table["speedup"] = table.wall_seconds.iloc[0] / table.wall_seconds
    jobs_table = pd.DataFrame(rows)
    results = ["top_k_eff_global", "top_k_eff_personalized", "perplexity_personalized", "final_loss"]
    first = jobs_table[jobs_table.workers == workers[0]][results].to_numpy()
    same = [np.array_equal(first, jobs_table[jobs_table.workers == n][results].to_numpy()) for n in workers]
    table["results_identical"] = same
    return table, jobs_table


def paper_estimate(params, summary: pd.DataFrame, jobs_table: pd.DataFrame) -> pd.DataFrame:
    """Wall time of DeepType's personalization protocol (100 users x 5 epochs) at this scale's
    model and user sizes, per worker count: the measured cost of a user-epoch of training plus
    the rest of a job (its process, TensorFlow's import, two evaluations), from the first
    setting's wall time, divided by each setting's measured speed-up."""
    base = summary.iloc[0]
    first = jobs_table[jobs_table.workers == base.workers]
    epoch = float((first.train_seconds / max(params.personal_epochs, 1)).mean())
    rest = float(base.wall_seconds * base.workers / base.jobs - first.train_seconds.mean())
    serial = PAPER_USERS * (PAPER_EPOCHS * epoch + rest)
    table = pd.DataFrame({"workers": summary.workers, "seconds_per_user_epoch": epoch, "seconds_per_user_rest": rest})
    return table.assign(
        paper_users=PAPER_USERS, paper_epochs=PAPER_EPOCHS, estimated_hours=serial / (summary.speedup * 3600)
    )


# Both engines run `worker.call(exec, code, {}, cpus)`: a job whose unpickling imports nothing,
# so start-up and overhead are the engine's own; TF_JOB is what a fresh worker pays before any
# real job (importing TensorFlow).
NOOP, TF_JOB = "pass", "import tensorflow as tf; tf.ones(1).numpy()"
ENGINE_COLUMNS = (
    "startup_seconds",
    "trivial_job_ms",
    "fresh_worker_tf_job_seconds",
    "engine_rss_mb",
    "idle_workers_rss_mb",
)
RAY_INIT = dict(include_dashboard=False, log_to_driver=False, logging_level="ERROR", object_store_memory=512 * 2**20)


def _measure(submit, is_worker, workers: int, trivial_jobs: int, tf_jobs: int, start: float) -> dict:
    """Start-up (until `workers` trivial jobs ran), resident memory, per-job overhead, and a job
    importing TensorFlow on a fresh worker; `submit(code, n, fresh)` runs n jobs and waits."""
    submit(NOOP, workers, False)
    startup, memory = time.perf_counter() - start, MemoryPeak(is_worker)
    memory.sample()
    start = time.perf_counter()
    submit(NOOP, trivial_jobs, False)
    trivial, start = (time.perf_counter() - start) / trivial_jobs, time.perf_counter()
    submit(TF_JOB, tf_jobs, True)
    recycled = (time.perf_counter() - start) * workers / tf_jobs
    values = (startup, 1000 * trivial, recycled, memory.total_peak / 2**20, memory.workers_peak / 2**20)
    return dict(zip(ENGINE_COLUMNS, values))


def _ray_row(workers: int, trivial_jobs: int, tf_jobs: int) -> dict:
    import ray

    from ondevice.engine import worker

    start = time.perf_counter()
    try:
        ray.init(num_cpus=workers, **RAY_INIT)
        call, fresh = ray.remote(num_cpus=1)(worker.call), ray.remote(num_cpus=1, max_calls=1)(worker.call)
        submit = lambda code, n, new: ray.get([(fresh if new else call).remote(exec, code, {}, 1) for _ in range(n)])  # noqa: E731
        row = _measure(submit, _ray_worker, workers, trivial_jobs, tf_jobs, start)
    finally:
        ray.shutdown()
    return {"engine": f"ray {ray.__version__}", **row, "recycling": "per job: a new worker (max_calls=1)"}


def _dask_row(workers: int, trivial_jobs: int, tf_jobs: int) -> dict:
    """Through the suite's Dask backend: its start-up, and its recycled jobs (a job process each)."""
    import distributed

    from ondevice.engine import worker

    start = time.perf_counter()
    with engine.open_engine(engine.EngineSpec("dask", workers=workers)) as eng:

        def submit(code: str, n: int, fresh: bool) -> None:
            if fresh:  # the suite's recycling: a job process per job
                engine.run_jobs([engine.Job(f"tf{i}", exec) for i in range(n)], code, eng, log=lambda *_: None)
            else:
                eng.client.gather(eng.client.map(worker.call, [exec] * n, [code] * n, [{}] * n, [1] * n, pure=False))

        row = _measure(submit, _dask_worker, workers, trivial_jobs, tf_jobs, start)
    recycling = "per job: a new job process (ondevice.engine.process)"
    return {"engine": f"dask distributed {distributed.__version__}", **row, "recycling": recycling}


def compare_engines(workers: int, repeats: int = 2, trivial_jobs: int = 200, tf_jobs: int = 4, log=print):
    """Start-up, per-job overhead and resident memory of a local Ray and a local Dask with
    `workers` single-threaded worker processes (both spawn fresh processes), alternating
    `repeats` times so both see the same machine load. Ray is measured when it is installed
    (`pip install -c requirements.lock ray`); the suite itself runs on Dask."""
    rows = []
    for repeat in range(1, repeats + 1):
        for measure in (_dask_row, _ray_row):
            try:
                rows.append({"repeat": repeat, "workers": workers, **measure(workers, trivial_jobs, tf_jobs)})
            except Exception as exc:  # noqa: BLE001  (e.g. Ray not installed, or its node timed out starting)
                error = f"{type(exc).__name__}: {exc}"[:200]
                rows.append({"repeat": repeat, "workers": workers, "engine": measure.__name__[1:-4], "error": error})
            log(f"[compare] {rows[-1]}")
    return pd.DataFrame(rows)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", default="default", choices=("smoke", "default", "paper"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--seeds", type=int, default=0, help="training seeds (default: the scale's preset)")
    parser.add_argument("--compare", action="store_true", help="also measure Ray against Dask distributed")
    parser.add_argument("--out", default="", help="directory for the CSVs (default results/<scale>/scaleout_bench)")
    args = parser.parse_args(argv)
    from ondevice import REPO_ROOT

    out = Path(args.out or REPO_ROOT / "results" / args.scale / "scaleout_bench")
    out.mkdir(parents=True, exist_ok=True)
    pd.set_option("display.width", 200)
    if args.compare:
        engines = compare_engines(max(args.workers))
        engines.to_csv(out / "engines.csv", index=False)
        print(engines.to_string(index=False))
    params = bench_params(args.scale, args.seed, **({"seeds": args.seeds} if args.seeds else {}))
    summary, jobs_table = stage_table(params, args.workers)
    estimate = paper_estimate(params, summary, jobs_table)
    for name, table in (("scaling", summary), ("jobs", jobs_table), ("paper_estimate", estimate)):
        table.to_csv(out / f"{name}.csv", index=False)
    print(summary.to_string(index=False), estimate.to_string(index=False), sep="\n")
    model = f"{params.hidden_units} LSTM units, vocabulary {params.vocab_size} (paper: 400 and 20,000)"
    print(
        f"model: {model}; estimate = 100 users x (5 x the measured cost of a user-epoch + the rest of a job) / the "
        f"measured speed-up. CSVs in {out}"
    )


if __name__ == "__main__":
    main()
