"""What a pull reads from the store: RocketMQ's DefaultMessageStore.getMessage.

Statuses and the next offset to pull from follow RocketMQ, including its offset correction
rule: a master tells a consumer with an impossible offset where to go, a slave (which may
just be behind) leaves the offset as it was.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from broker_runtime.broker.damaged_units import DamagedUnit, DamagedUnits, unit_damage
from broker_runtime.broker.message_filter import Subscription
from broker_runtime.store import record_codec as codec
from broker_runtime.store.consume_queue import CqEntry
from broker_runtime.store.message_store import MessageStore

FILTER_SCAN_LIMIT = 4096  # ConsumeQueue entries one filtered pull looks at, at most


class GetStatus(StrEnum):
    FOUND = "FOUND"
    NO_MATCHED_MSG = "NO_MATCHED_MSG"
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    DAMAGED_UNIT = "DAMAGED_UNIT"  # mqaudit's: the next unit is damaged and not skipped


@dataclass(slots=True)
class GetResult:
    status: GetStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    units: list[bytes]
    suggest_slave: bool = False


def read_queue(
    store: MessageStore,
    topic: str,
    queue_id: int,
    offset: int,
    max_nums: int,
    flt: Subscription,
    *,
    max_bytes: int,
    correct_offset: bool,
    slave_lag_bytes: int,
    damaged: DamagedUnits | None = None,
) -> GetResult:
    """Up to `max_nums` matching CommitLog units of a queue, from queue offset `offset`.

    With `damaged`, each unit is checked as a consumer checks it: the read stops before a
    damaged unit (DAMAGED_UNIT when it is the first) unless an operator skipped it.
    """
    lo, hi = store.min_offset(topic, queue_id), store.max_offset(topic, queue_id)

    def corrected(new: int) -> int:
        return new if correct_offset else offset

    if hi == 0:
        return GetResult(GetStatus.NO_MESSAGE_IN_QUEUE, corrected(0), lo, hi, [])
    if offset < lo:
        return GetResult(GetStatus.OFFSET_TOO_SMALL, corrected(lo), lo, hi, [])
    if offset == hi:
        return GetResult(GetStatus.OFFSET_OVERFLOW_ONE, offset, lo, hi, [])
    if offset > hi:
        return GetResult(
            GetStatus.OFFSET_OVERFLOW_BADLY, corrected(lo if lo == 0 else hi), lo, hi, []
        )

    scan = max_nums if flt.matches_all else max(max_nums, FILTER_SCAN_LIMIT)
    units: list[bytes] = []
    size = 0
    next_offset = offset
    last_phys = -1
    removed = 0
    stopped = False
    entries: list[CqEntry] = store.queue_entries(topic, queue_id, offset, min(scan, hi - offset))
    for e in entries:
        if len(units) >= max_nums or (units and size + e.size > max_bytes):
            break
        next_offset = e.queue_offset + 1
        if e.blank or not flt.code_matches(e.tags_code):
            continue
        raw = store.unit_at(e.phys_offset, e.size)
        if raw is None:  # the log file under this entry expired
            removed += 1
            continue
        why = None if damaged is None else unit_damage(raw, e.phys_offset)
        if why is not None:
            unit = DamagedUnit(topic, queue_id, e.queue_offset, e.phys_offset, e.size, why)
            if damaged is not None and damaged.skipped(unit):
                continue
            next_offset, stopped = e.queue_offset, True
            break
        if not flt.matches_all and not flt.unit_matches(codec.decode(raw)):
            continue  # a tag hash collision, or properties the expression does not take
        units.append(raw)
        size += e.size
        last_phys = e.phys_offset
    if units:
        status = GetStatus.FOUND
    elif stopped:
        status = GetStatus.DAMAGED_UNIT
    else:
        status = GetStatus.MESSAGE_WAS_REMOVING if removed else GetStatus.NO_MATCHED_MSG
    lag = store.log_max_offset - last_phys if last_phys >= 0 else 0
    return GetResult(status, next_offset, lo, hi, units, suggest_slave=lag > slave_lag_bytes)
