"""Subprocess for test_store_crash: puts messages into a store until it is killed.

Several producer threads put messages (batches of 1..3) carrying a UNIQ_KEY; after a put
returns, its thread appends one line per message, `key topic queue_id phys_offset size`, to the
ack file with os.write + os.fsync. The ack file therefore never claims a message the store had
not acknowledged, and what it claims survives the kill. The body of each message is derived
from its key (`body_for`), so a reader can check it without the writer.

Usage: crash_writer.py --store DIR --acks FILE [--flush sync|async] [options]
The process is meant to be killed (SIGKILL); it stops by itself after --max-seconds.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

from broker_runtime.common.config import FlushMode, StoreConfig
from broker_runtime.common.message import TAGS, UNIQ_KEY, Message
from broker_runtime.store.message_store import MessageStore

TOPICS = ("CrashTopicA", "CrashTopicB")
QUEUES = 3  # per topic


def body_for(key: str) -> bytes:
    """The body the writer stores under `key` (its length varies with the key)."""
    return f"<{key}>".encode() * (1 + int(key[-3:]) % 7)


def message_for(producer: int, seq: int) -> Message:
    key = f"P{producer:02d}S{seq:08d}"
    return Message(
        topic=TOPICS[seq % len(TOPICS)],
        body=body_for(key),
        properties={UNIQ_KEY: key, TAGS: f"tag{seq % 3}"},
        queue_id=(seq // len(TOPICS)) % QUEUES,
        born_timestamp=int(time.time() * 1000),
    )


def store_config(
    store_dir: Path,
    flush: FlushMode,
    segment_size: int = 256 * 1024,
    flush_interval_ms: int = 50,
    cq_flush_interval_ms: int = 100,
) -> StoreConfig:
    """The configuration both the writer and the test open the store with."""
    return StoreConfig(
        store_dir=store_dir,
        segment_size=segment_size,
        cq_entries_per_file=500,  # ConsumeQueue files roll too
        index_hash_slots=4096,
        index_max_entries=3000,  # and so do index files
        flush=flush,
        flush_interval_ms=flush_interval_ms,
        cq_flush_interval_ms=cq_flush_interval_ms,
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", type=Path, required=True)
    parser.add_argument("--acks", type=Path, required=True)
    parser.add_argument("--flush", choices=[m.value for m in FlushMode], default="sync")
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--segment-size", type=int, default=256 * 1024)
    parser.add_argument("--flush-interval-ms", type=int, default=50)
    parser.add_argument("--cq-flush-interval-ms", type=int, default=100)
    parser.add_argument("--max-seconds", type=float, default=60.0)
    args = parser.parse_args()

    config = store_config(
        args.store,
        FlushMode(args.flush),
        args.segment_size,
        args.flush_interval_ms,
        args.cq_flush_interval_ms,
    )
    store = MessageStore(config, disk_ratio=lambda _path: 0.0)
    fd = os.open(args.acks, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    deadline = time.monotonic() + args.max_seconds

    def produce(k: int) -> None:
        seq = 0
        try:
            while time.monotonic() < deadline:
                n = 1 + (seq + k) % 3
                msgs = [message_for(k, seq + j) for j in range(n)]
                results = store.put_messages(msgs)
                lines = "".join(
                    f"{m.properties[UNIQ_KEY]} {m.topic} {m.queue_id} {r.phys_offset} {r.size}\n"
                    for m, r in zip(msgs, results, strict=True)
                )
                os.write(fd, lines.encode())
                os.fsync(fd)
                seq += n
        except BaseException as e:  # the test sees the writer die early and shows stderr
            print(f"producer {k} failed: {e!r}", file=sys.stderr, flush=True)
            os._exit(3)

    threads = [threading.Thread(target=produce, args=(k,)) for k in range(args.producers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    os.close(fd)
    store.shutdown()
    print("writer stopped at its deadline", file=sys.stderr)
    return 4  # reaching the deadline means nobody killed us: not what the test wants


if __name__ == "__main__":
    sys.exit(main())
