"""`make bench` (demo part): `mqaudit demo` end to end and its mq_audit run, step by step.

Runs the demo as a person does (`mqaudit demo --out WORK`, the default 2,000 messages) after
set-up, then reads what it wrote: the seconds of each demo step (OUT/summary.json) and of
each mq_audit task (the `[DAG TEST] starting` / `end task` lines of OUT/logs/mq_audit.log).
Prints one JSON line per run, then a table of the figures against the goals of issue 21
(mq_audit on the demo's data at most 30 s, the demo at most 120 s), reported, never asserted.
The load average and a CPU probe (benchmarks/machine.py) at the start and end of each run
stand beside it: the machine is shared.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from machine import cpu_probe_seconds

from pipeline.demo import DEFAULT_MESSAGES

ROOT = Path(__file__).resolve().parent.parent
GOALS = {"mq_audit": 30.0, "total": 120.0}
_TASK = re.compile(r"^(\S+) .*\[DAG TEST\] (starting|end) task(?:_id=| task_id=)(\w+)")


def task_seconds(log: Path) -> dict[str, float]:
    """Task id -> seconds from its `starting` line to its `end task` line in a DAG test log."""
    began: dict[str, dt.datetime] = {}
    took: dict[str, float] = {}
    for line in log.read_text(errors="replace").splitlines():
        m = _TASK.match(line)
        if m is None:
            continue
        try:
            when = dt.datetime.fromisoformat(m.group(1).replace("Z", "+00:00"))
        except ValueError:
            continue
        if m.group(2) == "starting":
            began[m.group(3)] = when
        elif m.group(3) in began:
            took[m.group(3)] = round((when - began.pop(m.group(3))).total_seconds(), 1)
    return took


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def one_run(out: Path, messages: int | None, seed: int) -> dict[str, Any]:
    argv = [sys.executable, "-m", "broker_runtime.cli.main", "demo", "--out", str(out)]
    argv += ["--seed", str(seed)] + (["--messages", str(messages)] if messages else [])
    probe_before, load_before, t0 = cpu_probe_seconds(), load(), time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
    wall = time.monotonic() - t0
    probe_after = cpu_probe_seconds()
    if done.returncode != 0:
        print(done.stderr[-3000:], file=sys.stderr)
        return {"exit_code": done.returncode, "seconds": round(wall, 1)}
    summary = json.loads((out / "summary.json").read_text())
    steps = summary.get("seconds", {})
    return {
        "exit_code": 0,
        "messages": messages or DEFAULT_MESSAGES,
        "stored_rows_ingested": summary["messages"]["stored_rows_ingested"],
        "seed": seed,
        "wall_seconds": round(wall, 1),
        "steps": steps,
        "mq_audit_tasks": task_seconds(out / "logs" / "mq_audit.log"),
        "load_before": load_before,
        "load_after": load(),
        "cpu_probe_seconds": [probe_before, probe_after],
    }


def table(run: dict[str, Any]) -> list[tuple[str, Any, str]]:
    rows: list[tuple[str, Any, str]] = []
    for step, seconds in run["steps"].items():
        goal = GOALS.get(step)
        verdict = (
            "" if goal is None else f"<= {goal:.0f}: " + ("met" if seconds <= goal else "not met")
        )
        rows.append((f"demo step: {step}", seconds, verdict))
    for task, seconds in run["mq_audit_tasks"].items():
        rows.append((f"  mq_audit task: {task}", seconds, ""))
    rows.append(
        (
            "load average before / after",
            f"{run['load_before'][0]} / {run['load_after'][0]}",
            "(2 cores)",
        )
    )
    probe = run["cpu_probe_seconds"]
    rows.append(
        ("cpu probe before / after, s", f"{probe[0]} / {probe[1]}", "(benchmarks/machine.py)")
    )
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "bench-out" / "demo")
    ap.add_argument("--messages", type=int, default=None, help="default: the demo's own")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--runs", type=int, default=1)
    args = ap.parse_args()
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    runs = []
    for i in range(args.runs):
        print(f"[bench] demo run {i + 1}/{args.runs}, load {load()}", file=sys.stderr, flush=True)
        run = one_run(args.out, args.messages, args.seed)
        print(json.dumps(run), flush=True)
        if run["exit_code"] != 0:
            return 1
        runs.append(run)
    print()
    for i, run in enumerate(runs):
        print(f"run {i + 1}: {run['messages']} messages, seed {run['seed']}")
        for name, value, goal in table(run):
            print(f"{name:40} {value!s:>14}  {goal}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
