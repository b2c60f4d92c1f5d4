"""Scale-out measurement: how the per-user personalization of DeepType spreads over workers.

Two parts, one run, printed and written as CSV (not a test: timings depend on the machine):

1. `--compare`: Ray against Dask distributed on this machine, the numbers the engine was chosen
   by: start-up time of a local engine with N workers, per-job overhead (a trivial job on a
   reused worker, and a job that imports TensorFlow on a fresh worker, as every recycled worker
   does), and the engine's resident memory (its daemons and idle workers).
2. The DeepType personalization stage (every test user of the scale, each seed: score the global
   model, train on the user's earlier lines, score again) through `ondevice.engine` with 1, 2, ...
   workers: wall time, speed-up over 1 worker, peak resident memory of the workers, and the cost
   per user, from which paper-scale wall time is estimated.

    python -m ondevice.papers.deeptype.experiments.scaleout_bench --scale default --workers 1 2 [--compare] [--out DIR]

`personal_job` is also the smoke experiment of tests/test_engine.py: the same rows whatever the
engine, because a job depends only on its arguments (the global weights travel in `shared`, the
batches come from the user's own stream).
"""
from __future__ import annotations

import argparse
import os
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import psutil

from ondevice import engine, streams

# TensorFlow (through deeptype_common) is imported inside functions only: spawned processes
# re-import the module that `python -m` ran, and Dask's workers must stay free of TensorFlow.
PAPER_USERS, PAPER_EPOCHS = 100, 5  # DeepType Sec. 6: 100 test users, 5 personal epochs
SCALES = ("smoke", "default", "paper")


def bench_params(scale: str, seed: int = 0, **overrides):
    """DeepType's shared parameters at `scale` (model, split, personal training); one personal
    epoch at smoke and default scale: the cost of more is estimated from it."""
    from ondevice.papers.deeptype import common

    class Params(common.DeepTypeParams):
        PRESETS = common.presets({"smoke": dict(personal_epochs=1), "default": dict(personal_epochs=1)})

    return Params.for_scale(scale, seed, **overrides)


# --- the job -------------------------------------------------------------------------------

_trainers: dict = {}  # per process: a worker that runs several jobs compiles its train step once


def _trainer(config, k: int, learning_rate: float, optimizer: str):
    from ondevice.models import lstm_lm
    from ondevice.tasks.next_word import NextWordTask
    from ondevice.training.trainer import Trainer

    key = (config, k, learning_rate, optimizer)
    if key not in _trainers:
        _trainers[key] = Trainer(lstm_lm.build(config), NextWordTask(k), learning_rate, optimizer)
    return _trainers[key]


def personal_job(shared: dict, seed: int, user: str, train, test) -> dict:
    """One (seed, user) of the personalization stage: the global model's score on the user's
    later lines, incremental training on the earlier ones, the score again. Every random draw
    comes from the user's own stream, so the row does not depend on where or after what it runs."""
    from ondevice.papers.deeptype.techniques.incremental import personalize
    from ondevice.training.trainer import seed_everything

    start = time.perf_counter()
    seed_everything(seed)  # op determinism, in a fresh worker as in this process
    trainer = _trainer(shared["config"], shared["k"], shared["learning_rate"], shared["optimizer"])
    weights = shared["weights"][seed]
    trainer.reset(weights)
    before = trainer.task.evaluate(trainer.model, test)
    history = personalize(trainer, weights, train, shared["epochs"], shared["batch_size"],
                          streams.rng(seed, f"personal/{user}"))
    after = trainer.task.evaluate(trainer.model, test)
    return {"seed": seed, "user": user, "train_samples": len(train), "test_samples": len(test),
            "top_k_eff_global": before["top_k_eff"], "top_k_eff_personalized": after["top_k_eff"],
            "perplexity_global": before["perplexity"], "perplexity_personalized": after["perplexity"],
            "final_loss": history[-1]["loss"] if history else float("nan"),
            "steps": sum(h["steps"] for h in history),
            "train_seconds": sum(h["seconds"] for h in history),
            "steady_step_seconds": history[-1]["steady_step_seconds"] if history else float("nan"),
            "job_seconds": time.perf_counter() - start, "pid": os.getpid()}


