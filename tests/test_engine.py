"""The job engine: a smoke experiment gives the same rows in this process and on a local Dask
with 2 workers; failing jobs are retried once, then reported by key; an interrupted run resumes
without recomputing finished jobs. (On a cluster of separate processes: test_engine_cluster.py.)"""

import os
import signal
from pathlib import Path

import pandas as pd
import pytest

from ondevice import engine
from ondevice.engine import EngineSpec, Job, JobsFailed, run_jobs

SEQUENTIAL = EngineSpec("sequential")


@pytest.fixture(scope="module")
def dask_engine():
    """One local Dask with 2 workers for the module (starting it takes seconds)."""
    with engine.open_engine(EngineSpec("dask", workers=2)) as eng:
        yield eng


def _first(samples, n: int):
    """The first n samples (a few training steps keep the test short)."""
    from ondevice.data.typing_samples import Samples

    end = samples.offsets[n]
    return Samples(
        samples.inputs[:end],
        samples.labels[:end],
        samples.offsets[: n + 1],
        samples.n_context[:n],
        samples.word_len[:n],
        samples.target[:n],
    )


@pytest.fixture(scope="module")
def smoke_jobs(speeches):
    """DeepType's personalization stage at smoke scale for the test users and a validation user: 8
    personal steps each from a global model trained once here, passed to the jobs as weights.
    (deeptype_common loads TensorFlow, so it is imported here, not at the top: the job processes
    that run the small jobs below import this module, and need not load it.)"""
    from ondevice.data import per_user_text
    from ondevice.papers.deeptype import common, scaleout_bench

    params = scaleout_bench.bench_params("smoke", 0, seeds=1, crowd_max_words=4000)
    corpus = per_user_text.load_corpus(params, speeches, log=lambda *_: None)
    models = common.train_global(params, corpus, log=lambda *_: None)
    users = list(corpus.split.test) + list(corpus.split.validation)[:1]  # 3 jobs: a worker runs two
    jobs, shared = scaleout_bench.personal_jobs(params, corpus, models, users)
    small = [
        Job(
            j.key,
            j.fn,
            {
                **j.kwargs,
                "train": _first(j.kwargs["train"], 8 * params.personal_batch_size),
                "test": _first(j.kwargs["test"], 200),
            },
        )
        for j in jobs
    ]
    return small, shared


def _table(rows):
    return pd.DataFrame(rows).drop(columns=["train_seconds", "steady_step_seconds", "job_seconds", "pid"])


@pytest.mark.slow(reason="two spawned Dask workers each import TensorFlow and train the smoke users")
def test_smoke_experiment_gives_the_same_rows_in_process_and_on_two_dask_workers(smoke_jobs, dask_engine):
    jobs, shared = smoke_jobs
    with engine.open_engine(SEQUENTIAL) as eng:
        sequential = run_jobs(jobs, shared, eng, log=lambda *_: None)
    on_dask = run_jobs(jobs, shared, dask_engine, log=lambda *_: None)
    assert len(sequential) == len(jobs) == 3 and all(r["steps"] == 8 for r in sequential)
    pd.testing.assert_frame_equal(_table(sequential), _table(on_dask), check_exact=True)
    assert {r["pid"] for r in sequential} == {os.getpid()}
    # each job ran in a fresh job process (recycled after every job), none in this one
    assert len({r["pid"] for r in on_dask}) == len(jobs) and os.getpid() not in {r["pid"] for r in on_dask}


def _flaky(shared, marker: str, value: int) -> dict:
    """Fails the first time (the marker file does not exist yet), succeeds the second."""
    if not Path(marker).exists():
        Path(marker).touch()
        raise RuntimeError("transient failure")
    return {"value": value}


def _killed_once(shared, marker: str) -> dict:
    """Its worker process dies (SIGKILL) the first time; the retry reports the thread setting."""
    if not Path(marker).exists():
        Path(marker).touch()
        os.kill(os.getpid(), signal.SIGKILL)
    return {"intra_op_threads": os.environ.get("TF_NUM_INTRAOP_THREADS"), "pid": os.getpid()}


def _broken(shared, user: str) -> dict:
    if user == "hamlet/Ophelia":
        raise ValueError(f"cannot personalise {user}")
    return {"user": user, "scale": shared}


def test_a_job_that_raises_once_is_retried_and_succeeds(tmp_path):
    log = []
    rows = run_jobs(
        [
            Job("user=a", _flaky, {"marker": str(tmp_path / "a"), "value": 1}),
            Job("user=b", _flaky, {"marker": str(tmp_path / "b"), "value": 2}),
        ],
        engine=engine.open_engine(SEQUENTIAL),
        log=log.append,
    )
    assert rows == [{"value": 1}, {"value": 2}]
    assert sum("user=a failed (RuntimeError: transient failure); retrying" in line for line in log) == 1


def test_a_killed_job_process_is_retried_on_dask(dask_engine, tmp_path):
    log = []
    [row] = run_jobs(
        [Job("seed=0/user=x", _killed_once, {"marker": str(tmp_path / "killed")})], engine=dask_engine, log=log.append
    )
    assert (tmp_path / "killed").exists() and any("seed=0/user=x failed" in line and "retrying" in line for line in log)
    assert any("the job's process was killed by SIGKILL" in line for line in log)
    assert row["intra_op_threads"] == "1"  # TensorFlow's threads sized to the job's one CPU


