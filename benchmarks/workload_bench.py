"""`make bench` (workload part): `mqaudit workload --scenario all` against a fresh cluster.

The cluster is the demo's (`mqaudit cluster up --detach`: 2 name servers, broker-a and
broker-b with slaves), in a temporary directory, taken down at the end. Each run prints its
wall time next to the load average when it started and ended (the machine is shared), its
seconds per scenario, and the rebalance's duplicate deliveries with the queue lock off and
on. The goal (20,000 messages in under 3 minutes) is reported, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
GOAL_S = 180.0


def log(text: str) -> None:
    print(f"[bench] {text}", file=sys.stderr, flush=True)


def mqaudit(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "broker_runtime.cli.main", *args]
    return subprocess.run(cmd, check=check, capture_output=True, text=True, cwd=ROOT)


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def one_run(data: Path, messages: int, seed: int) -> dict[str, Any]:
    truth = data.parent / f"truth-{seed}.json"
    argv = ["workload", "--data-dir", str(data), "--messages", str(messages)]
    argv += ["--scenario", "all", "--truth", str(truth), "--seed", str(seed)]
    load_before, t0 = load(), time.monotonic()
    out = mqaudit(*argv, check=False)
    seconds = time.monotonic() - t0
    lines = out.stdout.strip().splitlines()
    summary = json.loads(lines[-1]) if lines else {}
    return {
        "messages": messages,
        "seed": seed,
        "exit_code": out.returncode,
        "seconds": round(seconds, 1),
        "goal_seconds": GOAL_S,
        "ratio_to_goal": round(seconds / GOAL_S, 2),
        "load_before": load_before,
        "load_after": load(),
        "scenario_seconds": summary.get("scenario_seconds"),
        "rebalance_duplicate_deliveries": summary.get("rebalance_duplicate_deliveries"),
        "failed": summary.get("failed", []),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="workload-bench-") as tmp:
        data = Path(tmp) / "cluster"
        log(f"cluster up in {data}")
        mqaudit("cluster", "up", "--data-dir", str(data), "--detach")
        try:
            for i in range(args.runs):
                log(f"run {i + 1}/{args.runs}: {args.messages} messages, load {load()}")
                print(json.dumps(one_run(data, args.messages, args.seed + i)), flush=True)
        finally:
            mqaudit("cluster", "down", "--data-dir", str(data), check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
