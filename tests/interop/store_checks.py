"""What the store-file interop tests read from a store, through mqaudit's own tools, and the
settings that let a real RocketMQ broker open a store mqaudit wrote.

    rows = dump(store)                         # `mqaudit store dump`, every message unit
    report = verify(store)                     # `mqaudit store verify`'s JSON
    log_bytes(store, end)                      # the CommitLog's bytes [0, end)
    queue_ends(store)                          # (topic, queue) -> next queue offset
"""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path
from typing import Any

from broker_runtime.store.consume_queue import ENTRY_SIZE
from broker_runtime.store.inspection import read_consume_queues, segment_files
from tests.conftest import mqaudit_cmd
from tests.integration.cluster_fixtures import TEST_BROKER_SETTINGS


def same_file_sizes(segment_size: int) -> dict[str, str]:
    """broker.conf settings of a real broker opening a store of mqaudit's test brokers
    (TEST_BROKER_SETTINGS): it maps every file at its configured size, so they must agree."""
    mine = TEST_BROKER_SETTINGS
    return {
        "mappedFileSizeCommitLog": str(segment_size),
        "mappedFileSizeConsumeQueue": str(int(mine["store.cq_entries_per_file"]) * ENTRY_SIZE),
        "maxHashSlotNum": mine["store.index_hash_slots"],
        "maxIndexNum": mine["store.index_max_entries"],
    }


def _cli(*args: str) -> str:
    done = subprocess.run(mqaudit_cmd(*args), capture_output=True, text=True, timeout=120)
    if done.returncode not in (0, 1):
        raise RuntimeError(f"mqaudit {args} exited {done.returncode}: {done.stderr[-3000:]}")
    return done.stdout


def dump(store: Path, topic: str | None = None) -> list[dict[str, Any]]:
    """`mqaudit store dump`: one dict per message unit, in log order, body decoded."""
    argv = ["store", "dump", "--store", str(store), *(["--topic", topic] if topic else [])]
    rows = [json.loads(line) for line in _cli(*argv).splitlines()]
    for row in rows:
        row["body"] = base64.b64decode(row["body"]).decode()
    return rows


def verify(store: Path) -> dict[str, Any]:
    """`mqaudit store verify`'s report (exit 1 when inconsistent: the report says why)."""
    report: dict[str, Any] = json.loads(_cli("store", "verify", "--store", str(store)))
    return report


def log_end(rows: list[dict[str, Any]]) -> int:
    """Where the last unit of a dump ends."""
    return max(r["phys_offset"] + r["total_size"] for r in rows)


def log_bytes(store: Path, end: int) -> bytes:
    """The CommitLog's bytes [0, end), across its files."""
    out = bytearray()
    for path in segment_files(store):
        start = int(path.name)
        if start < end:
            out += path.read_bytes()[: max(0, end - start)]
    return bytes(out)


def queue_ends(store: Path) -> dict[tuple[str, int], int]:
    """(topic, queue id) -> the queue's next offset, from its ConsumeQueue files."""
    return {
        key: max(entries) + 1
        for key, entries in read_consume_queues(store / "consumequeue", 0).items()
        if entries
    }


def by_queue(rows: list[dict[str, Any]]) -> dict[tuple[str, int], list[int]]:
    """Queue offsets in the order the rows list them, per (topic, queue id)."""
    out: dict[tuple[str, int], list[int]] = {}
    for r in rows:
        out.setdefault((r["topic"], r["queueId"]), []).append(r["queueOffset"])
    return out
