"""The queue access lock (DeFiBus's ConsumeQueueAccessLockManager). No I/O.

Off by default. When on, a master lets one client of a group pull a queue at a time: the
holder. Another client (the queue's new owner after a rebalance, or a second owner when
name servers disagree) is held back until the holder's delivered messages are acked (the
group's committed offset reaches the offset after the last message delivered to it), the
holder has left the group, or the holder has been idle for `hold_timeout_ms` (no pull of
its own running or started in that time). Then the lock moves to the new client.

RocketMQ keeps no such lock: there the new owner pulls at once from the committed offset
and gets again what the old owner had been delivered but not acked (2.3).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

DEFAULT_HOLD_TIMEOUT_MS = 30_000

QueueKey = tuple[str, str, int]  # group, topic, queue id


@dataclass(slots=True)
class AccessEntry:
    client_id: str
    since_ms: int  # when this client got the queue
    last_access_ms: int  # the start or end of its latest pull
    delivered: int  # queue offset after the last message delivered to it
    pulls_running: int = 0
    refused: int = 0  # pulls of other clients held back while this entry's holder had it
    transfers: int = 0  # times the queue moved to another client


class Access(NamedTuple):
    allowed: bool
    acquired: bool  # the client just got the queue (it was free or moved to it)
    reason: str


class QueueAccessLocks:
    def __init__(self, hold_timeout_ms: int = DEFAULT_HOLD_TIMEOUT_MS) -> None:
        self.hold_timeout_ms = hold_timeout_ms
        self.table: dict[QueueKey, AccessEntry] = {}
        self.refused = 0
        self.transfers: dict[str, int] = {}  # left | acked | timeout -> count

    def check(
        self, key: QueueKey, client_id: str, now_ms: int, committed: int, holder_alive: bool
    ) -> Access:
        """May `client_id` pull the queue now? Takes the lock when it may and it is not its own.

        `committed` is the group's committed offset of the queue (-1: none); `holder_alive`
        whether the current holder is still a member of the group.
        """
        entry = self.table.get(key)
        if entry is None:
            self.table[key] = AccessEntry(client_id, now_ms, now_ms, committed)
            return Access(True, True, "the queue was free")
        if entry.client_id == client_id:
            entry.last_access_ms = now_ms
            return Access(True, False, "holder")
        idle = now_ms - entry.last_access_ms
        if not holder_alive:
            kind, reason = "left", f"holder {entry.client_id} left the group"
        elif committed >= entry.delivered:
            kind = "acked"
            reason = f"holder {entry.client_id} acked all it was delivered ({entry.delivered})"
        elif entry.pulls_running == 0 and idle > self.hold_timeout_ms:
            kind = "timeout"
            reason = f"holder {entry.client_id} idle {idle} ms > {self.hold_timeout_ms} ms"
        else:
            return Access(
                False,
                False,
                f"queue locked by {entry.client_id}: delivered up to {entry.delivered}, "
                f"acked {committed}, idle {idle} ms of {self.hold_timeout_ms} ms",
            )
        self.transfers[kind] = self.transfers.get(kind, 0) + 1
        entry.client_id, entry.since_ms, entry.last_access_ms = client_id, now_ms, now_ms
        entry.delivered = committed
        entry.pulls_running = 0
        entry.transfers += 1
        return Access(True, True, reason)

    def refuse(self, key: QueueKey) -> None:
        """Count a pull answered without messages because another client held the queue."""
        self.refused += 1
        entry = self.table.get(key)
        if entry is not None:
            entry.refused += 1

    def holds(self, key: QueueKey, client_id: str) -> bool:
        entry = self.table.get(key)
        return entry is not None and entry.client_id == client_id

    def pull_started(self, key: QueueKey, client_id: str, now_ms: int) -> None:
        entry = self.table.get(key)
        if entry is not None and entry.client_id == client_id:
            entry.pulls_running += 1
            entry.last_access_ms = now_ms

    def pull_ended(self, key: QueueKey, client_id: str, now_ms: int, delivered: int | None) -> None:
        """A pull of the holder ended; `delivered` is its next offset if it returned messages."""
        entry = self.table.get(key)
        if entry is None or entry.client_id != client_id:
            return
        entry.pulls_running = max(0, entry.pulls_running - 1)
        entry.last_access_ms = now_ms
        if delivered is not None:
            entry.delivered = max(entry.delivered, delivered)

    def snapshot(self, group: str, topic: str) -> dict[int, dict[str, object]]:
        """Queue id -> the entry as JSON, for GET_CONSUME_STATS."""
        return {
            qid: {
                "clientId": e.client_id,
                "sinceTimestamp": e.since_ms,
                "lastAccessTimestamp": e.last_access_ms,
                "deliveredOffset": e.delivered,
                "pullsRunning": e.pulls_running,
                "refusedPulls": e.refused,
                "transfers": e.transfers,
            }
            for (g, t, qid), e in self.table.items()
            if g == group and t == topic
        }
