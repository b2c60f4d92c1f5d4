"""The in-process engine: jobs run one after another in this process (the default; tests)."""

from __future__ import annotations

from . import worker


class SequentialBackend:
    def __init__(self, spec):
        self.spec = spec
        self._calls: dict[int, tuple] = {}
        self._count = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        self._calls.clear()

    def share(self, obj):
        return obj

    def submit(self, fn, shared, kwargs) -> int:
        """Queues the job; `wait` runs it, so each result is stored before the next job starts."""
        self._count += 1
        self._calls[self._count] = (fn, shared, kwargs)
        return self._count

    def wait(self, futures: list[int]) -> list[tuple[int, bool, object]]:
        """Runs the first queued job: an Exception is its failure, KeyboardInterrupt stops the run."""
        future = futures[0]
        fn, shared, kwargs = self._calls.pop(future)
        try:
            return [(future, True, worker.call(fn, shared, kwargs, None))]
        except Exception as exc:  # noqa: BLE001  (reported with the job's key, then retried)
            return [(future, False, worker.error_text(exc))]
