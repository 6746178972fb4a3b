"""`make bench` (store part): the store's figures, with their targets.

Each case runs `mqaudit store bench` in a fresh directory and prints its JSON line; a table
at the end sets each figure against its target. Targets are reported, never asserted. The
batch cases call `MessageStore.put_messages` with 64 messages per call (a batch send); every
case waits for ConsumeQueue and index dispatch and the flushes before its clock stops. The
machine's 1-minute load average (at the start and end of each timed run) is printed next to
each figure: on a shared machine the figures move with it.

Usage: store_bench.py [--repeat N] [--case SUBSTRING]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CASES = [
    # name, args, (figure, target)
    ("1KiB async, single puts", ["--size", "1024", "--messages", "300000"], None),
    (
        "1KiB async, batch 64",
        ["--size", "1024", "--messages", "1000000", "--batch", "64"],
        ("messages_per_s", 250_000),
    ),
    (
        "4KiB async, batch 64",
        ["--size", "4096", "--messages", "250000", "--batch", "64"],
        ("ratio_to_disk", 0.4),
    ),
    (
        "1KiB sync, 16 producers",
        ["--size", "1024", "--messages", "64000", "--flush", "sync", "--producers", "16"],
        None,
    ),
]


def run_case(out_root: Path, args: list[str]) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(dir=out_root))
    cmd = [sys.executable, "-m", "broker_runtime.cli.main", "store", "bench"]
    cmd += ["--store", str(work / "store"), "--topics", "4", "--queues", "4", *args]
    try:
        line = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result: dict[str, Any] = json.loads(line)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=1, help="runs of each case")
    parser.add_argument("--case", default="", help="only the cases whose name contains this")
    opts = parser.parse_args()
    out_root = ROOT / "bench-out"
    out_root.mkdir(exist_ok=True)
    rows = []
    for run in range(opts.repeat):
        for name, args, target in CASES:
            if opts.case not in name:
                continue
            result = run_case(out_root, args)
            print(json.dumps({"case": name, "run": run + 1, **result}), flush=True)
            rows.append((name, result, target))
    print()
    if rows:
        print(f"store kernels: {rows[0][1]['kernels']}, CRC-32: {rows[0][1]['crc']}")
    print(
        f"{'case':26} {'msg/s':>9} {'MB/s':>7} {'ratio_to_disk':>13} {'puts/fsync':>10} "
        f"{'CPU us/msg':>10} {'load 1m':>11}  target"
    )
    for name, r, target in rows:
        verdict = ""
        if target is not None:
            figure, goal = target
            verdict = f"{figure} >= {goal}: {'met' if r[figure] >= goal else 'NOT met'}"
        load = "{:.1f}-{:.1f}".format(*r["load_avg_1m"])
        print(
            f"{name:26} {r['messages_per_s']:>9,} {r['mb_per_s']:>7} {r['ratio_to_disk']:>13} "
            f"{r.get('puts_per_fsync') or '':>10} {r['cpu_us_per_message']:>10} {load:>11}  "
            f"{verdict}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
