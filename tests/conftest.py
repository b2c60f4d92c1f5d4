import atexit
import os
import shutil
import signal
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
# Tests train their own global models (and notebooks' kernels inherit this): a user's model cache
# is neither used nor filled by them.
_models = tempfile.mkdtemp(prefix="ondevice-test-models-")
os.environ["ONDEVICE_MODEL_CACHE"] = _models
atexit.register(shutil.rmtree, _models, True)
# A suite started in the background (`make test &`, nohup) inherits SIGINT/SIGHUP ignored; the
# interrupt tests need the defaults (Ctrl-C -> KeyboardInterrupt), as in a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
# Under xdist, each worker's share of the CPUs as TensorFlow's and OpenMP's thread pools (its
# notebooks' kernels inherit them): two workers of two threads each on two cores fight over them,
# where two one-thread processes did 1.59x the work of one with two threads (report/at_once.py).
if os.environ.get("PYTEST_XDIST_WORKER"):
    from ondevice.threads import limit_threads

    limit_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)))
mirror = Path(__file__).resolve().parents[2] / "shared" / "data"
if mirror.is_dir():
    os.environ.setdefault("ONDEVICE_DATA_MIRROR", str(mirror))


@pytest.fixture(scope="session")
def speeches():
    """The real Shakespeare speeches, fetched and verified through the manifest."""
    from ondevice.data.shakespeare import load_speeches

    return load_speeches()


@pytest.fixture(scope="session")
def smoke_data():
    """Every smoke-scale data set in the cache before notebooks run, so no run prints a download
    that its re-run would not (the determinism test diffs the outputs)."""
    from ondevice.data import manifests

    for m in manifests.all_manifests():
        if "smoke" in m.scales:
            manifests.fetch(m)


@pytest.fixture(scope="session")
def smoke_runs(tmp_path_factory, smoke_data):
    """Each notebook's smoke run, run the first time a test asks for it (`smoke_runs(name)`) and
    shared by every test after it in this process (tests/smoke_runs.py)."""
    from smoke_runs import SmokeRuns

    return SmokeRuns(tmp_path_factory)


def pytest_xdist_make_scheduler(config, log):
    """Under `pytest -n N --dist loadscope`, a notebook's tests share a worker and so one smoke run
    (the `smoke_runs` registry is per worker): every test whose node id ends in `[<notebook>]`, in
    test_notebooks.py or a paper's own file. Other tests are grouped by module, as loadscope does.
    (xdist's own loadgroup marks do not reach pytest 9's node ids.)"""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    from smoke_runs import notebook_of

    class NotebookScope(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            if notebook := notebook_of(nodeid):
                return f"notebook:{notebook}"
            return nodeid.split("::", 1)[0]

    return NotebookScope(config, log)


SLOW_SECONDS = 30.0


def pytest_terminal_summary(terminalreporter):
    """Name every test that took more than 30 s without a `slow` or `notebook` mark saying why."""
    unmarked = []
    for report in terminalreporter.stats.get("passed", []) + terminalreporter.stats.get("failed", []):
        marked = {"slow", "notebook"} & set(report.keywords)
        if report.when == "call" and report.duration > SLOW_SECONDS and not marked:
            unmarked.append(f"{report.nodeid} ({report.duration:.0f} s)")
    if unmarked:
        terminalreporter.write_line(f"tests over {SLOW_SECONDS:.0f} s without a slow(reason=...) mark:", yellow=True)
        for line in unmarked:
            terminalreporter.write_line(f"  {line}")
