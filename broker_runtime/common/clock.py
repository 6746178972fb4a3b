"""Injectable time: a `Clock` protocol, the system clock and a fake clock for tests."""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int:
        """Wall-clock milliseconds since the epoch (store timestamps, file ages)."""
        ...

    def local_hour(self) -> int:
        """Hour of day, local time, for schedules such as `deleteWhen`."""
        ...


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def local_hour(self) -> int:
        return time.localtime().tm_hour


class FakeClock:
    """A clock that only moves when told to; thread safe."""

    def __init__(self, start_ms: int = 1_700_000_000_000, hour: int = 12) -> None:
        self._ms = start_ms
        self._hour = hour
        self._lock = threading.Lock()

    def now_ms(self) -> int:
        with self._lock:
            return self._ms

    def local_hour(self) -> int:
        with self._lock:
            return self._hour

    def advance(self, ms: int) -> None:
        with self._lock:
            self._ms += ms

    def set_hour(self, hour: int) -> None:
        with self._lock:
            self._hour = hour
