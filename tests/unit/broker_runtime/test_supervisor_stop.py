"""How the supervisor waits for stopped nodes: a process that has exited counts as stopped
even while it is a zombie nobody has reaped yet (a detached cluster's nodes are init's
children, and init reaps when it gets to it); one still running is left for SIGKILL."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from broker_runtime.cluster import supervisor


def _until(condition: object, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_a_zombie_counts_as_exited_without_being_reaped() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])  # not the supervisor's to reap
    try:
        proc = psutil.Process(child.pid)
        _until(lambda: proc.status() == psutil.STATUS_ZOMBIE, "the child to exit")
        assert supervisor._wait_exited([proc], 30.0) == []
        # Nobody reaped it while waiting: the wait did not depend on its reaping.
        assert proc.status() == psutil.STATUS_ZOMBIE
    finally:
        child.wait(10)


def test_a_process_still_running_is_returned_after_the_timeout() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        proc = psutil.Process(child.pid)
        assert supervisor._wait_exited([proc], 0.2) == [proc]
        assert child.poll() is None
    finally:
        child.kill()
        child.wait(10)
