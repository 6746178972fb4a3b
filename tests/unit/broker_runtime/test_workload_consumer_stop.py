"""A workload's consumer processes end with the workload, even when it is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from broker_runtime.workload.journal import JournalReader

# A workload of one consumer (forked as the harness forks them, waiting for its start
# signal): it prints the consumer's pid once the consumer has loaded, then waits.
WORKLOAD = """
import sys, time
from pathlib import Path
from broker_runtime.workload.consumer_proc import ConsumerSpec
from broker_runtime.workload.harness import ConsumerProc

base = Path(sys.argv[1])
spec = ConsumerSpec(
    namesrv="127.0.0.1:9", group="g", topic="t", journal=str(base / "c.jsonl"),
    instance="c", ledger_dir=str(base), wait_signal=True,
)
proc = ConsumerProc("s", "c", spec, base / "c.spec.json", base / "c.log")
while not proc.state.ready:
    if not proc.alive():
        sys.exit(f"the consumer exited {proc.exitcode}")
    time.sleep(0.05)
print(proc.proc.pid, flush=True)
time.sleep(600)
"""


def _running(pid: int) -> bool:
    """Whether `pid` runs (a zombie, ended but not yet reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_a_killed_workloads_consumer_stops_cleanly(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", WORKLOAD, str(tmp_path)]
    consumer = 0
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as workload:
        try:
            assert workload.stdout is not None
            line = workload.stdout.readline()  # EOF: the workload exited, the consumer failed
            assert line.strip().isdigit(), f"no consumer pid: {line!r}, exit {workload.wait()}"
            consumer = int(line)
            assert _running(consumer)
            workload.kill()  # SIGKILL: no chance to stop its children
            workload.wait()
            deadline = time.monotonic() + 30
            while _running(consumer) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not _running(consumer), "the consumer outlived the killed workload"
            journal = JournalReader(tmp_path / "c.jsonl").poll()
            assert journal.ready and journal.stopped  # a clean stop, not a crash
            assert "has ended: stopping" in (tmp_path / "c.log").read_text()
        finally:
            workload.kill()
            if consumer and _running(consumer):
                os.kill(consumer, signal.SIGKILL)
