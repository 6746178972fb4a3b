"""A pull at a damaged unit: the units before it delivered, the position reported, and pulls
held there until an operator skips it with `mqaudit store skip-unit` (the skip recorded)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from broker_runtime.broker.damaged_units import SKIP_FILE, DamagedUnits
from broker_runtime.broker.message_filter import parse_subscription
from broker_runtime.broker.pull_reader import GetResult, GetStatus, read_queue
from broker_runtime.client.api import decode_messages
from broker_runtime.common.config import StoreConfig
from broker_runtime.common.message import Message
from broker_runtime.store.message_store import MessageStore
from tests.unit.broker_runtime.test_store_cli import mqaudit

N = 10


@pytest.fixture
def store(small_config: StoreConfig) -> MessageStore:
    s = MessageStore(small_config)
    results = [s.put_message(Message("T", f"m{i}".encode() * 20, queue_id=0)) for i in range(N)]
    s.wait_dispatched()
    s.results = results  # type: ignore[attr-defined]
    yield s
    s.shutdown()


def pull(store: MessageStore, damaged: DamagedUnits, offset: int) -> GetResult:
    return read_queue(
        store, "T", 0, offset, 32, parse_subscription("*"),
        max_bytes=1 << 20, correct_offset=True, slave_lag_bytes=1 << 30, damaged=damaged,
    )  # fmt: skip


def damage(store: MessageStore, phys: int, at: int, data: bytes) -> None:
    """Bytes changed on disk under the running store (its files are shared mappings)."""
    f = store.commit_log.segments.find(phys)
    assert f is not None
    with open(f.path, "r+b") as out:
        out.seek(phys - f.file_from_offset + at)
        out.write(data)


@pytest.mark.parametrize(
    ("at", "data", "reason"),
    [(4, b"\0\0\0\1", "bad_magic"), (100, b"\xff", "bad_crc")],
)
def test_a_pull_stops_at_a_damaged_unit_until_an_operator_skips_it(
    store: MessageStore, caplog: pytest.LogCaptureFixture, at: int, data: bytes, reason: str
) -> None:
    victim = store.results[4]  # type: ignore[attr-defined]
    damage(store, victim.phys_offset, at, data)
    damaged = DamagedUnits(store.config.store_dir)
    with caplog.at_level(logging.ERROR):
        r = pull(store, damaged, 0)
    # The body is what a consumer accepts (it refuses a whole body with one bad unit).
    msgs = decode_messages(b"".join(r.units), "b")
    assert [m.msg.body for m in msgs] == [f"m{i}".encode() * 20 for i in range(4)]
    assert (r.status, r.next_begin_offset) == (GetStatus.FOUND, 4)
    [seen] = damaged.status()
    assert (seen["topic"], seen["queue_id"], seen["queue_offset"]) == ("T", 0, 4)
    assert seen["phys_offset"] == victim.phys_offset and reason in seen["reason"]
    assert f"queue offset 4 at log offset {victim.phys_offset}" in caplog.text
    again = pull(store, damaged, 4)
    assert (again.status, again.next_begin_offset, again.units) == (GetStatus.DAMAGED_UNIT, 4, [])

    store.commit_log.segments.flush()
    proc = mqaudit(
        "store", "skip-unit", "--store", store.config.store_dir, "--topic", "T", "--queue", "0",
        "--offset", "4", "--by", "ops@example", "--note", "disk error, message lost",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout)
    saved = json.loads((Path(store.config.store_dir) / SKIP_FILE).read_text())
    assert saved == {"skipped": [record]}
    assert (record["queue_offset"], record["phys_offset"], record["by"]) == (
        4, victim.phys_offset, "ops@example",
    )  # fmt: skip
    assert reason in record["reason"] and record["note"] == "disk error, message lost"

    after = pull(store, damaged, 4)
    assert after.status is GetStatus.FOUND and after.next_begin_offset == N
    assert [m.msg.body for m in decode_messages(b"".join(after.units), "b")] == [
        f"m{i}".encode() * 20 for i in range(5, N)
    ]
    assert damaged.status() == []  # reported while it held pulls, not since


def test_a_good_unit_cannot_be_skipped(store: MessageStore) -> None:
    store.commit_log.segments.flush()
    proc = mqaudit(
        "store", "skip-unit", "--store", store.config.store_dir, "--topic", "T", "--queue", "0",
        "--offset", "3", "--by", "ops",
    )  # fmt: skip
    assert proc.returncode != 0 and "is not damaged" in proc.stderr
    missing = mqaudit(
        "store", "skip-unit", "--store", store.config.store_dir, "--topic", "T", "--queue", "0",
        "--offset", "99", "--by", "ops",
    )  # fmt: skip
    assert missing.returncode != 0 and "no entry at queue offset 99" in missing.stderr
    assert not (Path(store.config.store_dir) / SKIP_FILE).exists()
