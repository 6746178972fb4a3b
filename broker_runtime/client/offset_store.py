"""Where a consumer keeps its consume offsets: on the brokers (clustering) or in a local file
(broadcasting): RocketMQ's RemoteBrokerOffsetStore and LocalFileOffsetStore.

Both hold the table in memory; `update` only changes memory, `persist_all` writes what
changed (every few seconds and at shutdown). The broker side goes through two callables so
that this module does no networking itself.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from enum import Enum
from pathlib import Path
from typing import Any, Protocol

from broker_runtime.client.rebalance import MessageQueue
from broker_runtime.offsets.json_file import CorruptStateError, read_with_backup, write_atomic

log = logging.getLogger(__name__)

NO_OFFSET = -1  # the group never committed an offset for the queue


def reset_offsets(body: dict[str, Any]) -> dict[MessageQueue, int]:
    """An admin's offset reset notice (ResetOffsetBody's rows) as offsets per queue; in-flight
    results of the dropped queues are not committed (MQClientInstance.resetOffset)."""
    return {
        MessageQueue(str(r["topic"]), str(r["brokerName"]), int(r["queueId"])): int(r["offset"])
        for r in body.get("offsetTable", [])
    }


def default_offsets_dir() -> Path:
    """RocketMQ's `~/.rocketmq_offsets` (rocketmq.client.localOffsetStoreDir)."""
    return Path.home() / ".rocketmq_offsets"


class ReadType(Enum):
    MEMORY = "READ_FROM_MEMORY"
    STORE = "READ_FROM_STORE"
    MEMORY_FIRST_THEN_STORE = "MEMORY_FIRST_THEN_STORE"


class OffsetTable:
    """The in-memory part: offsets per queue, and which changed since the last persist."""

    def __init__(self) -> None:
        self.offsets: dict[MessageQueue, int] = {}
        self.dirty: set[MessageQueue] = set()

    def update(self, mq: MessageQueue, offset: int, increase_only: bool = False) -> None:
        old = self.offsets.get(mq)
        if increase_only and old is not None and offset <= old:
            return
        if old != offset:
            self.offsets[mq] = offset
            self.dirty.add(mq)

    def get(self, mq: MessageQueue) -> int | None:
        return self.offsets.get(mq)

    def remove(self, mq: MessageQueue) -> None:
        self.offsets.pop(mq, None)
        self.dirty.discard(mq)


class OffsetStore(Protocol):
    table: OffsetTable

    async def load(self) -> None: ...

    async def read(self, mq: MessageQueue, how: ReadType) -> int: ...

    def update(self, mq: MessageQueue, offset: int, increase_only: bool = False) -> None: ...

    async def persist_all(self, mqs: Iterable[MessageQueue]) -> None: ...

    async def persist(self, mq: MessageQueue) -> None: ...

    def remove(self, mq: MessageQueue) -> None: ...


FetchOffset = Callable[[MessageQueue], Awaitable[int]]  # NO_OFFSET when none is stored
CommitOffset = Callable[[MessageQueue, int], Awaitable[None]]


class RemoteBrokerOffsetStore:
    """Clustering: the brokers keep the group's offsets (consumerOffset.json)."""

    def __init__(self, fetch: FetchOffset, commit: CommitOffset) -> None:
        self.table = OffsetTable()
        self._fetch = fetch
        self._commit = commit

    async def load(self) -> None:
        return None

    async def read(self, mq: MessageQueue, how: ReadType) -> int:
        if how is not ReadType.STORE:
            off = self.table.get(mq)
            if off is not None or how is ReadType.MEMORY:
                return NO_OFFSET if off is None else off
        off = await self._fetch(mq)
        if off != NO_OFFSET:
            self.table.update(mq, off)
            self.table.dirty.discard(mq)  # just read from the broker: nothing to write back
        return off

    def update(self, mq: MessageQueue, offset: int, increase_only: bool = False) -> None:
        self.table.update(mq, offset, increase_only)

    async def persist_all(self, mqs: Iterable[MessageQueue]) -> None:
        for mq in list(mqs):
            if mq in self.table.dirty:
                await self.persist(mq)

    async def persist(self, mq: MessageQueue) -> None:
        off = self.table.get(mq)
        if off is None:
            return
        try:
            await self._commit(mq, off)
        except Exception as e:  # the next round tries again; the offset stays dirty
            log.warning("commit of %s offset %d failed: %s", mq, off, e)
            return
        if self.table.get(mq) == off:
            self.table.dirty.discard(mq)

    def remove(self, mq: MessageQueue) -> None:
        self.table.remove(mq)


class LocalFileOffsetStore:
    """Broadcasting: each consumer keeps its own offsets in
    `{base_dir}/{client_key}/{group}/offsets.json` (RocketMQ's ~/.rocketmq_offsets layout)."""

    def __init__(self, base_dir: Path, client_key: str, group: str) -> None:
        self.table = OffsetTable()
        self.path = Path(base_dir) / client_key / group / "offsets.json"

    def _read_file(self) -> dict[MessageQueue, int]:
        data = read_with_backup(self.path)
        if data is None:
            return {}
        try:
            return {
                MessageQueue(str(r["topic"]), str(r["brokerName"]), int(r["queueId"])): int(
                    r["offset"]
                )
                for r in data["offsetTable"]
            }
        except (KeyError, TypeError, ValueError) as e:
            raise CorruptStateError(f"{self.path} is not an offset table: {e!r}") from e

    async def load(self) -> None:
        self.table.offsets.update(self._read_file())

    async def read(self, mq: MessageQueue, how: ReadType) -> int:
        off = self.table.get(mq)
        if how is ReadType.MEMORY or (how is ReadType.MEMORY_FIRST_THEN_STORE and off is not None):
            return NO_OFFSET if off is None else off
        stored = self._read_file().get(mq)
        if stored is None:
            return NO_OFFSET
        self.table.update(mq, stored)
        self.table.dirty.discard(mq)
        return stored

    def update(self, mq: MessageQueue, offset: int, increase_only: bool = False) -> None:
        self.table.update(mq, offset, increase_only)

    async def persist_all(self, mqs: Iterable[MessageQueue]) -> None:
        if not self.table.dirty:
            return
        rows = [
            {"topic": mq.topic, "brokerName": mq.broker, "queueId": mq.queue_id, "offset": off}
            for mq, off in sorted(self.table.offsets.items())
        ]
        write_atomic(self.path, {"offsetTable": rows})
        self.table.dirty.clear()

    async def persist(self, mq: MessageQueue) -> None:
        await self.persist_all([mq])

    def remove(self, mq: MessageQueue) -> None:
        # A broadcasting consumer keeps every queue's offset: the file outlives assignments.
        return None
