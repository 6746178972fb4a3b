"""What the benchmarks measure of a Spark driver's JVM: the CPU time of it and the processes
it started (the Python workers), and the peak RSS of it and of this process."""

from __future__ import annotations

import threading


def cpu_seconds(pid: int) -> float:
    """CPU time of the JVM and every process it started (the Python workers)."""
    import psutil

    total = 0.0
    jvm = psutil.Process(pid)
    for proc in [jvm, *jvm.children(recursive=True)]:
        try:
            t = proc.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            pass
    return total


class PeakRss:
    """Samples the RSS of the JVM and of this (driver) process every 0.2 s while running."""

    def __init__(self, pid: int) -> None:
        import psutil

        self.proc = psutil.Process(pid)
        self.me = psutil.Process()
        self.peak = 0
        self.peak_me = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.peak = max(self.peak, self.proc.memory_info().rss)
            self.peak_me = max(self.peak_me, self.me.memory_info().rss)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
