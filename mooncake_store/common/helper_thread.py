"""One helper thread per process that runs one job at a time beside its caller.

The client uses two: one copies and hashes the back half of a big same-host put
(client/steps.py), one hashes a TCP payload while the caller's thread sends it
(client/tcp_wire.py).  Both jobs spend their time in C code that releases the GIL (the copy
kernel, xxhash), so the job and the caller's own work run on two cores.

The rules that make it safe to use from any thread:

- `start` never queues: when another caller holds the helper it returns False at once, and
  that caller does the work itself.  So no caller ever waits behind another's job.  A thread
  that cannot be started is a False too.
- Every successful `start` is followed by exactly one `wait`, which returns once the job has
  ended (an interrupt meanwhile, a KeyboardInterrupt, is raised after that, never while the
  job still reads the caller's buffers) with the job's result or exception, and frees the
  helper.  Nothing of the job (its buffers) is kept after that.
- A forked child gets a fresh helper (the parent's thread, and its lock if held, do not come
  along).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import Any


class HelperThread:
    """A daemon thread that runs the job handed to `start`; `wait` collects it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.jobs = 0  # jobs started (tests and benchmarks read it)
        self._reset()
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _reset_if_alive(ref))

    def _reset(self) -> None:
        self._busy = threading.Lock()  # held from a successful start until its wait
        self._start = threading.Semaphore(0)
        self._done = threading.Semaphore(0)
        self._job: Callable[[], Any] | None = None
        self._result: Any = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    @property
    def busy(self) -> bool:
        return self._busy.locked()

    def start(self, job: Callable[[], Any]) -> bool:
        """Run `job` on the helper; False (and nothing run) when another caller holds it."""
        if not self._busy.acquire(blocking=False):
            return False
        if self._thread is None:
            thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            try:
                thread.start()
            except RuntimeError:  # no thread to be had (a process at its limit): work alone
                self._busy.release()
                return False
            self._thread = thread
        self._job = job
        self.jobs += 1
        self._start.release()
        return True

    def wait(self) -> Any:
        """The job's result, once it has ended; raises what the job raised (or, after the job
        ended, an interrupt that came while waiting)."""
        interrupted: BaseException | None = None
        while True:
            try:
                self._done.acquire()
                break
            except BaseException as exc:  # the job still reads the caller's buffers: wait on
                interrupted = exc
        result, error = self._result, self._error
        self._result = self._error = self._job = None
        self._busy.release()
        if interrupted is not None:
            raise interrupted
        if error is not None:
            raise error
        return result

    def _run(self) -> None:
        start, done = self._start, self._done
        while True:
            start.acquire()
            job = self._job
            try:
                if job is not None:
                    self._result = job()
            except BaseException as exc:  # the caller raises it
                self._error = exc
            finally:
                job = None  # keep no reference to the caller's buffers while idle
                done.release()


def _reset_if_alive(ref: weakref.ref[HelperThread]) -> None:
    helper = ref()
    if helper is not None:
        helper._reset()
