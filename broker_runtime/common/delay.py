"""Delay levels (RocketMQ messageDelayLevel) and the SCHEDULE_TOPIC_XXXX rewrite; pure.

A message with property DELAY=n (n > 0) is stored under SCHEDULE_TOPIC_XXXX, queue n-1, with
its real topic and queue kept in REAL_TOPIC / REAL_QID; the consume queue entry carries the
delivery time instead of the tags hash. When that time comes the schedule service puts the
message back under its real topic without DELAY (ScheduleMessageService.messageTimeup).
`time_scale` multiplies every level so that tests run the schedule in milliseconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from broker_runtime.common.message import (
    DELAY,
    REAL_QUEUE_ID,
    REAL_TOPIC,
    Message,
    StoredMessage,
)
from broker_runtime.common.topics import SCHEDULE_TOPIC

DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


class DelayLevelError(ValueError):
    """A level string that does not parse, or a level outside the table."""


@dataclass(frozen=True)
class DelayLevels:
    """The level table; level 1 is the first entry."""

    base_ms: tuple[int, ...]
    time_scale: float = 1.0

    def __post_init__(self) -> None:
        if not self.base_ms:
            raise DelayLevelError("the delay level table is empty")
        if not self.time_scale > 0:
            raise DelayLevelError(f"time_scale must be > 0, got {self.time_scale}")

    @classmethod
    def parse(cls, text: str = DEFAULT_DELAY_LEVELS, time_scale: float = 1.0) -> DelayLevels:
        """Parse `"1s 5s ... 2h"` (units s, m, h, d) as ScheduleMessageService.parseDelayLevel."""
        levels: list[int] = []
        for i, item in enumerate(text.split(), start=1):
            unit = _UNIT_MS.get(item[-1:])
            number = item[:-1]
            if unit is None or not (number.isascii() and number.isdigit()):
                raise DelayLevelError(
                    f"delay level {i} is {item!r}: expected a whole number and one of s, m, h, d"
                )
            levels.append(int(number) * unit)
        return cls(tuple(levels), time_scale)

    @property
    def max_level(self) -> int:
        return len(self.base_ms)

    def check(self, level: int) -> int:
        if not 1 <= level <= self.max_level:
            raise DelayLevelError(f"delay level {level} is outside 1..{self.max_level}")
        return level

    def clamp(self, level: int) -> int:
        """A level above the table is the last level (CommitLog.putMessage); below 1 is an error."""
        return self.check(min(level, self.max_level))

    def delay_ms(self, level: int) -> int:
        """The scaled delay of `level`, never below 1 ms."""
        return max(1, round(self.base_ms[self.check(level) - 1] * self.time_scale))

    def deliver_at(self, level: int, store_timestamp: int) -> int:
        """When a message stored at `store_timestamp` is due (computeDeliverTimestamp)."""
        return store_timestamp + self.delay_ms(level)

    def correct_deliver_at(self, level: int, deliver_at: int, now: int) -> int:
        """`now` when `deliver_at` lies further ahead than one full delay (clock stepped back)."""
        return now if deliver_at > now + self.delay_ms(level) else deliver_at


def queue_id_of_level(level: int) -> int:
    """SCHEDULE_TOPIC_XXXX queue of a delay level: level - 1."""
    return level - 1


def level_of_queue_id(queue_id: int) -> int:
    return queue_id + 1


def delay_level_of(properties: Mapping[str, str]) -> int:
    """The DELAY property as an int; 0 when absent. Raises DelayLevelError when not a number."""
    raw = properties.get(DELAY)
    if raw is None or raw == "":
        return 0
    try:
        return int(raw)
    except ValueError:
        raise DelayLevelError(f"DELAY property {raw!r} is not a number") from None


def to_schedule(msg: Message, levels: DelayLevels) -> Message:
    """The message as the store keeps a delayed one: SCHEDULE_TOPIC_XXXX, queue level-1.

    A message without a positive DELAY is returned unchanged. A level past the table is
    clamped to the last one and written back into DELAY, as CommitLog.putMessage does.
    """
    level = delay_level_of(msg.properties)
    if level <= 0:
        return msg
    level = levels.clamp(level)
    props = dict(msg.properties)
    props[DELAY] = str(level)
    props[REAL_TOPIC] = msg.topic
    props[REAL_QUEUE_ID] = str(msg.queue_id)
    return replace(msg, topic=SCHEDULE_TOPIC, queue_id=queue_id_of_level(level), properties=props)


def from_schedule(stored: StoredMessage) -> Message:
    """The due message put back under its real topic and queue, DELAY removed.

    Raises DelayLevelError if `stored` lacks REAL_TOPIC / REAL_QID (not a scheduled message).
    """
    props = dict(stored.properties)
    topic = props.get(REAL_TOPIC)
    queue = props.get(REAL_QUEUE_ID, "")
    if stored.topic != SCHEDULE_TOPIC or topic is None or not (queue.isascii() and queue.isdigit()):
        raise DelayLevelError(
            f"message at {stored.phys_offset} in {stored.topic!r} has no REAL_TOPIC/REAL_QID"
        )
    props.pop(DELAY, None)
    return Message(
        topic=topic,
        body=stored.body,
        properties=props,
        queue_id=int(queue),
        flag=stored.flag,
        sys_flag=stored.sys_flag,
        born_timestamp=stored.born_timestamp,
        born_host=stored.born_host,
        reconsume_times=stored.reconsume_times,
        prepared_transaction_offset=stored.prepared_transaction_offset,
    )
