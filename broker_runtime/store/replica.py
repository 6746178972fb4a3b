"""A slave appends its master's raw CommitLog bytes (MessageStore.read_log on the master).

A slave's log is a byte copy of its master's: the same units at the same offsets (blank
units closing segments included). The slave indexes what it receives through its own
dispatcher, a complete unit at a time; a unit cut by a transfer boundary waits for the rest.
"""

from __future__ import annotations

from broker_runtime.store import record_codec as codec
from broker_runtime.store.commit_log import ScanStop
from broker_runtime.store.message_store import MessageStore


class ReplicaError(ValueError):
    """Bytes from the master that cannot be appended here (wrong offset, or not units)."""


class ReplicaWriter:
    """Appends the master's bytes to a slave's log and dispatches the complete units."""

    def __init__(self, store: MessageStore) -> None:
        self.store = store
        # Recovery leaves the log ending on a unit boundary: everything before is indexed.
        self.dispatched_to = store.commit_log.max_offset

    @property
    def max_offset(self) -> int:
        return self.store.commit_log.max_offset

    def append(self, phys_offset: int, data: bytes) -> int:
        """Write `data` at `phys_offset` (the log's end); returns the new end of the log."""
        log = self.store.commit_log
        segs = log.segments
        with log.lock:
            end = log.max_offset
            if segs.files and phys_offset != end:
                raise ReplicaError(f"the log here ends at {end}, the master sent {phys_offset}")
            if not segs.files and phys_offset % segs.file_size:
                raise ReplicaError(f"an empty log cannot start at {phys_offset} (mid-segment)")
            if not segs.files:
                self.dispatched_to = phys_offset
            view = memoryview(data)
            while view:
                f = segs.last_file(phys_offset)
                n = min(len(view), f.remaining())
                f.append(view[:n])
                view = view[n:]
            try:
                self._dispatch()
            except ReplicaError:
                log._undo(self.dispatched_to)  # keep only what was checked and indexed
                raise
            return log.max_offset

    def _dispatch(self) -> None:
        log = self.store.commit_log
        stop = ScanStop(self.dispatched_to, "eof", "")
        requests = [
            codec.dispatch_request(view, pos, phys)
            for phys, view, pos in log.scan(self.dispatched_to, check_crc=True, stop=stop)
        ]
        if stop.reason not in ("eof", "torn") and not self._partial_blank(stop.offset):
            raise ReplicaError(f"the master's bytes are not message units: {stop.detail}")
        self.dispatched_to = stop.offset
        if requests:
            qtable = log.queue_offsets
            for r in requests:
                qtable[(r.topic, r.queue_id)] = r.queue_offset + 1
            self.store.dispatcher.submit(requests)

    def _partial_blank(self, offset: int) -> bool:
        """A segment's closing blank unit of which only the first part has arrived."""
        head = self.store.commit_log.read(offset, codec.END_FILE_MIN_BLANK_LENGTH)
        if head is None:
            return False
        total = int.from_bytes(head[:4], "big", signed=True)
        magic = int.from_bytes(head[4:], "big", signed=True)
        room = (
            self.store.commit_log.segments.file_size
            - offset % self.store.commit_log.segments.file_size
        )
        return magic == codec.BLANK_MAGIC and total == room

    def flush(self) -> int:
        """fdatasync what was appended (a SYNC_FLUSH slave does before it acknowledges)."""
        return self.store.commit_log.segments.flush()
