"""`make bench` (ingest part): CommitLog -> Delta throughput, parse stage vs raw reads, and
driver memory at two input sizes. Prints one JSON object per figure group, then a table of
figures against their targets (reported, never asserted).

1. Writes N 1 KiB messages (distinct random bodies) across 2 brokers' stores through the
   store's batch put (kept under --work and reused by later runs of the same size).
2. raw read: every segment's written bytes read with plain 1 MiB reads, 2 threads, from the
   page cache (warm) and from the device (O_DIRECT).
3. parse: the reader alone (segment walk + decode to Arrow, no Spark) over the same
   ranges in 2 processes: its MB/s over the raw read MB/s is the parse ratio. Raw read and
   parse take turns, ROUNDS times; the median round's ratio is reported (on a shared
   machine one round alone is mostly a sample of the neighbours' load).
4. ingest: `run_ingest` on local[2] into a fresh lake, timed after the JVM has started,
   with each Delta backend in turn (native delta-spark, then embedded delta-rs) in one
   session, each after a warm-up ingest of 20,000 messages into a throwaway lake (the
   first Delta commits of a JVM load delta-spark's classes); then the backends take turns,
   --rounds times (default ROUNDS), the page cache synced before each run: messages/s of
   each backend's median run and their ratio.
5. memory: ingest in a fresh process at two sizes; peak RSS during the ingest of the driver
   (the Python process plus the Spark JVM, which holds the driver in local mode) at the
   larger size over the smaller.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from machine import cpu_probe_seconds
from spark_process import PeakRss, cpu_seconds

from broker_runtime.common.config import StoreConfig
from broker_runtime.common.message import KEYS, TAGS, UNIQ_KEY, Message
from broker_runtime.store.message_store import MessageStore
from pipeline.readers.commitlog import (
    RangeTask,
    plan_log,
    read_range,
    segment_files,
)
from pipeline.readers.layout import discover_brokers
from pipeline.readers.segments import WalkResult

ROOT = Path(__file__).resolve().parent.parent
BROKERS = ("broker-a", "broker-b")
BATCH = 64
WORKERS = 2  # as local[2]
ROUNDS = 3
WARM_UP_MESSAGES = 20_000  # ingested by each backend before its timed run
TARGET_NATIVE = 1_000_000  # messages/s on local[2] with the native Delta backend


def make_cluster(data_dir: Path, messages: int, size: int) -> None:
    """N messages split over the brokers' master stores (skipped if already there)."""
    done = data_dir / "generated.json"
    if done.exists() and json.loads(done.read_text()) == {"messages": messages, "size": size}:
        return
    shutil.rmtree(data_dir, ignore_errors=True)
    born = int(time.time() * 1000)
    for b, name in enumerate(BROKERS):
        store = MessageStore(StoreConfig(store_dir=data_dir / "brokers" / name / "master"))
        mine = range(b, messages, len(BROKERS))
        batch: list[Message] = []
        for n, i in enumerate(mine):
            props = {
                UNIQ_KEY: f"{uuid.UUID(int=i).hex.upper()}",
                TAGS: f"Tag{i % 4}",
                KEYS: f"k{i}",
            }
            batch.append(
                Message(f"BenchTopic{i % 4}", os.urandom(size), props, (i // 4) % 4, 0, 0, born)
            )
            if len(batch) == BATCH:
                store.put_messages(batch)
                batch = []
            if n % 200_000 == 0:
                print(f"  {name}: stored {n:,}/{len(mine):,}", file=sys.stderr, flush=True)
        if batch:
            store.put_messages(batch)
        store.wait_dispatched(None)
        store.shutdown()
    done.write_text(json.dumps({"messages": messages, "size": size}))


def _read_file(path: Path, limit: int) -> tuple[int, float]:
    buf = bytearray(1 << 20)
    n = 0
    cpu = time.thread_time()
    with open(path, "rb", buffering=0) as f:
        while n < limit:
            k = f.readinto(buf)
            if not k:
                break
            n += k
    return min(n, limit), time.thread_time() - cpu


def _read_direct(path: Path, limit: int) -> int:
    """Bytes read with O_DIRECT (past the page cache: what the device gives)."""
    import mmap

    buf = mmap.mmap(-1, 1 << 20)  # page-aligned, as O_DIRECT needs
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        n = 0
        while n < limit:
            k = os.preadv(fd, [buf], n)
            if not k:
                break
            n += k
        return min(n, limit)
    finally:
        os.close(fd)
        buf.close()


def device_read(tasks: list[RangeTask]) -> dict[str, float]:
    """MB/s of reading the same bytes from the device (O_DIRECT, 2 threads)."""
    extents: dict[str, int] = {}
    for t in tasks:
        extents[t.path] = max(extents.get(t.path, 0), t.stop)
    start = time.perf_counter()
    with ThreadPoolExecutor(WORKERS) as pool:
        total = sum(pool.map(lambda kv: _read_direct(Path(kv[0]), kv[1]), extents.items()))
    return {"device_read_mb_per_s": round(total / (time.perf_counter() - start) / 1e6, 1)}


def raw_read(tasks: list[RangeTask]) -> dict[str, float]:
    """MB/s of reading the ranges' bytes with plain reads (2 threads, one per file)."""
    extents: dict[str, int] = {}
    for t in tasks:
        extents[t.path] = max(extents.get(t.path, 0), t.stop)
    start = time.perf_counter()
    with ThreadPoolExecutor(WORKERS) as pool:
        out = list(pool.map(lambda kv: _read_file(Path(kv[0]), kv[1]), extents.items()))
    seconds = time.perf_counter() - start
    total, cpu = sum(n for n, _ in out), sum(c for _, c in out)
    return {
        "raw_read_mb": round(total / 1e6, 1),
        "raw_read_mb_per_s": round(total / seconds / 1e6, 1),
        "raw_read_mb_per_cpu_s": round(total / cpu / 1e6, 1),
    }


def _parse_one(task: RangeTask) -> tuple[int, int, float]:
    cpu = time.process_time()
    result = WalkResult()
    rows = sum(b.num_rows for b in read_range(task, result))
    return rows, task.stop - task.start, time.process_time() - cpu


def parse_only(tasks: list[RangeTask]) -> dict[str, float]:
    # Each worker parses one range as it starts (the initializer): a process's first batch
    # imports pyarrow.compute and pandas, 0.4-0.5 s of CPU once per process, as a Spark
    # worker's first task does. Warm-up tasks instead left it to chance which worker got
    # them, and the other paid the imports in the timed part. The sleeps keep the first
    # worker busy, so both are started (and have run the initializer) before the clock.
    with ProcessPoolExecutor(WORKERS, initializer=_parse_one, initargs=(tasks[0],)) as pool:
        list(pool.map(time.sleep, [1.0] * WORKERS))
        start = time.perf_counter()
        out = list(pool.map(_parse_one, tasks))
    seconds = time.perf_counter() - start
    rows, nbytes, cpu = (sum(x[i] for x in out) for i in range(3))
    return {
        "parse_messages": rows,
        "parse_seconds": round(seconds, 3),
        "parse_mb_per_s": round(nbytes / seconds / 1e6, 1),
        "parse_messages_per_s": round(rows / seconds),
        "parse_mb_per_cpu_s": round(nbytes / cpu / 1e6, 1),
    }


def ingest(
    data_dir: Path,
    lake: Path,
    master: str,
    backends: tuple[str, ...] = ("",),
    warm_up: Path | None = None,
    rounds: int = 1,
) -> dict[str, dict[str, Any]]:
    """`run_ingest` into a fresh lake with each Delta backend ("" the default), in one
    session started beforehand; figures by backend. With `warm_up` (a small data dir), each
    backend first ingests it into a throwaway lake: a JVM's first Delta commits load and
    compile delta-spark's classes (tens of seconds on a busy machine), which the timed runs
    should not count; the warm-up's own time is reported.

    The backends take turns, `rounds` times, each round starting with the next one, and
    each backend's figures are those of its median run (every run's seconds are listed). A
    single run of each mostly measured which went first: the first large ingest of a JVM
    took 3.05-6.19 s, the later ones 1.6-2.6 s. The page cache is synced before each run,
    so that none pays for the write-back of the 1 GB of files the one before wrote."""
    from pipeline.jobs.ingest import run_ingest
    from pipeline.spark_session import BACKEND_ENV, build_spark

    t0 = time.perf_counter()
    spark = build_spark("mqaudit-ingest-bench", master)
    jvm_start = time.perf_counter() - t0
    pid = spark._jvm.java.lang.ProcessHandle.current().pid()  # type: ignore[union-attr]
    warm_s: dict[str, float] = {}
    runs: dict[str, list[dict[str, Any]]] = {}
    for n in range(rounds + (warm_up is not None)):
        for backend in backends[n % len(backends) :] + backends[: n % len(backends)]:
            if backend:
                os.environ[BACKEND_ENV] = backend
            if n == 0 and warm_up is not None:
                throwaway = lake.with_name(f"{lake.name}-warm-up")
                shutil.rmtree(throwaway, ignore_errors=True)
                start = time.perf_counter()
                run_ingest(warm_up, throwaway, spark, progress=False)
                warm_s[backend] = round(time.perf_counter() - start, 1)
                shutil.rmtree(throwaway, ignore_errors=True)
            else:
                run = _timed_ingest(data_dir, lake, spark, pid)
                runs.setdefault(run["backend"], []).append(run)
            os.environ.pop(BACKEND_ENV, None)
    spark.stop()
    out = {}
    for backend, done in runs.items():
        median = sorted(done, key=lambda r: r["ingest_seconds"])[len(done) // 2]
        out[backend] = {
            "messages": median["messages"],
            "jvm_start_seconds": round(jvm_start, 1),
            "warm_up_seconds": warm_s.get(backend, warm_s.get("")),
            "rounds_seconds": [r["ingest_seconds"] for r in done],
            **{k: v for k, v in median.items() if k not in ("backend", "messages")},
        }
    return out


def _timed_ingest(data_dir: Path, lake: Path, spark: Any, pid: int) -> dict[str, Any]:
    """One ingest of `data_dir` into a fresh lake: its figures."""
    from pipeline.jobs.ingest import run_ingest

    shutil.rmtree(lake, ignore_errors=True)
    os.sync()  # the write-back of the lake just removed and of the run before
    with PeakRss(pid) as rss:
        cpu = cpu_seconds(pid) + time.process_time()
        start = time.perf_counter()
        summary = run_ingest(data_dir, lake, spark)
        seconds = time.perf_counter() - start
        cpu = cpu_seconds(pid) + time.process_time() - cpu
    log_bytes = sum(
        b["plan_end"] - b["start"] for b in summary["brokers"] if b["source"] == "commitlog"
    )
    return {
        "backend": summary["backend"],
        "messages": summary["messages"],
        "ingest_seconds": round(seconds, 2),
        "ingest_messages_per_s": round(summary["messages"] / seconds),
        "ingest_mb_per_s": round(log_bytes / seconds / 1e6, 1),
        # CPU seconds of the driver, the JVM and its Python workers: on a shared machine
        # the wall-clock figures above depend on what else runs; this one much less.
        "ingest_cpu_seconds": round(cpu, 1),
        "ingest_messages_per_cpu_s": round(summary["messages"] / cpu),
        "driver_python_peak_rss_mb": round(rss.peak_me / 2**20),
        "driver_jvm_peak_rss_mb": round(rss.peak / 2**20),
        "load_average": round(os.getloadavg()[0], 1),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=2_000_000)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--work", type=Path, default=ROOT / "bench-out" / "ingest")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--rss-sizes", default="1000000,4000000", help="two sizes, or 'none'")
    p.add_argument("--backends", default="native,embedded", help="Delta backends to time")
    p.add_argument("--rounds", type=int, default=ROUNDS, help="timed ingests of each backend")
    p.add_argument("--step", choices=["generate", "ingest"], help=argparse.SUPPRESS)
    args = p.parse_args()
    data = args.work / f"data-{args.messages}"
    lake = args.work / f"lake-{args.messages}"
    if args.step != "ingest":
        make_cluster(data, args.messages, args.size)
    if args.step == "generate":
        return 0
    if args.step == "ingest":  # the memory runs: a fresh process that only ingests
        (result,) = ingest(data, lake, args.master).values()
        print(json.dumps(result))
        shutil.rmtree(lake, ignore_errors=True)
        return 0
    tasks = [t for b in discover_brokers(data) for t in plan_log(b, 0).tasks]
    files = sum(len(segment_files(b.store_dir)) for b in discover_brokers(data))
    raw_read(tasks)  # warm the page cache: both stages then read from memory
    rounds = []
    for _ in range(ROUNDS):
        load = os.getloadavg()[0]
        read, parse = raw_read(tasks), parse_only(tasks)
        parse["parse_ratio_to_raw_read"] = round(
            parse["parse_mb_per_s"] / read["raw_read_mb_per_s"], 3
        )
        parse["parse_cpu_ratio_to_raw_read"] = round(
            parse["parse_mb_per_cpu_s"] / read["raw_read_mb_per_cpu_s"], 3
        )
        parse["load_average"] = load
        rounds.append((read, parse))
        round_ = {"stage": "read+parse round", **read, **parse}
        print(json.dumps(round_), flush=True)
    read, parse = sorted(rounds, key=lambda r: r[1]["parse_ratio_to_raw_read"])[ROUNDS // 2]
    read |= device_read(tasks)
    parse["parse_ratio_to_device_read"] = round(
        parse["parse_mb_per_s"] / read["device_read_mb_per_s"], 3
    )
    print(
        json.dumps({"stage": "read+parse (median round)", "segment_files": files, **read, **parse})
    )
    warm_up = args.work / f"data-{WARM_UP_MESSAGES}"
    make_cluster(warm_up, WARM_UP_MESSAGES, args.size)
    backends = tuple(args.backends.split(","))
    results = ingest(data, lake, args.master, backends, warm_up, args.rounds)
    rows: list[tuple[str, Any, str]] = []
    for backend, result in results.items():
        print(json.dumps({"stage": f"ingest ({backend})", **result}), flush=True)
        goal = f">= {TARGET_NATIVE:,} " if backend == "native" else ""
        rows += [
            (f"{backend}: messages/s", result["ingest_messages_per_s"],
             f"{goal}(load {result['load_average']})"),
            (f"{backend}: MB/s", result["ingest_mb_per_s"], ""),
            (f"{backend}: messages/CPU-s", result["ingest_messages_per_cpu_s"], "(x2 if idle)"),
        ]  # fmt: skip
    if {"native", "embedded"} <= set(results):
        ratio = (
            results["native"]["ingest_messages_per_s"]
            / results["embedded"]["ingest_messages_per_s"]
        )
        rows.append(("native / embedded", round(ratio, 3), ">= 0.8 (the default vs the other)"))
    rows += [
        (
            "parse / raw read",
            parse["parse_ratio_to_raw_read"],
            f">= 0.25 (load {parse['load_average']:.1f})",
        ),
        ("parse / raw read, CPU", parse["parse_cpu_ratio_to_raw_read"], "(per CPU-second)"),
        ("parse / device read", parse["parse_ratio_to_device_read"], "(O_DIRECT reads)"),
        ("load average (1 min)", round(os.getloadavg()[0], 1), "(2 cores)"),
        ("cpu probe s, at the end", cpu_probe_seconds(), "(benchmarks/machine.py)"),
    ]
    if args.rss_sizes != "none":
        peaks = []
        for n in [int(x) for x in args.rss_sizes.split(",")]:
            cmd = [sys.executable, __file__, "--messages", str(n), "--work", str(args.work),
                   "--size", str(args.size), "--master", args.master, "--step"]  # fmt: skip
            subprocess.run([*cmd, "generate"], check=True)
            load = os.getloadavg()[0]
            run = subprocess.run([*cmd, "ingest"], check=True, capture_output=True, text=True)
            out = {"load_average": load, **json.loads(run.stdout)}
            peaks.append(out["driver_python_peak_rss_mb"] + out["driver_jvm_peak_rss_mb"])
            print(json.dumps({"stage": f"memory at {n:,}", **out}), flush=True)
        rows.append(("driver peak RSS ratio", round(peaks[1] / peaks[0], 3), "<= 1.3"))
        # (RSS does not depend on the load; each memory run prints its load anyway)
    print()
    for name, value, target in rows:
        print(f"{name:24} {value:>12}  {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
