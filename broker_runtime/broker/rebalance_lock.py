"""Queue locks for orderly consumption (RocketMQ's RebalanceLockManager). No I/O.

An orderly consumer consumes a queue only while it holds the queue's lock on the queue's
broker: LOCK_BATCH_MQ takes or renews locks, UNLOCK_BATCH_MQ gives them up. A lock not
renewed within `max_live_ms` (60 s) expires and may be taken by another client of the
group; the consumer renews every 20 s. Times are passed in, so the table is testable.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

DEFAULT_MAX_LIVE_MS = 60_000


class MessageQueue(NamedTuple):
    topic: str
    broker_name: str
    queue_id: int


@dataclass(slots=True)
class LockEntry:
    client_id: str
    last_update_ms: int


class RebalanceLockManager:
    def __init__(self, max_live_ms: int = DEFAULT_MAX_LIVE_MS) -> None:
        self.max_live_ms = max_live_ms
        self.table: dict[str, dict[MessageQueue, LockEntry]] = {}

    def _expired(self, entry: LockEntry, now_ms: int) -> bool:
        return now_ms - entry.last_update_ms > self.max_live_ms

    def try_lock(self, group: str, mq: MessageQueue, client_id: str, now_ms: int) -> bool:
        """Take or renew the lock of `mq` for `client_id`; False if another client holds it."""
        locks = self.table.setdefault(group, {})
        entry = locks.get(mq)
        if entry is None:
            locks[mq] = LockEntry(client_id, now_ms)
            return True
        if entry.client_id == client_id or self._expired(entry, now_ms):
            entry.client_id, entry.last_update_ms = client_id, now_ms
            return True
        return False

    def try_lock_batch(
        self, group: str, mqs: Iterable[MessageQueue], client_id: str, now_ms: int
    ) -> list[MessageQueue]:
        """The queues of `mqs` now locked by `client_id` (in the order given)."""
        return [mq for mq in dict.fromkeys(mqs) if self.try_lock(group, mq, client_id, now_ms)]

    def unlock_batch(self, group: str, mqs: Iterable[MessageQueue], client_id: str) -> int:
        """Release the locks `client_id` holds among `mqs`; returns how many it released."""
        locks = self.table.get(group, {})
        released = 0
        for mq in mqs:
            entry = locks.get(mq)
            if entry is not None and entry.client_id == client_id:
                del locks[mq]
                released += 1
        if not locks:
            self.table.pop(group, None)
        return released

    def holder(self, group: str, mq: MessageQueue, now_ms: int) -> str | None:
        """The client holding an unexpired lock of `mq`, if any."""
        entry = self.table.get(group, {}).get(mq)
        return entry.client_id if entry and not self._expired(entry, now_ms) else None

    def is_all_expired(self, group: str, now_ms: int) -> bool:
        return all(self._expired(e, now_ms) for e in self.table.get(group, {}).values())

    def snapshot(
        self, group: str, topic: str, broker_name: str, now_ms: int
    ) -> dict[int, dict[str, object]]:
        """Queue id -> {"clientId", "lastUpdateTimestamp", "expired"} of one broker's queues."""
        return {
            mq.queue_id: {
                "clientId": e.client_id,
                "lastUpdateTimestamp": e.last_update_ms,
                "expired": self._expired(e, now_ms),
            }
            for mq, e in self.table.get(group, {}).items()
            if mq.topic == topic and mq.broker_name == broker_name
        }
