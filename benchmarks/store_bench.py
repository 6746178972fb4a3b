"""`make bench` (store part): the figures the store issue asks for, with their targets.

Each case runs `mqaudit store bench` in a fresh directory and prints its JSON line; a table
at the end sets each figure against its target. Targets are reported, never asserted.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

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


def main() -> int:
    out_root = ROOT / "bench-out"
    out_root.mkdir(exist_ok=True)
    rows = []
    for name, args, target in CASES:
        work = Path(tempfile.mkdtemp(dir=out_root))
        cmd = [sys.executable, "-m", "broker_runtime.cli.main", "store", "bench"]
        cmd += ["--store", str(work / "store"), "--topics", "4", "--queues", "4", *args]
        try:
            line = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        finally:
            shutil.rmtree(work, ignore_errors=True)
        result = json.loads(line)
        print(json.dumps({"case": name, **result}), flush=True)
        rows.append((name, result, target))
    print()
    if rows:
        print(f"store kernels: {rows[0][1]['kernels']}, CRC-32: {rows[0][1]['crc']}")
    print(f"{'case':28} {'msg/s':>9} {'MB/s':>7} {'ratio_to_disk':>13} {'puts/fsync':>10}  target")
    for name, r, target in rows:
        verdict = ""
        if target is not None:
            figure, goal = target
            verdict = f"{figure} >= {goal}: {'met' if r[figure] >= goal else 'NOT met'}"
        print(
            f"{name:28} {r['messages_per_s']:>9,} {r['mb_per_s']:>7} {r['ratio_to_disk']:>13} "
            f"{r.get('puts_per_fsync') or '':>10}  {verdict}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
