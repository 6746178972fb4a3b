"""Flushing the CommitLog: group commit for SYNC_FLUSH, a periodic loop for the rest.

Group commit: each put waits until the log is flushed past its end; one flusher thread
fdatasyncs on behalf of every put that arrived meanwhile, so concurrent puts share fsyncs.
Like PostgreSQL's commit_delay, the flusher holds an fsync back (up to `delay_s`) while
other puts are still being written, or while fewer puts wait than the last fsync released
(those producers are about to put again), so that one fsync covers them too.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class GroupCommitService:
    def __init__(
        self, flush: Callable[[], int], timeout_s: float = 5.0, delay_s: float = 0.002
    ) -> None:
        self._flush = flush  # flushes the log, returns the flushed offset
        self._timeout_s = timeout_s  # syncFlushTimeout
        self._delay_s = delay_s
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)  # puts wait here for a flush
        self._work = threading.Condition(self._lock)  # the flusher waits here for puts
        self._writing = 0  # puts between begin() and wait_flushed()
        self._waiting = 0
        self._expect = 1  # puts the last fsync released: as many are likely to come back
        self._flushed = 0
        self._running = True
        self.fsyncs = 0
        self.puts = 0
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="group-commit", daemon=True)
        self._thread.start()

    def begin(self) -> None:
        """A put is about to write: the next fsync may wait for it (see `delay_s`)."""
        with self._cond:
            self._writing += 1

    def abandon(self) -> None:
        """The put that called `begin` wrote nothing (it was refused)."""
        with self._cond:
            self._writing -= 1
            self._work.notify()

    def wait_flushed(self, offset: int) -> bool:
        """Block until the log is on disk up to `offset`; False on timeout or flush failure."""
        with self._cond:
            self._writing -= 1
            self.puts += 1
            done = self._flushed >= offset
            if not done:
                self._waiting += 1
            if (self._waiting == 1 and not done) or self._ready():
                self._work.notify()  # the flusher only, and only when it has cause to look
            if done:
                return True
            ok = self._cond.wait_for(
                lambda: self._flushed >= offset or self.error is not None, self._timeout_s
            )
            return ok and self.error is None

    def _ready(self) -> bool:
        """No put is mid-write and as many wait as the last fsync released: flush now."""
        return self._waiting > 0 and self._writing <= 0 and self._waiting >= self._expect

    def _run(self) -> None:
        while True:
            with self._cond:
                self._work.wait_for(lambda: self._waiting > 0 or not self._running)
                if not self._running:
                    return
                self._work.wait_for(self._ready, self._delay_s)
                self._expect = max(1, self._waiting)
                self._waiting = 0
            try:
                flushed = self._flush()  # outside the lock: puts keep arriving meanwhile
            except OSError as e:
                with self._cond:
                    self.error = e
                    self._cond.notify_all()
                return
            with self._cond:
                self.fsyncs += 1
                self._flushed = flushed
                self._cond.notify_all()

    def stop(self) -> None:
        with self._cond:
            self._running = False
            self._work.notify()
        self._thread.join()


class PeriodicService:
    """One background thread running tasks at their own intervals (flush, checkpoint, clean)."""

    def __init__(self, tasks: list[tuple[float, Callable[[], object]]], name: str) -> None:
        self._tasks = tasks
        self._stop = threading.Event()
        self.errors: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        due = [time.monotonic() + interval for interval, _ in self._tasks]
        while not self._stop.is_set():
            now = time.monotonic()
            for i, (interval, task) in enumerate(self._tasks):
                if now >= due[i]:
                    try:
                        task()
                    except Exception as e:  # keep the other tasks running, and say so
                        log.exception("background task %s failed", getattr(task, "__name__", task))
                        self.errors.append(e)
                    due[i] = now + interval
            self._stop.wait(max(0.0, min(due) - time.monotonic()))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
