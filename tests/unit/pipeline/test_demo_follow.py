"""How the demo follows a DAG run's log: the tasks' starts and ends shown as they come, and
what it waits on a task for (the cluster's stop after the last mq_audit's ingest) called
once that task has ended, not when it starts, and only once."""

from __future__ import annotations

import io
from pathlib import Path

from pipeline.demo import Demo

_START = "2026-11-28T21:09:16Z [info] [DAG TEST] starting task_id={} map_index=-1\n"
_END = "2026-11-28T21:09:23Z [info] [DAG TEST] end task task_id={} map_index=-1\n"


def test_the_call_after_a_task_comes_once_the_log_shows_its_end(tmp_path: Path) -> None:
    console = io.StringIO()
    demo = Demo(tmp_path / "out", console=console)
    calls: list[str] = []
    demo.after_task["ingest"] = lambda: calls.append("stopped")
    log = tmp_path / "mq_audit.log"
    log.write_text(_START.format("ingest") + "2026-11-28 some line of the task\n")
    seen = demo._show(log, 0, False)
    assert calls == [] and "task ingest started" in console.getvalue()
    with open(log, "a") as f:  # the end, then another task's, and a half-written line
        f.write(_END.format("ingest") + _START.format("validate") + _END.format("validate"))
        f.write(_END.format("ingest")[:20])
    seen = demo._show(log, seen, False)
    assert calls == ["stopped"] and "ingest" not in demo.after_task
    assert "task validate done" in console.getvalue()
    with open(log, "a") as f:  # the rest of that line: an ingest's end again calls nothing
        f.write(_END.format("ingest")[20:])
    demo._show(log, seen, False)
    assert calls == ["stopped"]
