"""A consumer's in-flight messages of one queue (RocketMQ's ProcessQueue).

Messages enter in pull order and leave when consumed, in any order. The offset a consumer
may commit is the lowest offset still in flight, or one past the highest pulled when none is:
a crash then redelivers from the oldest unfinished message, so messages
after it that were already processed are delivered again. Loop-thread only: no locks.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from typing import Protocol


class _Offsetted(Protocol):
    @property
    def queue_offset(self) -> int: ...

    @property
    def body(self) -> bytes: ...


class ProcessQueue:
    def __init__(self, now_ms: int = 0) -> None:
        self._msgs: dict[int, _Offsetted] = {}
        self._heap: list[int] = []  # offsets, lazily purged of consumed ones
        self.max_offset = -1  # highest offset ever put (queueOffsetMax)
        self.msg_size = 0
        self.dropped = False
        self.last_pull_ms = now_ms
        self.last_consume_ms = now_ms

    def __len__(self) -> int:
        return len(self._msgs)

    def __contains__(self, offset: int) -> bool:
        return offset in self._msgs

    def put(self, msgs: Iterable[_Offsetted]) -> int:
        """Add pulled messages; returns how many were new (a re-pulled offset is ignored)."""
        added = 0
        for m in msgs:
            off = m.queue_offset
            if off in self._msgs:
                continue
            self._msgs[off] = m
            heapq.heappush(self._heap, off)
            self.msg_size += len(m.body)
            self.max_offset = max(self.max_offset, off)
            added += 1
        return added

    def pulled_to(self, next_offset: int) -> None:
        """Everything below `next_offset` was pulled: in flight now, or filtered out by tag.

        With nothing in flight the commit offset is then `next_offset`, so messages the tag
        filter skipped after the last delivered one do not show as lag.
        """
        self.max_offset = max(self.max_offset, next_offset - 1)

    def first_offset(self) -> int | None:
        heap = self._heap
        while heap and heap[0] not in self._msgs:
            heapq.heappop(heap)
        return heap[0] if heap else None

    def remove(self, offsets: Iterable[int], now_ms: int = 0) -> int:
        """Mark `offsets` consumed; return the offset to commit, -1 if nothing was in flight.

        That is the lowest offset still in flight, or `max_offset + 1` when none is.
        """
        self.last_consume_ms = now_ms
        if not self._msgs:
            return -1
        for off in offsets:
            m = self._msgs.pop(off, None)
            if m is not None:
                self.msg_size -= len(m.body)
        first = self.first_offset()
        return self.max_offset + 1 if first is None else first

    def max_span(self) -> int:
        """Distance between the oldest and newest in-flight offsets (flow control)."""
        first = self.first_offset()
        return 0 if first is None else self.max_offset - first

    def messages(self) -> list[_Offsetted]:
        """In-flight messages, lowest offset first."""
        return [self._msgs[o] for o in sorted(self._msgs)]

    def clear(self) -> None:
        self._msgs.clear()
        self._heap.clear()
        self.msg_size = 0
