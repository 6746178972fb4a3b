"""The store facade, the only way brokers reach the store: put, read a queue, read a message
by offset, id, key or time, recover, shut down. Brokers never read store bytes themselves."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from broker_runtime.common.clock import Clock, SystemClock
from broker_runtime.common.config import FlushMode, StoreConfig
from broker_runtime.common.delay import DelayLevels
from broker_runtime.common.message import (
    KEY_SEPARATOR,
    Message,
    StoredMessage,
    decode_offset_msg_id,
    encode_host,
)
from broker_runtime.common.topics import validate_topic
from broker_runtime.offsets.json_file import read_with_backup, write_atomic
from broker_runtime.store import record_codec as codec
from broker_runtime.store.checkpoint import Checkpoint
from broker_runtime.store.cleanup import CleanupPolicy, CleanupReport
from broker_runtime.store.commit_log import CommitLog, PutResult
from broker_runtime.store.consume_queue import ConsumeQueue, CqEntry
from broker_runtime.store.dispatcher import Dispatcher
from broker_runtime.store.flush_service import GroupCommitService, PeriodicService
from broker_runtime.store.index_service import IndexService
from broker_runtime.store.recovery import RecoveryReport, recover

log = logging.getLogger(__name__)
_QUEUE_DIR = re.compile(r"\d+")


class StoreUnavailable(RuntimeError):
    """The store refuses writes (disk past the danger ratio, or a failed flush)."""


class FlushTimeout(RuntimeError):
    """SYNC_FLUSH: the message is in the log but was not on disk within the timeout."""


@dataclass(frozen=True, slots=True)
class GetResult:
    messages: list[StoredMessage]
    next_offset: int
    min_offset: int
    max_offset: int


class MessageStore:
    def __init__(
        self,
        config: StoreConfig,
        clock: Clock | None = None,
        disk_ratio: Callable[[Path], float] | None = None,
    ) -> None:
        self.config = config
        self.clock = clock or SystemClock()
        self.root = Path(config.store_dir)
        self.root.mkdir(parents=True, exist_ok=True)
        check_layout(self.root, config)
        self.cq_root = self.root / "consumequeue"
        self.abort_file = self.root / "abort"
        self.checkpoint_file = self.root / "checkpoint"
        self._queues: dict[tuple[str, int], ConsumeQueue] = {}
        self._queues_lock = threading.Lock()  # the dispatcher thread and pulls both open queues
        self._load_consume_queues()
        self.index = (
            IndexService(
                self.root,
                hash_slot_num=config.index_hash_slots,
                index_num=config.index_max_entries,
            )
            if config.build_index
            else None
        )
        self.dispatcher = Dispatcher(
            self.consume_queue, self.index, schedule_tags_code(config.delay_levels())
        )
        self.commit_log = CommitLog(
            self.root / "commitlog",
            config.segment_size,
            self.clock,
            encode_host(config.store_host),
            self.dispatcher.submit,
        )
        self.cleanup = CleanupPolicy(config, self.clock, disk_ratio)
        self.recovery: RecoveryReport = recover(self)
        self.abort_file.touch()  # removed again by a clean shutdown
        self.dispatcher.start()
        self._group_commit = (
            GroupCommitService(self.commit_log.segments.flush)
            if config.flush is FlushMode.SYNC
            else None
        )
        tasks: list[tuple[float, Callable[[], object]]] = [
            (config.cq_flush_interval_ms / 1000, self.flush_logics),
            (config.cleanup_interval_ms / 1000, self.run_cleanup),
        ]
        if config.flush is FlushMode.ASYNC:
            tasks.insert(0, (config.flush_interval_ms / 1000, self.commit_log.segments.flush))
        self._services = PeriodicService(tasks, "store-services")
        self._closed = False

    # -- ConsumeQueues ---------------------------------------------------------------------

    def _load_consume_queues(self) -> None:
        if not self.cq_root.is_dir():
            return
        for topic_dir in sorted(p for p in self.cq_root.iterdir() if p.is_dir()):
            for qdir in sorted(topic_dir.iterdir()):
                if qdir.is_dir() and _QUEUE_DIR.fullmatch(qdir.name):
                    self.consume_queue(topic_dir.name, int(qdir.name))

    def consume_queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        """The queue's one ConsumeQueue, opened on first use (findConsumeQueue's putIfAbsent).

        Two objects for one directory would each start the queue's files: a pull opening a
        new queue while the dispatcher writes its first entry left the second object
        overwriting that entry with a blank and starting the queue at offset 1.
        """
        key = (topic, queue_id)
        cq = self._queues.get(key)
        if cq is None:
            with self._queues_lock:
                cq = self._queues.get(key)
                if cq is None:
                    cq = ConsumeQueue(
                        self.cq_root, topic, queue_id, self.config.cq_entries_per_file
                    )
                    self._queues[key] = cq
        return cq

    def queues(self) -> dict[tuple[str, int], ConsumeQueue]:
        return dict(self._queues)

    # -- writes ----------------------------------------------------------------------------

    def put_message(self, msg: Message) -> PutResult:
        return self.put_messages([msg])[0]

    def put_messages(self, msgs: Sequence[Message]) -> list[PutResult]:
        """Store messages in order; raises MessageRejected for a bad one (nothing is stored)."""
        if self.cleanup.disk_full:
            raise StoreUnavailable(
                f"disk use is past the danger ratio {self.config.disk_danger_ratio}; "
                "writes are refused until cleanup frees space"
            )
        limit = self.config.max_message_size
        prepared = codec.prepare_batch(msgs, limit)
        gc = self._group_commit
        if gc is None:
            return self.commit_log.put(prepared)
        gc.begin()
        try:
            results = self.commit_log.put(prepared)
        except BaseException:
            gc.abandon()
            raise
        end = results[-1].phys_offset + results[-1].size if results else 0
        if not gc.wait_flushed(end):
            raise FlushTimeout(f"the log was not flushed up to {end} in time")
        return results

    # -- reads -----------------------------------------------------------------------------

    def get_messages(self, topic: str, queue_id: int, offset: int, max_count: int) -> GetResult:
        """Up to `max_count` messages of a queue from `offset` (what a pull returns)."""
        cq = self._queues.get((validate_topic(topic), queue_id))
        if cq is None:
            return GetResult([], offset, 0, 0)
        out: list[StoredMessage] = []
        next_offset = max(offset, cq.min_queue_offset)
        for e in cq.entries(next_offset, max_count):
            next_offset = e.queue_offset + 1
            if e.blank:
                continue
            raw = self.commit_log.read(e.phys_offset, e.size)
            if raw is not None:  # None: the log file expired under the entry
                out.append(codec.decode(raw))
        return GetResult(out, next_offset, cq.min_queue_offset, cq.max_offset)

    def max_offset(self, topic: str, queue_id: int) -> int:
        cq = self._queues.get((topic, queue_id))
        return cq.max_offset if cq else 0

    def min_offset(self, topic: str, queue_id: int) -> int:
        cq = self._queues.get((topic, queue_id))
        return cq.min_queue_offset if cq else 0

    def queue_entries(self, topic: str, queue_id: int, offset: int, count: int) -> list[CqEntry]:
        """Up to `count` ConsumeQueue entries of a queue from `offset`, blank ones included."""
        return self.consume_queue(topic, queue_id).entries(offset, count)

    def unit_at(self, phys_offset: int, size: int) -> bytes | None:
        """The stored bytes of the message a queue entry points at (None once expired)."""
        return self.commit_log.read(phys_offset, size)

    @property
    def log_min_offset(self) -> int:
        return self.commit_log.min_offset

    @property
    def log_max_offset(self) -> int:
        return self.commit_log.max_offset

    def store_time_at(self, topic: str, queue_id: int, queue_offset: int) -> int:
        """STORETIMESTAMP of the message at `queue_offset`; 0 if there is none (or it expired)."""
        if queue_offset < 0:
            return 0
        e = self.consume_queue(topic, queue_id).get(queue_offset)
        if e is None or e.blank:
            return 0
        raw = self.commit_log.read(e.phys_offset + codec.STORE_TIMESTAMP_AT, 8)
        return int.from_bytes(raw, "big", signed=True) if raw is not None else 0

    def offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first queue offset stored at or after `timestamp_ms` (the max offset if none)."""
        cq = self.consume_queue(topic, queue_id)
        lo, hi = cq.min_queue_offset, cq.max_offset
        while lo < hi:  # store times never decrease along a queue
            mid = (lo + hi) // 2
            t = self.store_time_at(topic, queue_id, mid)
            if 0 < t < timestamp_ms:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def message_at(self, phys_offset: int) -> StoredMessage | None:
        """The message whose unit starts at `phys_offset`, CRC checked."""
        head = self.commit_log.read(phys_offset, 4)
        if head is None:
            return None
        size = int.from_bytes(head, "big", signed=True)
        raw = self.commit_log.read(phys_offset, size) if size > 0 else None
        if raw is None:
            return None
        try:
            if codec.check_unit(raw, 0, len(raw)) < 0:
                return None  # the blank unit closing a segment
        except codec.RecordError:
            return None
        return codec.decode(raw)

    def message_by_id(self, msg_id: str) -> StoredMessage | None:
        """Look a message up by its offset message id."""
        _, phys = decode_offset_msg_id(msg_id)
        return self.message_at(phys)

    def query_by_key(
        self, topic: str, key: str, max_count: int = 32, begin_ms: int = 0, end_ms: int = 2**62
    ) -> list[StoredMessage]:
        """Messages of `topic` whose UNIQ_KEY or one of whose KEYS is `key`, newest first."""
        if self.index is None:
            return []
        found = []
        for phys in self.index.query(validate_topic(topic), key, max_count * 4, begin_ms, end_ms):
            m = self.message_at(phys)
            if m is None or m.topic != topic:
                continue  # a hash collision, or the log file expired
            if m.uniq_key == key or key in (m.keys or "").split(KEY_SEPARATOR):
                found.append(m)
                if len(found) >= max_count:
                    break
        return found

    def read_log(self, offset: int, max_bytes: int) -> bytes | None:
        """Up to `max_bytes` raw CommitLog bytes from `offset`, never past the end of its file
        (what a master replicates); None when nothing is written there."""
        f = self.commit_log.segments.find(offset)
        if f is None:
            return None
        rel = offset - f.file_from_offset
        n = min(max_bytes, f.wrote_position - rel)
        if n <= 0:
            return None
        try:
            return bytes(f.view[rel : rel + n])
        except ValueError:  # cleanup closed the file after we found it
            return None

    def wait_dispatched(self, timeout: float | None = 30.0) -> bool:
        return self.dispatcher.wait_idle(timeout)

    # -- background work -------------------------------------------------------------------

    def flush_logics(self) -> None:
        """Flush ConsumeQueues and index, then record in the checkpoint how far they are safe."""
        dispatched, ts = self.dispatcher.dispatched_offset, self.dispatcher.dispatched_timestamp
        for cq in list(self._queues.values()):
            cq.flush()
        if self.index is not None:
            self.index.flush()
        flushed = self.commit_log.segments.flushed_offset
        cp = Checkpoint(ts, ts, ts, flushed, dispatched)
        cp.save(self.checkpoint_file)

    def run_cleanup(self, force: bool = False) -> CleanupReport:
        """Delete expired files if it is time to (or `force`); see CleanupPolicy."""
        return self.cleanup.run(self, force=force)

    @property
    def group_commit_stats(self) -> tuple[int, int]:
        """(sync puts, fsyncs) so far under SYNC_FLUSH."""
        gc = self._group_commit
        return (gc.puts, gc.fsyncs) if gc else (0, 0)

    def shutdown(self) -> None:
        """Clean stop: flush everything, write the checkpoint, remove the abort marker."""
        if self._closed:
            return
        self._closed = True
        self._services.stop()
        self.dispatcher.stop()
        if self._group_commit is not None:
            self._group_commit.stop()
        self.commit_log.segments.flush()
        self.flush_logics()
        self.commit_log.close()
        for cq in self._queues.values():
            cq.close()
        if self.index is not None:
            self.index.close()
        self.abort_file.unlink(missing_ok=True)

    def __enter__(self) -> MessageStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def schedule_tags_code(levels: DelayLevels) -> Callable[[int, int], int]:
    """Tag code of a SCHEDULE_TOPIC_XXXX entry: when it is due (queue id = level - 1).

    RocketMQ reads the level from the DELAY property; the rewrite puts level n in queue
    n - 1, so the queue id says the same without parsing properties on the hot path. A
    queue past the table counts as the last level, as a DELAY past it does.
    """

    def tags(queue_id: int, store_timestamp: int) -> int:
        return levels.deliver_at(min(queue_id + 1, levels.max_level), store_timestamp)

    return tags


LAYOUT_FILE = Path("config") / "storeLayout.json"
_LAYOUT_KEYS = ("segment_size", "cq_entries_per_file", "index_hash_slots", "index_max_entries")


def read_layout(root: Path) -> dict[str, int] | None:
    """The file sizes a store was created with (so tools can open it without flags)."""
    data = read_with_backup(root / LAYOUT_FILE)
    return {k: int(data[k]) for k in _LAYOUT_KEYS} if data else None


def check_layout(root: Path, config: StoreConfig) -> None:
    """Record the file sizes of a new store; refuse to open an existing one with others."""
    want = {k: int(getattr(config, k)) for k in _LAYOUT_KEYS}
    have = read_layout(root)
    if have is None:
        write_atomic(root / LAYOUT_FILE, want)
    elif have != want:
        diff = {k: (have[k], want[k]) for k in _LAYOUT_KEYS if have[k] != want[k]}
        raise ValueError(f"{root} was created with other file sizes (stored, given): {diff}")
