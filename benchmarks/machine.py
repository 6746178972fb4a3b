"""How fast this machine is at the moment, beside a benchmark's figures.

The load average counts this VM's own runnable threads only, and the same work can take much
longer at the same load (the same demo took 155.3 s and 108.0 s here within fifteen minutes,
both started at a 1-minute load below 2). `cpu_probe_seconds` times a fixed piece of
single-threaded work (pure Python and hashing) at a run's start and end: how fast one core
was then. It does not see what slows a run between those moments (the same demo took 110.3 s
and 121.1 s in two runs one after the other, with probes of 0.113-0.122 s).
"""

from __future__ import annotations

import hashlib
import statistics
import time

_BLOCK = bytes(range(256)) * 4096  # 1 MiB


def _work() -> int:
    total = 0
    for i in range(1_500_000):
        total += i * i % 7
    digest = hashlib.sha256()
    for _ in range(64):
        digest.update(_BLOCK)
    return total + digest.digest()[0]


def cpu_probe_seconds(rounds: int = 3) -> float:
    """The median seconds of the fixed work over `rounds` runs (lower: a faster machine)."""
    took = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        _work()
        took.append(time.perf_counter() - t0)
    return round(statistics.median(took), 3)


if __name__ == "__main__":
    print(cpu_probe_seconds())
