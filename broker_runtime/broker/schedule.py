"""Delayed delivery (RocketMQ's ScheduleMessageService): due messages back to their topics.

A message put with DELAY=n sits in SCHEDULE_TOPIC_XXXX queue n-1, its ConsumeQueue tag code
being the time it is due. Each level's queue is in store order, and so in due order: the
service walks it from the level's offset, puts every due message back under REAL_TOPIC /
REAL_QID (`delay.from_schedule`: a fresh store timestamp, the same UNIQ_KEY), and moves the
offset on. The offsets go to `config/delayOffset.json` every persist interval and at stop.

Delivery is at least once: a message put back after the last persisted offset is put back
again after a crash (the offset file lags the log by up to one interval), and one whose put
was interrupted by a stop may be too. Only a master runs this; its slave receives both the
scheduled and the delivered copies through replication.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from broker_runtime.common.clock import Clock
from broker_runtime.common.delay import (
    DelayLevelError,
    DelayLevels,
    from_schedule,
    queue_id_of_level,
)
from broker_runtime.common.message import Message
from broker_runtime.common.topics import SCHEDULE_TOPIC
from broker_runtime.offsets.delay_offsets import read_delay_offsets, write_delay_offsets
from broker_runtime.store.message_store import FlushTimeout, MessageStore, StoreUnavailable
from broker_runtime.store.record_codec import MessageRejected

log = logging.getLogger(__name__)

IDLE_MS = 100  # DELAY_FOR_A_WHILE: nothing due, look again this soon for new arrivals
RETRY_MS = 10_000  # DELAY_FOR_A_PERIOD: a put that failed is tried again after this
BATCH = 256  # due messages put back in one store call (one fsync under SYNC_FLUSH)

Put = Callable[[list[Message]], Awaitable[object]]


@dataclass(slots=True)
class Due:
    """What one level has due now: the messages, and the offset past the last one taken."""

    level: int
    next_offset: int
    messages: list[tuple[int, Message]] = field(default_factory=list)  # (queue offset, msg)
    next_due_at: int | None = None  # when the first entry not taken is due (None: no entry)
    full: bool = False  # the batch limit stopped the scan: more may be due already
    skipped: int = 0  # entries that cannot be delivered (expired log file, not scheduled)


class ScheduleService:
    """The level offsets and the scan; `run` is the master's delivery loop."""

    def __init__(
        self, store: MessageStore, levels: DelayLevels, clock: Clock, store_dir: Path
    ) -> None:
        self.store = store
        self.levels = levels
        self.clock = clock
        self.store_dir = Path(store_dir)
        loaded = read_delay_offsets(self.store_dir)
        self.offsets: dict[int, int] = {
            level: self._corrected(level, loaded.get(level, 0))
            for level in range(1, levels.max_level + 1)
        }
        self._persisted: dict[int, int] = dict(loaded)
        self._retry_at: dict[int, int] = {}  # level -> when a failed put is tried again
        self._persist_lock = threading.Lock()
        self.delivered = 0
        self.skipped = 0

    def _corrected(self, level: int, offset: int) -> int:
        """The offset inside the level queue's range (correctDelayOffset).

        Below it: the files expired. Above it: the log was cut back after a crash (or the
        store replaced), and new messages of the level will be numbered from its end.
        """
        qid = queue_id_of_level(level)
        lo = self.store.min_offset(SCHEDULE_TOPIC, qid)
        hi = self.store.max_offset(SCHEDULE_TOPIC, qid)
        fixed = min(max(offset, lo), hi)
        if fixed != offset:
            log.warning("delay level %d: offset %d outside %d..%d, now %d", level, offset, lo,
                        hi, fixed)  # fmt: skip
        return fixed

    def due(self, level: int, now: int, limit: int = BATCH) -> Due:
        """The messages of `level` due at `now`, at most `limit`, from the level's offset."""
        qid = queue_id_of_level(level)
        offset = self.offsets[level]
        hi = self.store.max_offset(SCHEDULE_TOPIC, qid)
        if offset >= hi or offset < self.store.min_offset(SCHEDULE_TOPIC, qid):
            offset = self.offsets[level] = self._corrected(level, offset)
        out = Due(level, offset)
        if hi <= offset:
            return out
        for e in self.store.queue_entries(SCHEDULE_TOPIC, qid, offset, limit):
            if e.blank:
                out.next_offset = e.queue_offset + 1
                continue
            due_at = self.levels.correct_deliver_at(level, e.tags_code, now)
            if due_at > now:
                out.next_due_at = due_at
                return out
            msg = self._message(level, e.queue_offset, e.phys_offset)
            if msg is None:
                out.skipped += 1
            else:
                out.messages.append((e.queue_offset, msg))
            out.next_offset = e.queue_offset + 1
        out.full = out.next_offset - offset >= limit
        return out

    def _message(self, level: int, queue_offset: int, phys_offset: int) -> Message | None:
        stored = self.store.message_at(phys_offset)
        if stored is None:
            log.error(
                "delay level %d offset %d: no message at log offset %d (expired?); skipped",
                level, queue_offset, phys_offset,
            )  # fmt: skip
            return None
        try:
            return from_schedule(stored)
        except DelayLevelError as e:
            log.error("delay level %d offset %d: %s; skipped", level, queue_offset, e)
            return None

    def advance(self, level: int, offset: int) -> None:
        self.offsets[level] = max(self.offsets[level], offset)

    def table(self) -> dict[int, int]:
        """Level -> next offset, for delayOffset.json and GET_ALL_DELAY_OFFSET."""
        return dict(self.offsets)

    def persist(self) -> bool:
        """Write delayOffset.json if an offset moved since the last write; True if written.

        Thread safe: the loop writes from an executor, a stop may write at the same time.
        """
        with self._persist_lock:
            table = self.table()
            if table == self._persisted:
                return False
            write_delay_offsets(self.store_dir, table)
            self._persisted = table
            return True

    # -- the delivery loop -----------------------------------------------------------------

    async def run(self, put: Put, persist_every_ms: int) -> None:
        """Deliver due messages forever (until cancelled) through `put`."""
        loop = asyncio.get_running_loop()
        next_persist = time.monotonic() + persist_every_ms / 1000
        while True:
            now = self.clock.now_ms()
            wake = now + IDLE_MS
            for level in self.offsets:
                retry_at = self._retry_at.get(level)
                if retry_at is not None and retry_at > now:
                    wake = min(wake, retry_at)
                    continue
                due = self.due(level, now)
                stopped_at = await self._put(put, due) if due.messages else None
                if stopped_at is not None:
                    self.advance(level, stopped_at)
                    self._retry_at[level] = now + RETRY_MS
                    continue
                self._retry_at.pop(level, None)
                self.advance(level, due.next_offset)
                self.skipped += due.skipped
                if due.full:
                    wake = now
                elif due.next_due_at is not None:
                    wake = min(wake, due.next_due_at)
            if time.monotonic() >= next_persist:
                next_persist = time.monotonic() + persist_every_ms / 1000
                try:
                    await loop.run_in_executor(None, self.persist)
                except OSError as e:
                    log.error("writing delayOffset.json failed: %s", e)
            await asyncio.sleep(max(0, wake - self.clock.now_ms()) / 1000)

    async def _put(self, put: Put, due: Due) -> int | None:
        """Put a level's due messages back; the offset to resume from if the store refused.

        A FlushTimeout counts as delivered: the message is in the log, only not yet on disk.
        """
        try:
            await put([m for _, m in due.messages])
            self.delivered += len(due.messages)
            return None
        except MessageRejected:
            pass  # one bad message must not hold up the level: put them one by one
        except FlushTimeout as e:
            log.warning("delay level %d: put back not flushed in time: %s", due.level, e)
            self.delivered += len(due.messages)
            return None
        except (StoreUnavailable, OSError) as e:
            log.warning("delay level %d: put back failed (%s); again in %d ms", due.level, e,
                        RETRY_MS)  # fmt: skip
            return due.messages[0][0]
        for queue_offset, msg in due.messages:
            try:
                await put([msg])
            except MessageRejected as e:
                self.skipped += 1
                log.error(
                    "delay level %d offset %d: message %s for %s refused by the store (%s); "
                    "skipped", due.level, queue_offset, msg.uniq_key, msg.topic, e,
                )  # fmt: skip
                continue
            except FlushTimeout as e:
                log.warning("delay level %d: put back not flushed in time: %s", due.level, e)
            except (StoreUnavailable, OSError) as e:
                log.warning("delay level %d: put back failed (%s)", due.level, e)
                return queue_offset
            self.delivered += 1
        return None
