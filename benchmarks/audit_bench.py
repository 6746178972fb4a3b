"""`make bench` (audit part): the audit job over lakes of 1M and 4M ledger rows on local[2],
and the time ratio 4M / 1M (target at most 4.5; the 4M audit at most 60 s). Prints one JSON
object per lake, then one JSON line of all figures and a table of the figures against their
targets.

1. Builds each lake (benchmarks/audit_lake.py; kept under --work and reused by later runs
   of the same size).
2. Times `run_audit` (what `mqaudit pipeline audit` runs) on each lake with each Delta
   backend in turn (native delta-spark, embedded delta-rs) in one Spark session
   started beforehand, after one untimed audit of the smaller lake (neither the JVM start
   nor its JIT warm-up is counted): wall-clock and CPU seconds of the driver, the JVM and
   its Python workers. Per-table times go to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from audit_lake import T0, build_lake
from machine import cpu_probe_seconds
from pyspark.sql import SparkSession
from spark_process import cpu_seconds

from broker_runtime.common.progress import show_progress
from pipeline.lake import table_path

ROOT = Path(__file__).resolve().parent.parent
TARGET_RATIO = 4.5
TARGET_LARGE_SECONDS = 60.0  # the audit of 4M ledger rows on local[2] (issue 21)


def time_audit(spark: SparkSession, lake: Path, n: int) -> dict[str, Any]:
    """One audit of the lake from scratch (its audit tables removed first: an audit that
    finds its tables unchanged writes nothing, and would time reads only)."""
    from pipeline.jobs.audit import run_audit
    from pipeline.lake import AUDIT_TABLES

    for name in AUDIT_TABLES:
        shutil.rmtree(table_path(lake, name), ignore_errors=True)
    pid = spark._jvm.java.lang.ProcessHandle.current().pid()  # type: ignore[union-attr]
    cpu = cpu_seconds(pid) + time.process_time()
    start = time.perf_counter()
    summary = run_audit(lake, spark, as_of_ms=T0 + n + 120_000)
    seconds = time.perf_counter() - start
    cpu = cpu_seconds(pid) + time.process_time() - cpu
    return {
        "audit_seconds": round(seconds, 2),
        "audit_cpu_seconds": round(cpu, 1),
        "audit_rows": {t: s["rows"] for t, s in summary["tables"].items()},
        "kinds": {t: s["kinds"] for t, s in summary["tables"].items() if s["rows"]},
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1000000,4000000", help="ledger rows of the two lakes")
    p.add_argument("--work", type=Path, default=ROOT / "bench-out" / "audit")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--repeat", type=int, default=1, help="audits per lake (the fastest counts)")
    p.add_argument("--no-warmup", action="store_true", help="no untimed audit first")
    p.add_argument("--backends", default="native,embedded", help="Delta backends to time")
    args = p.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    if len(sizes) != 2 or min(sizes) <= 0 or args.repeat < 1:
        p.error("--sizes takes two positive sizes; --repeat at least 1")
    show_progress()  # the audit's per-table times, on stderr
    from pipeline.spark_session import build_spark

    t0 = time.perf_counter()
    spark = build_spark("mqaudit-audit-bench", args.master)
    jvm_start = time.perf_counter() - t0
    lakes = {}
    for size in sizes:
        n = size // 3  # a stub and two groups' deliveries per message
        t0 = time.perf_counter()
        lake = args.work / f"lake-{size}"
        lakes[size] = (lake, n, build_lake(spark, lake, n), time.perf_counter() - t0)
    backends = args.backends.split(",")
    if not args.no_warmup:  # the JIT compiles the audit's code once, before either timing
        print("warm-up audit (not timed)", file=sys.stderr, flush=True)
        for backend in backends:
            with _backend(backend):
                time_audit(spark, *lakes[sizes[0]][:2])
    results: dict[str, list[dict[str, Any]]] = {}
    for size in sizes:
        lake, n, rows, built = lakes[size]
        for backend in backends:  # side by side: the same lake, one backend after the other
            probe = cpu_probe_seconds()
            with _backend(backend):
                runs = [time_audit(spark, lake, n) for _ in range(args.repeat)]
            best = min(runs, key=lambda r: r["audit_seconds"])
            ledger = rows["message_stub"] + rows["message_log"]
            result = {
                "stage": f"audit at {size:,} ({backend})",
                "backend": backend,
                "ledger_rows": ledger,
                "message_rows": rows["messages"],
                "table_rows": rows,
                "build_seconds": round(built, 1),
                **best,
                "all_seconds": [r["audit_seconds"] for r in runs],
                "ledger_rows_per_s": round(ledger / best["audit_seconds"]),
                "load_average": [round(x, 2) for x in os.getloadavg()],
                "cpu_probe_seconds": [probe, cpu_probe_seconds()],
            }
            results.setdefault(backend, []).append(result)
            print(json.dumps(result), flush=True)
    figures: dict[str, Any] = {
        "bench": "audit",
        "master": args.master,
        "jvm_start_seconds": round(jvm_start, 1),
        "shuffle_partitions": spark.conf.get("spark.sql.shuffle.partitions"),
        "target_time_ratio": TARGET_RATIO,
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    table: list[tuple[str, Any, str]] = []
    for backend, (small, large) in results.items():
        figures[backend] = {
            "ledger_rows": [r["ledger_rows"] for r in (small, large)],
            "audit_seconds": [r["audit_seconds"] for r in (small, large)],
            "audit_cpu_seconds": [r["audit_cpu_seconds"] for r in (small, large)],
            "time_ratio": round(large["audit_seconds"] / small["audit_seconds"], 3),
            "cpu_ratio": round(large["audit_cpu_seconds"] / small["audit_cpu_seconds"], 3),
            "rows_ratio": round(large["ledger_rows"] / small["ledger_rows"], 3),
        }
        f = figures[backend]
        table += [
            (f"{backend}: audit s, {small['ledger_rows']:,} rows", small["audit_seconds"], ""),
            (
                f"{backend}: audit s, {large['ledger_rows']:,} rows",
                large["audit_seconds"],
                f"<= {TARGET_LARGE_SECONDS:.0f}: "
                + ("met" if large["audit_seconds"] <= TARGET_LARGE_SECONDS else "not met"),
            ),
            (f"{backend}: time ratio", f["time_ratio"], f"<= {TARGET_RATIO}"),
            (f"{backend}: CPU ratio", f["cpu_ratio"], "(CPU-seconds, less load-bound)"),
            (
                f"{backend}: cpu probe s, before / after",
                " / ".join(str(p) for r in (small, large) for p in r["cpu_probe_seconds"]),
                "(benchmarks/machine.py)",
            ),
        ]
    if {"native", "embedded"} <= set(results):
        for i, size in enumerate(sizes):
            speed = results["embedded"][i]["audit_seconds"] / results["native"][i]["audit_seconds"]
            table.append((f"native speed / embedded, {size:,}", round(speed, 3), ">= 0.8"))
    spark.stop()
    print(json.dumps(figures), flush=True)
    print()
    table.append(("load average (1 min)", round(os.getloadavg()[0], 1), "(2 cores)"))
    for name, value, target in table:
        print(f"{name:36} {value:>12}  {target}")
    return 0


@contextmanager
def _backend(name: str) -> Iterator[None]:
    """The Delta backend forced for the block (pipeline.spark_session.BACKEND_ENV)."""
    from pipeline.spark_session import BACKEND_ENV

    os.environ[BACKEND_ENV] = name
    try:
        yield
    finally:
        os.environ.pop(BACKEND_ENV, None)


if __name__ == "__main__":
    sys.exit(main())