def test_a_job_that_raises_on_dask_is_reported_with_its_own_exception(dask_engine):
    """The job's process (started by a daemonic Dask worker) sends its traceback back: the report
    ends with the job's exception, not the worker's."""
    jobs = [Job(f"user={u}", _broken, {"user": u}) for u in ("hamlet/Hamlet", "hamlet/Ophelia")]
    with pytest.raises(JobsFailed, match="user=hamlet/Ophelia: ValueError: cannot personalise hamlet/Ophelia") as err:
        run_jobs(jobs, "smoke", dask_engine, log=lambda *_: None)
    assert list(err.value.failures) == ["user=hamlet/Ophelia"]


def test_a_cluster_worker_is_compared_with_the_client_by_python_suite_and_locked_packages():
    from ondevice.engine import cluster

    mine = cluster.environment(None, ["numpy", "tensorflow"])
    assert mine["ondevice"] == "0.1.0" and mine["packages"]["numpy"] and cluster.differences(mine, mine) == []
    assert "tensorflow" in cluster.locked_packages() and "dask" in cluster.locked_packages()
    other = {**mine, "python": "3.12", "packages": {"numpy": mine["packages"]["numpy"], "tensorflow": None}}
    assert cluster.differences(mine, other) == [
        f"Python 3.12, the client has {mine['python']} (its job process runs {mine['executable']})",
        f"packages of requirements.lock at other versions than the client's (its job process runs "
        f"{mine['executable']}): tensorflow missing (client {mine['packages']['tensorflow']})",
    ]
    assert cluster.differences(mine, {**mine, "ondevice": "0.0.9", "files": "x"}) == [
        "ondevice 0.0.9, the client has 0.1.0"
    ]
    assert "another commit, or edited" in cluster.differences(mine, {**mine, "files": "x"})[0]


def test_a_job_that_always_fails_is_reported_with_its_user_and_fails_the_run(tmp_path):
    users = ["hamlet/Hamlet", "hamlet/Ophelia", "lear/Lear"]
    jobs = [Job(f"user={u}", _broken, {"user": u}) for u in users]
    with pytest.raises(JobsFailed, match="user=hamlet/Ophelia: ValueError: cannot personalise hamlet/Ophelia") as err:
        run_jobs(jobs, "smoke", engine.open_engine(SEQUENTIAL), run_dir=tmp_path, log=lambda *_: None)
    assert list(err.value.failures) == ["user=hamlet/Ophelia"]
    # the other users finished and were kept: a re-run reuses them, only Ophelia runs (and fails) again
    log = []
    with pytest.raises(JobsFailed):
        run_jobs(jobs, "smoke", engine.open_engine(SEQUENTIAL), run_dir=tmp_path, log=log.append)
    assert "[engine] 2 of 3 jobs reused" in log[0]


def _counted(shared, calls: str, name: str, stop_at: str) -> dict:
    """Records each call; raises KeyboardInterrupt (Ctrl-C) at `stop_at` while the flag file exists."""
    Path(calls, f"{name}.{len(list(Path(calls).glob(name + '.*')))}").touch()
    if name == stop_at and Path(calls, "interrupt").exists():
        raise KeyboardInterrupt
    return {"job": name, "shared": shared}


def test_an_interrupted_run_resumes_without_recomputing_finished_jobs(tmp_path):
    calls, run_dir = tmp_path / "calls", tmp_path / "run"
    calls.mkdir()
    (calls / "interrupt").touch()
    jobs = [Job(f"job={n}", _counted, {"calls": str(calls), "name": n, "stop_at": "c"}) for n in "abcd"]
    with pytest.raises(KeyboardInterrupt):
        run_jobs(jobs, 1, engine.open_engine(SEQUENTIAL), run_dir=run_dir, log=lambda *_: None)
    (calls / "interrupt").unlink()
    rows = run_jobs(jobs, 1, engine.open_engine(SEQUENTIAL), run_dir=run_dir, log=lambda *_: None)
    assert rows == [{"job": n, "shared": 1} for n in "abcd"]
    ran = sorted(p.name for p in calls.iterdir())
    assert ran == ["a.0", "b.0", "c.0", "c.1", "d.0"]  # a and b ran once; c again after the interrupt
    # different arguments or a different shared object are a different job: computed again
    run_jobs(jobs, 2, engine.open_engine(SEQUENTIAL), run_dir=run_dir, log=lambda *_: None)
    assert len(list(calls.glob("a.*"))) == 2


def test_the_engine_and_the_jobs_directory_are_chosen_by_the_environment(monkeypatch, tmp_path):
    assert EngineSpec.from_env({}) == EngineSpec("sequential")
    assert EngineSpec.from_env({"ONDEVICE_ENGINE": "dask", "ONDEVICE_WORKERS": "3"}) == EngineSpec("dask", workers=3)
    assert EngineSpec.from_env({"ONDEVICE_CLUSTER": "tcp://head:8786"}).name == "dask"
    with pytest.raises(ValueError, match="ONDEVICE_ENGINE"):
        EngineSpec.from_env({"ONDEVICE_ENGINE": "spark"})
    with pytest.raises(ValueError, match="ONDEVICE_WORKERS"):
        EngineSpec.from_env({"ONDEVICE_ENGINE": "dask", "ONDEVICE_WORKERS": "two"})
    monkeypatch.delenv("ONDEVICE_JOBS_DIR", raising=False)
    assert engine.jobs_dir("personalize") is None
    monkeypatch.setenv("ONDEVICE_JOBS_DIR", str(tmp_path))
    assert engine.jobs_dir("personalize") == tmp_path / "personalize"
    with pytest.raises(ValueError, match="job keys must be unique"):
        run_jobs([Job("user=a", _broken, {"user": "a"})] * 2, engine=engine.open_engine(SEQUENTIAL))