def personal_jobs(params, corpus, models, users: list[str]) -> tuple[list[engine.Job], dict]:
    """The stage's jobs, one per (seed, user), and what they share: the global weights per seed
    (trained once in this process) and the personal training settings."""
    from ondevice.papers.deeptype import common

    shared = {"config": common.model_config(params, corpus), "weights": models.weights, "k": params.k,
              "learning_rate": params.personal_learning_rate, "optimizer": params.personal_optimizer,
              "epochs": params.personal_epochs, "batch_size": params.personal_batch_size}
    jobs = []
    for seed in params.seed_list:
        for user in users:
            train, test = corpus.personal(user, params.personal_train_fraction)
            jobs.append(engine.Job(f"seed={seed}/user={user}", personal_job,
                                   {"seed": seed, "user": user, "train": train, "test": test}))
    return jobs, shared


# --- measuring -----------------------------------------------------------------------------

class MemoryPeak:
    """Samples, every `every` seconds, the resident memory of this process's descendants that
    `is_worker` selects (summed) and of all of them; keeps the peaks."""

    def __init__(self, is_worker, every: float = 0.2):
        self.is_worker, self.every = is_worker, every
        self.workers_peak = self.total_peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        workers = total = 0
        for p in psutil.Process().children(recursive=True):
            try:
                rss = p.memory_info().rss
                worker = self.is_worker(p)
            except psutil.Error:
                continue
            total += rss
            workers += rss if worker else 0
        self.workers_peak, self.total_peak = max(self.workers_peak, workers), max(self.total_peak, total)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self._sample()

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def _ray_worker(p: psutil.Process) -> bool:
    return p.name().startswith("ray::") or "default_worker.py" in " ".join(p.cmdline())


def _dask_worker(p: psutil.Process) -> bool:
    """Dask's worker processes and their job processes (both spawned by multiprocessing)."""
    return "spawn_main" in " ".join(p.cmdline())


