"""`mqaudit store bench`: real messages through the store, against plain sequential writes.

The clock runs while producer threads call `MessageStore.put_messages` (the call a broker's
send path makes, `batch` messages per call) and until every message is dispatched to its
ConsumeQueue and index and the log, queues and index are flushed. The messages are built
before the clock starts. The machine's load average and the process's CPU time are reported
with the figures: on a shared machine they say how much of it the run had.
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from broker_runtime.common.config import FlushMode, StoreConfig
from broker_runtime.common.message import TAGS, UNIQ_KEY, Message
from broker_runtime.store import accel
from broker_runtime.store import record_codec as codec
from broker_runtime.store.message_store import MessageStore

_BODY_POOL = 64  # distinct random bodies, reused: generating 1 GB of randomness is not the point


def _messages(n: int, size: int, topics: int, queues: int, seed: int) -> list[Message]:
    bodies = [os.urandom(size) for _ in range(_BODY_POOL)]
    prefix = uuid.UUID(int=seed).hex[:20].upper()
    born = int(time.time() * 1000)
    return [
        Message(
            topic=f"BenchTopic{i % topics}",
            body=bodies[i % _BODY_POOL],
            properties={UNIQ_KEY: f"{prefix}{i:012X}", TAGS: f"Tag{i % 4}"},
            queue_id=(i // topics) % queues,
            born_timestamp=born,
        )
        for i in range(n)
    ]


def disk_baseline(directory: Path, nbytes: int) -> float:
    """MB/s of writing `nbytes` sequentially with plain 1 MiB writes and one fsync."""
    path = directory / "disk-baseline.tmp"
    chunk = os.urandom(1 << 20)
    start = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        left = nbytes
        while left > 0:
            left -= os.write(fd, chunk[: min(len(chunk), left)])
        os.fsync(fd)
    finally:
        os.close(fd)
        elapsed = time.perf_counter() - start
        path.unlink(missing_ok=True)
    return nbytes / elapsed / 1e6


def run_bench(
    store_dir: Path,
    *,
    messages: int,
    size: int,
    topics: int,
    queues: int,
    flush: FlushMode,
    segment_size: int = 1 << 30,
    producers: int = 1,
    batch: int = 1,
    seed: int = 0,
    progress: bool = False,
) -> dict[str, Any]:
    store_dir = Path(store_dir)
    if store_dir.exists() and any(store_dir.iterdir()):
        raise FileExistsError(f"{store_dir} is not empty; the bench writes a fresh store")
    msgs = _messages(messages, size, topics, queues, seed)
    store_dir.mkdir(parents=True, exist_ok=True)
    # The same byte count as the log will have (exact for one topic; within a few bytes else).
    expected_bytes = (
        sum(codec.prepare(m).size for m in msgs[:1000]) * messages // min(messages, 1000)
    )
    disk_before = disk_baseline(store_dir, expected_bytes)
    config = StoreConfig(store_dir=store_dir, segment_size=segment_size, flush=flush)
    store = MessageStore(config)
    per_producer = [msgs[i::producers] for i in range(producers)]
    errors: list[BaseException] = []
    done = [0] * producers

    def produce(k: int) -> None:
        mine = per_producer[k]
        try:
            for i in range(0, len(mine), batch):
                store.put_messages(mine[i : i + batch])
                done[k] = i + batch
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=produce, args=(k,)) for k in range(producers)]
    load_before = os.getloadavg()[0]
    cpu_start = time.process_time()
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(1.0)
            if progress and t.is_alive():
                n = min(sum(done), messages)
                print(f"  stored {n:,}/{messages:,} messages", file=sys.stderr, flush=True)
    put_done = time.perf_counter()
    store.wait_dispatched(None)
    store.commit_log.segments.flush()
    store.flush_logics()
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu_start
    load_after = os.getloadavg()[0]
    if errors:
        store.shutdown()
        raise errors[0]
    log_bytes = store.commit_log.max_offset - store.commit_log.min_offset
    sync_puts, fsyncs = store.group_commit_stats
    store.shutdown()
    # This disk's fsync speed swings by 2-4x from run to run: the baseline is the median of
    # one measurement before the store's run and two after it, all three reported.
    disk_runs = [
        disk_before,
        disk_baseline(store_dir, log_bytes),
        disk_baseline(store_dir, log_bytes),
    ]
    disk = statistics.median(disk_runs)
    mb_per_s = log_bytes / elapsed / 1e6
    result: dict[str, Any] = {
        "messages": messages,
        "size": size,
        "topics": topics,
        "queues": queues,
        "flush": flush.value,
        "producers": producers,
        "batch": batch,
        "api": f"MessageStore.put_messages, {batch} message(s) per call",
        "timed": "puts, ConsumeQueue and index dispatch, flush of log, queues and index",
        "seconds": round(elapsed, 3),
        "put_seconds": round(put_done - start, 3),
        "messages_per_s": round(messages / elapsed),
        "mb_per_s": round(mb_per_s, 1),
        "disk_mb_per_s": round(disk, 1),
        "disk_mb_per_s_runs": [round(d, 1) for d in disk_runs],
        "ratio_to_disk": round(mb_per_s / disk, 3),
        "cpu_us_per_message": round(cpu / messages * 1e6, 2),  # all threads of the process
        "load_avg_1m": [round(load_before, 2), round(load_after, 2)],  # at start and end
        "kernels": accel.IMPLEMENTATION,  # "c" (the _accel extension) or "python"
        "crc": accel.CRC,
        "store": str(store_dir),
    }
    if flush is FlushMode.SYNC:
        result["fsyncs"] = fsyncs
        result["puts_per_fsync"] = round(sync_puts / fsyncs, 2) if fsyncs else None
    return result
