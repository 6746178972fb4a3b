"""Progress lines on stderr for long ingests (files, bytes, messages)."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable


def say(message: str, enabled: bool = True) -> None:
    if enabled:
        print(f"ingest: {message}", file=sys.stderr, flush=True)


class Ticker:
    """Calls `line()` every `interval` seconds on a thread and prints it, until stopped."""

    def __init__(self, line: Callable[[], str], interval: float = 2.0, enabled: bool = True):
        self.line = line
        self.interval = interval
        self.enabled = enabled
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ingest-progress", daemon=True)
        self.started = time.monotonic()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            say(f"{self.line()} ({time.monotonic() - self.started:.0f} s)", self.enabled)

    def __enter__(self) -> Ticker:
        if self.enabled:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
