"""One helper thread per process that runs one job at a time beside its caller.

The client uses two: one copies and hashes the back half of a big same-host put
(client/steps.py), one hashes a TCP payload while the caller's thread sends it
(client/tcp_wire.py).  Both jobs spend their time in C code that releases the GIL (the copy
kernel, xxhash), so the job and the caller's own work run on two cores.

The rules that make it safe to use from any thread:

- `start` never queues: when another caller holds the helper it returns False at once, and
  that caller does the work itself.  So no caller ever waits behind another's job.
- Every successful `start` is followed by exactly one `wait`, which returns the job's result
  or raises its exception (never a silent half-done job), and frees the helper.
- The thread does not survive a fork: the first `start` in a new process starts a new one.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any


class HelperThread:
    """A daemon thread that runs the job handed to `start`; `wait` collects it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._busy = threading.Lock()  # held from a successful start until its wait
        self._start = threading.Semaphore(0)
        self._done = threading.Semaphore(0)
        self._job: Callable[[], Any] | None = None
        self._result: Any = None
        self._error: BaseException | None = None
        self._pid = 0
        self.jobs = 0  # jobs started (tests and benchmarks read it)

    @property
    def busy(self) -> bool:
        return self._busy.locked()

    def start(self, job: Callable[[], Any]) -> bool:
        """Run `job` on the helper; False (and nothing run) when another caller holds it."""
        if not self._busy.acquire(blocking=False):
            return False
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._start, self._done = threading.Semaphore(0), threading.Semaphore(0)
            threading.Thread(target=self._run, name=self.name, daemon=True).start()
        self._job = job
        self.jobs += 1
        self._start.release()
        return True

    def wait(self) -> Any:
        """The job's result, once it has ended; raises what the job raised."""
        self._done.acquire()
        result, error = self._result, self._error
        self._result = self._error = self._job = None
        self._busy.release()
        if error is not None:
            raise error
        return result

    def _run(self) -> None:
        start, done = self._start, self._done
        while True:
            start.acquire()
            try:
                job = self._job
                if job is not None:
                    self._result = job()
            except BaseException as exc:  # the caller raises it
                self._error = exc
            finally:
                done.release()
