"""The queue access lock as one pull meets it (DeFiPullMessageProcessor's part of a pull).

Only on a master with `queue_access_lock` on, and only for a client that heartbeats in a
CLUSTERING group: the pull's client is the header's clientId if that client is a member,
else the member on the pull's connection. Anything else pulls as without the lock.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from broker_runtime.broker.queue_access import Access, QueueAccessLocks, QueueKey
from broker_runtime.remoting.connection import Connection
from broker_runtime.remoting.headers import PullMessageRequestHeader

if TYPE_CHECKING:
    from broker_runtime.broker.controller import BrokerController

RECHECK_S = 0.1  # a held-back pull that may wait looks again this often
HELD_BACK_MAX_S = 1.0  # ... for at most this long, then answers (the client pulls again)


class PullGate:
    def __init__(
        self, ctl: BrokerController, locks: QueueAccessLocks, key: QueueKey, client_id: str
    ) -> None:
        self.ctl = ctl
        self.locks = locks
        self.key = key
        self.client_id = client_id

    def committed(self) -> int:
        group, topic, qid = self.key
        return self.ctl.offsets.query(topic, group, qid)

    def check(self) -> Access:
        group = self.key[0]
        entry = self.locks.table.get(self.key)
        info = self.ctl.consumers.groups.get(group)
        alive = entry is None or (info is not None and entry.client_id in info.channels)
        return self.locks.check(
            self.key, self.client_id, self.ctl.clock.now_ms(), self.committed(), alive
        )

    async def admit(self, wait_s: float) -> Access:
        """Check, and while held back look again for up to `wait_s` (capped)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(wait_s, HELD_BACK_MAX_S)
        access = self.check()
        while not access.allowed and (left := deadline - loop.time()) > 0:
            await asyncio.sleep(min(left, RECHECK_S))
            access = self.check()
        if not access.allowed:
            self.locks.refuse(self.key)
        return access

    def holds(self) -> bool:
        return self.locks.holds(self.key, self.client_id)

    def started(self) -> None:
        self.locks.pull_started(self.key, self.client_id, self.ctl.clock.now_ms())

    def ended(self, delivered: int | None) -> None:
        self.locks.pull_ended(self.key, self.client_id, self.ctl.clock.now_ms(), delivered)


def pull_gate(
    ctl: BrokerController, h: PullMessageRequestHeader, conn: Connection
) -> PullGate | None:
    """The access lock this pull must pass, or None when none applies."""
    locks = ctl.access
    if locks is None or not ctl.is_master:
        return None
    info = ctl.consumers.groups.get(h.consumer_group)
    if info is None or info.message_model != "CLUSTERING":
        return None
    client = h.client_id if h.client_id in info.channels else None
    if client is None:
        client = next((cid for cid, ch in info.channels.items() if ch.conn is conn), None)
    if client is None:
        return None
    return PullGate(ctl, locks, (h.consumer_group, h.topic, h.queue_id), client)