def stage_table(params, workers: list[int], log=print) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The personalization stage with each worker count (the same jobs each time): a summary row
    per setting and every job's row. The global models are trained (or read from the model
    cache) once, here. A job's own seconds exclude starting its process and importing
    TensorFlow; `overhead_per_job_seconds` is that difference."""
    from ondevice.papers.deeptype import common

    corpus = common.load_corpus(params, log=log)
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
        summary.append({"engine": "dask", "workers": n, "jobs": len(jobs), "startup_seconds": started - start,
                        "wall_seconds": wall, "workers_peak_rss_mb": memory.workers_peak / 2**20,
                        "engine_peak_rss_mb": memory.total_peak / 2**20, "mean_job_seconds": job_seconds,
                        "mean_train_seconds": float(np.mean([r["train_seconds"] for r in results])),
                        "overhead_per_job_seconds": wall * n / len(jobs) - job_seconds})
        rows += [{"workers": n, **r} for r in results]
        log(f"{n} worker(s): {len(jobs)} jobs in {wall:.1f}s, peak worker RSS {memory.workers_peak / 2**20:.0f} MB")
    table = pd.DataFrame(summary)
    table["speedup"] = table.wall_seconds.iloc[0] / table.wall_seconds
    jobs_table = pd.DataFrame(rows)
    results = ["top_k_eff_global", "top_k_eff_personalized", "perplexity_personalized", "final_loss"]
    first = jobs_table[jobs_table.workers == workers[0]][results].to_numpy()
    table["results_identical"] = [np.array_equal(first, jobs_table[jobs_table.workers == n][results].to_numpy())
                                  for n in workers]
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
    return pd.DataFrame([{"workers": row.workers, "seconds_per_user_epoch": epoch, "seconds_per_user_rest": rest,
                          "paper_users": PAPER_USERS, "paper_epochs": PAPER_EPOCHS,
                          "estimated_hours": serial / (row.speedup * 3600)} for row in summary.itertuples()])


# --- Ray against Dask ----------------------------------------------------------------------

# Both engines run `worker.call(exec, code, {}, cpus)`: a job whose unpickling imports nothing,
# so start-up and overhead are the engine's own; TF_JOB is what a fresh worker pays before any
# real job (importing TensorFlow).
NOOP, TF_JOB = "pass", "import tensorflow as tf; tf.ones(1).numpy()"


def _engine_rss(is_worker) -> tuple[float, float]:
    sampler = MemoryPeak(is_worker)
    sampler._sample()
    return sampler.total_peak / 2**20, sampler.workers_peak / 2**20


def _ray_row(workers: int, trivial_jobs: int, tf_jobs: int) -> dict:
    import ray

    from ondevice.engine import worker

    start = time.perf_counter()
    try:
        ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
                 object_store_memory=512 * 2**20)
        call = ray.remote(num_cpus=1)(worker.call)
        ray.get([call.remote(exec, NOOP, {}, 1) for _ in range(workers)])
        startup = time.perf_counter() - start
        total_mb, workers_mb = _engine_rss(_ray_worker)
        start = time.perf_counter()
        ray.get([call.remote(exec, NOOP, {}, 1) for _ in range(trivial_jobs)])
        trivial = (time.perf_counter() - start) / trivial_jobs
        fresh = ray.remote(num_cpus=1, max_calls=1)(worker.call)
        start = time.perf_counter()
        ray.get([fresh.remote(exec, TF_JOB, {}, 1) for _ in range(tf_jobs)])
        recycled = (time.perf_counter() - start) * workers / tf_jobs
    finally:
        ray.shutdown()
    return {"engine": f"ray {ray.__version__}", "startup_seconds": startup, "trivial_job_ms": 1000 * trivial,
            "fresh_worker_tf_job_seconds": recycled, "engine_rss_mb": total_mb, "idle_workers_rss_mb": workers_mb,
            "recycling": "per job: a new worker (max_calls=1)"}


def _dask_row(workers: int, trivial_jobs: int, tf_jobs: int) -> dict:
    """Through the suite's Dask backend: its start-up, and its recycled jobs (a job process each)."""
    import distributed

    from ondevice.engine import worker

    start = time.perf_counter()
    with engine.open_engine(engine.EngineSpec("dask", workers=workers)) as eng:
        eng.client.gather(eng.client.map(worker.call, [exec] * workers, [NOOP] * workers, [{}] * workers,
                                         [1] * workers, pure=False))
        startup = time.perf_counter() - start
        total_mb, workers_mb = _engine_rss(_dask_worker)
        start = time.perf_counter()
        eng.client.gather(eng.client.map(worker.call, [exec] * trivial_jobs, [NOOP] * trivial_jobs,
                                         [{}] * trivial_jobs, [1] * trivial_jobs, pure=False))
        trivial = (time.perf_counter() - start) / trivial_jobs
        start = time.perf_counter()
        engine.run_jobs([engine.Job(f"tf{i}", exec) for i in range(tf_jobs)], TF_JOB, eng, log=lambda *_: None)
        recycled = (time.perf_counter() - start) * workers / tf_jobs
    return {"engine": f"dask distributed {distributed.__version__}", "startup_seconds": startup,
            "trivial_job_ms": 1000 * trivial, "fresh_worker_tf_job_seconds": recycled, "engine_rss_mb": total_mb,
            "idle_workers_rss_mb": workers_mb, "recycling": "per job: a spawned job process (ondevice.engine)"}


def compare_engines(workers: int, repeats: int = 2, trivial_jobs: int = 200, tf_jobs: int = 4, log=print) -> pd.DataFrame:
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
                rows.append({"repeat": repeat, "workers": workers, "engine": measure.__name__[1:-4],
                             "error": f"{type(exc).__name__}: {exc}"[:200]})
            log(f"[compare] {rows[-1]}")
    return pd.DataFrame(rows)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", default="default", choices=SCALES)
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
    summary.to_csv(out / "scaling.csv", index=False)
    jobs_table.to_csv(out / "jobs.csv", index=False)
    estimate.to_csv(out / "paper_estimate.csv", index=False)
    print(summary.to_string(index=False))
    print(estimate.to_string(index=False))
    print(f"model: {params.hidden_units} LSTM units, vocabulary {params.vocab_size} (paper: 400 and 20,000, "
          f"several times the work per step); estimate = 100 users x (5 x the measured cost of a user-epoch "
          f"+ the rest of a job) / the measured speed-up. CSVs in {out}")


if __name__ == "__main__":
    main()
