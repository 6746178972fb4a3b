"""Injectable time: a `Clock` protocol, the system clock and a fake clock for tests; epoch
milliseconds to and from text."""

from __future__ import annotations

import datetime as dt
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


def format_ms(ms: int | None) -> str:
    """Epoch ms as `YYYY-MM-DD HH:MM:SS,mmm` UTC (mqadmin's style); `-` for none."""
    if ms is None or ms <= 0:
        return "-"
    t = dt.datetime.fromtimestamp(ms / 1000, dt.UTC)
    return t.strftime("%Y-%m-%d %H:%M:%S,") + f"{ms % 1000:03d}"


def parse_time_ms(text: str) -> int:
    """Epoch ms, `now`, or an ISO 8601 time (UTC unless it says otherwise)."""
    if text == "now":
        return time.time_ns() // 1_000_000
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        t = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"time {text!r} is not epoch ms, 'now' or ISO 8601") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    return int(t.timestamp() * 1000)
