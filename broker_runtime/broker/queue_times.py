"""Store timestamps of queue positions, and the queue offset for a point in time."""

from __future__ import annotations

import struct

from broker_runtime.store.message_store import MessageStore

BLANK_SIZE = 0x7FFFFFFF
_STORE_TS_POS = 56  # STORETIMESTAMP's byte position in a message unit
_I64 = struct.Struct(">q")


def store_time_at(store: MessageStore, topic: str, queue_id: int, queue_offset: int) -> int:
    """STORETIMESTAMP of the message at `queue_offset`; 0 if there is none (or it expired)."""
    if queue_offset < 0:
        return 0
    e = store.consume_queue(topic, queue_id).get(queue_offset)
    if e is None or e.size == BLANK_SIZE:
        return 0
    raw = store.commit_log.read(e.phys_offset + _STORE_TS_POS, 8)
    return _I64.unpack(raw)[0] if raw is not None else 0


def offset_by_time(store: MessageStore, topic: str, queue_id: int, timestamp_ms: int) -> int:
    """The first queue offset stored at or after `timestamp_ms` (the max offset if none)."""
    cq = store.consume_queue(topic, queue_id)
    lo, hi = cq.min_queue_offset, cq.max_offset
    while lo < hi:  # store times never decrease along a queue
        mid = (lo + hi) // 2
        t = store_time_at(store, topic, queue_id, mid)
        if 0 < t < timestamp_ms:
            lo = mid + 1
        else:
            hi = mid
    return lo
