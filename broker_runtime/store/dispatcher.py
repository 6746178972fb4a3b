"""The reput service: builds ConsumeQueue and index entries from what reached the CommitLog.

Runs in its own thread, a batch at a time, so the write path only hands requests over.
`apply` is also what recovery calls with requests read back from the log, so a rebuild
and a live dispatch go through the same code.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence

from broker_runtime.common.topics import SCHEDULE_TOPIC
from broker_runtime.store.accel import native
from broker_runtime.store.consume_queue import ConsumeQueue
from broker_runtime.store.index_service import IndexService
from broker_runtime.store.record_codec import DispatchRequest

log = logging.getLogger(__name__)
BATCH = 1024
GATHER_S = 0.001
# (queue id, store timestamp) -> the tag code of a SCHEDULE_TOPIC_XXXX entry (delivery time)
ScheduleTags = Callable[[int, int], int]


ByQueue = Mapping[tuple[str, int], Sequence[DispatchRequest]]
IndexRow = tuple[str, int, int, str | None, str | None]


def _split_requests(
    requests: Sequence[DispatchRequest],
) -> tuple[ByQueue, Sequence[IndexRow]]:
    """The requests of each (topic, queue id), and the index rows of those with keys.

    Index rows are (topic, log offset, store time, UNIQ_KEY, KEYS). The C kernel returns
    read-only sequences over the requests instead of lists (no list or tuple per message),
    which its pack_entries and index_keys kernels read directly.
    """
    by_queue: dict[tuple[str, int], list[DispatchRequest]] = {}
    index_rows: list[IndexRow] = []
    for r in requests:
        rows = by_queue.get((r.topic, r.queue_id))
        if rows is None:
            rows = by_queue[(r.topic, r.queue_id)] = []
        rows.append(r)
        if r.uniq_key is not None or r.keys is not None:
            index_rows.append((r.topic, r.phys_offset, r.store_timestamp, r.uniq_key, r.keys))
    return by_queue, index_rows


split_requests = _split_requests if native is None else native.split_requests


class Dispatcher:
    def __init__(
        self,
        consume_queue: Callable[[str, int], ConsumeQueue],
        index: IndexService | None,
        schedule_tags: ScheduleTags | None = None,
    ) -> None:
        self._consume_queue = consume_queue
        self._index = index
        self._schedule_tags = schedule_tags
        self._pending: list[DispatchRequest] = []
        self._cond = threading.Condition()
        self._busy = False
        self._running = False
        self._thread: threading.Thread | None = None
        self.dispatched_offset = 0  # end of the last dispatched message
        self.dispatched_timestamp = 0
        self.error: BaseException | None = None
        # Told of each batch the thread dispatched (a broker wakes long-polling pulls with it).
        self.listeners: list[Callable[[list[DispatchRequest]], None]] = []

    def apply(self, requests: Sequence[DispatchRequest]) -> int:
        """Write the entries of `requests` (in log order); returns how many were applied."""
        if not requests:
            return 0
        by_queue, index_rows = split_requests(requests)
        for (topic, queue_id), rows in by_queue.items():
            if topic == SCHEDULE_TOPIC and self._schedule_tags is not None:
                rows = self._schedule_rows(rows, self._schedule_tags)
            self._consume_queue(topic, queue_id).put(rows)
        if self._index is not None and index_rows:
            self._index.build(index_rows)
        last = requests[-1]
        self.dispatched_offset = last.phys_offset + last.size
        self.dispatched_timestamp = last.store_timestamp
        return len(requests)

    @staticmethod
    def _schedule_rows(
        requests: Sequence[DispatchRequest], tags: ScheduleTags
    ) -> list[DispatchRequest]:
        """A delay level's requests with the delivery time as tag code (CommitLog's tagsCode)."""
        return [r._replace(tags_code=tags(r.queue_id, r.store_timestamp)) for r in requests]

    # -- the background thread ------------------------------------------------------------

    def submit(self, requests: list[DispatchRequest]) -> None:
        with self._cond:
            was_empty = not self._pending
            self._pending.extend(requests)
            if was_empty or len(self._pending) >= BATCH:  # no wake-up per put: see _run
                self._cond.notify_all()

    def start(self) -> None:
        self._running = True
        self._thread = threading.Thread(target=self._run, name="reput", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and self._running:
                    self._cond.wait()
                if not self._pending and not self._running:
                    return
                if len(self._pending) < BATCH and self._running:
                    # Let a batch gather (RocketMQ's reput loop sleeps 1 ms too): waking this
                    # thread for every single put costs more than the put itself.
                    self._cond.wait(GATHER_S)
                batch, self._pending = self._pending, []
                self._busy = True
            try:
                self.apply(batch)
            except Exception as e:  # the log keeps the data; recovery re-dispatches it
                log.exception("dispatch failed; ConsumeQueue/index stop here until restart")
                self.error = e
            else:
                self._tell_listeners(batch)
            with self._cond:
                self._busy = False
                self._cond.notify_all()
                if self.error is not None:
                    self._running = False
                    return

    def _tell_listeners(self, batch: list[DispatchRequest]) -> None:
        for listener in self.listeners:
            try:
                listener(batch)
            except Exception:
                log.exception("dispatch listener failed")

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until everything submitted so far is dispatched; False on timeout."""
        with self._cond:
            return self._cond.wait_for(
                lambda: (not self._pending and not self._busy) or self.error is not None, timeout
            )

    def stop(self) -> None:
        with self._cond:
            self._running = False
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
