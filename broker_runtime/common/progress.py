"""Progress of long steps, one mechanism for every command: the standard `logging` module.

A step reports on the logger `mqaudit.<step>` (`reporter("ingest")`), at INFO. A command shows
those records on stderr as `<step>: <message>` (`show_progress`, called by the entry points);
under Airflow they go to the task log with every other record (`log_progress`, called by the
tasks). `Ticker` repeats a line while a long step runs, for logs; where a person watches a
count grow in a terminal, `counter()` draws a rich progress display instead.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

ROOT = "mqaudit"

Say = Callable[[str], None]


def reporter(step: str, enabled: bool = True) -> Say:
    """The step's `say(line)`: an INFO record on `mqaudit.<step>`, or nothing if not enabled."""
    logger = logging.getLogger(f"{ROOT}.{step}")

    def say(line: str) -> None:
        if enabled:
            logger.info(line)

    return say


class _StepFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        step = record.name.removeprefix(ROOT + ".")
        text = record.getMessage()
        return text if step == ROOT else f"{step}: {text}"


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever sys.stderr is when a record comes (tests redirect it)."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(_StepFormatter())

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: TextIO) -> None:
        pass


def show_progress(quiet: bool = False) -> None:
    """Show the `mqaudit.*` records of this process on stderr (INFO and up; WARNING and up
    when quiet). Idempotent: the entry points call it first thing."""
    logger = logging.getLogger(ROOT)
    if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
        logger.addHandler(_StderrHandler())
        logger.propagate = False  # a host's root handlers would print each line again
    logger.setLevel(logging.WARNING if quiet else logging.INFO)


def log_progress() -> None:
    """Inside a host that logs (an Airflow task): the `mqaudit.*` records, INFO and up, go to
    its handlers as its own records do, at their level. (Airflow logs a task's stderr as
    errors, so `show_progress`'s lines would read as failures there.)"""
    logger = logging.getLogger(ROOT)
    for handler in [h for h in logger.handlers if isinstance(h, _StderrHandler)]:
        logger.removeHandler(handler)
    logger.propagate = True
    logger.setLevel(logging.INFO)


class Ticker:
    """Calls `line()` every `interval` seconds on a thread and reports it, until stopped."""

    def __init__(self, say: Say, line: Callable[[], str], interval: float = 2.0) -> None:
        self.say = say
        self.line = line
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="progress-ticker", daemon=True)
        self.started = time.monotonic()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.say(f"{self.line()} ({time.monotonic() - self.started:.0f} s)")

    def __enter__(self) -> Ticker:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@contextmanager
def counter(label: str, total: int | None, out: TextIO | None = None) -> Iterator[Count]:
    """A count a person watches grow: a rich progress display on a terminal (`out`, default
    stderr); elsewhere (a log, a pipe) a line every few seconds and one at the end."""
    stream = out or sys.stderr
    if not stream.isatty():
        count = Count(label, total, stream=stream)
        yield count
        count.line(force=True)
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
    from rich.progress import TimeElapsedColumn as Elapsed

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), Elapsed())
    with Progress(*columns, TextColumn("{task.fields[text]}"), console=Console(file=stream)) as p:
        yield Count(label, total, bar=(p, p.add_task(label, total=total, text="")))


class Count:
    """What a `counter()` shows: `update(done, text)` as the work goes on."""

    def __init__(
        self,
        label: str,
        total: int | None,
        *,
        bar: tuple[Progress, TaskID] | None = None,
        stream: TextIO | None = None,
        every_s: float = 5.0,
    ) -> None:
        self.label, self.total, self.done, self.text = label, total, 0, ""
        self._bar, self._stream, self._every_s = bar, stream, every_s
        self._start = time.monotonic()
        self._last = -every_s

    def elapsed(self) -> float:
        return time.monotonic() - self._start

    def update(self, done: int, text: str = "") -> None:
        self.done, self.text = done, text
        if self._bar is not None:
            progress, task = self._bar
            progress.update(task, completed=done, text=text)
        else:
            self.line()

    def line(self, force: bool = False) -> None:
        """The count as one line of text (at most every `every_s` unless forced)."""
        elapsed = self.elapsed()
        if self._stream is None or (not force and elapsed - self._last < self._every_s):
            return
        self._last = elapsed
        of = f"/{self.total:,}" if self.total is not None else ""
        extra = f" {self.text}" if self.text else ""
        self._stream.write(f"[{elapsed:6.1f}s] {self.label} {self.done:,}{of}{extra}\n")
        self._stream.flush()
