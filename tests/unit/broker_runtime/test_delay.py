"""Delay levels, the SCHEDULE_TOPIC_XXXX rewrite and delayOffset.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker_runtime.common.config import StoreConfig
from broker_runtime.common.delay import (
    DelayLevelError,
    DelayLevels,
    delay_level_of,
    from_schedule,
    level_of_queue_id,
    queue_id_of_level,
    to_schedule,
)
from broker_runtime.common.message import DELAY, REAL_QUEUE_ID, REAL_TOPIC, UNIQ_KEY, Message
from broker_runtime.common.topics import SCHEDULE_TOPIC
from broker_runtime.offsets.delay_offsets import (
    delay_offset_path,
    read_delay_offsets,
    write_delay_offsets,
)
from broker_runtime.offsets.json_file import CorruptStateError
from broker_runtime.store.message_store import MessageStore

SECOND = 1000
MINUTE = 60 * SECOND
# The 18 levels of MessageStoreConfig.messageDelayLevel, written out by hand.
EXPECTED_MS = [
    1 * SECOND, 5 * SECOND, 10 * SECOND, 30 * SECOND,
    1 * MINUTE, 2 * MINUTE, 3 * MINUTE, 4 * MINUTE, 5 * MINUTE, 6 * MINUTE,
    7 * MINUTE, 8 * MINUTE, 9 * MINUTE, 10 * MINUTE, 20 * MINUTE, 30 * MINUTE,
    60 * MINUTE, 120 * MINUTE,
]  # fmt: skip


def test_default_table_has_rocketmqs_18_levels() -> None:
    levels = DelayLevels.parse()
    assert levels.max_level == 18
    assert [levels.delay_ms(n) for n in range(1, 19)] == EXPECTED_MS


def test_time_scale_runs_the_schedule_in_milliseconds() -> None:
    levels = DelayLevels.parse(time_scale=0.001)
    assert levels.delay_ms(1) == 1
    assert levels.delay_ms(3) == 10
    assert levels.delay_ms(18) == 7200
    # A scale so small that a level would round to 0 still waits 1 ms.
    assert DelayLevels.parse(time_scale=1e-9).delay_ms(1) == 1


def test_custom_table_with_days() -> None:
    levels = DelayLevels.parse("1s 1d")
    assert levels.max_level == 2
    assert levels.delay_ms(2) == 86_400_000


@pytest.mark.parametrize("text", ["", "1s 5x", "s", "1.5s", "-1s", "1s \uff15s"])
def test_bad_level_strings_say_which_item(text: str) -> None:
    with pytest.raises(DelayLevelError):
        DelayLevels.parse(text)


def test_bad_time_scale() -> None:
    with pytest.raises(DelayLevelError, match="time_scale"):
        DelayLevels.parse(time_scale=0)


@pytest.mark.parametrize("level", [0, 19, -1])
def test_levels_outside_the_table_are_refused(level: int) -> None:
    with pytest.raises(DelayLevelError, match=r"outside 1\.\.18"):
        DelayLevels.parse().delay_ms(level)


def test_clamp_caps_high_levels_as_the_commitlog_does() -> None:
    levels = DelayLevels.parse()
    assert levels.clamp(25) == 18
    assert levels.clamp(4) == 4
    with pytest.raises(DelayLevelError):
        levels.clamp(0)


def test_queue_id_is_level_minus_one() -> None:
    assert [queue_id_of_level(n) for n in (1, 3, 18)] == [0, 2, 17]
    assert all(level_of_queue_id(queue_id_of_level(n)) == n for n in range(1, 19))


def test_deliver_time_is_store_time_plus_delay() -> None:
    levels = DelayLevels.parse()
    assert levels.deliver_at(3, 1_700_000_000_000) == 1_700_000_010_000


def test_deliver_time_too_far_ahead_is_corrected_to_now() -> None:
    levels = DelayLevels.parse()
    now = 1_000_000
    assert levels.correct_deliver_at(1, now + 1000, now) == now + 1000  # within one delay
    assert levels.correct_deliver_at(1, now + 1001, now) == now  # the clock went back
    assert levels.correct_deliver_at(1, now - 5, now) == now - 5


def test_delay_property_parsing() -> None:
    assert delay_level_of({}) == 0
    assert delay_level_of({DELAY: "7"}) == 7
    with pytest.raises(DelayLevelError, match="not a number"):
        delay_level_of({DELAY: "soon"})


def _msg(**props: str) -> Message:
    return Message(
        topic="orders",
        body=b"pay 10",
        properties={UNIQ_KEY: "U1", **props},
        queue_id=1,
        born_timestamp=123,
        reconsume_times=1,
    )


def test_to_schedule_keeps_the_real_topic_and_queue() -> None:
    levels = DelayLevels.parse()
    scheduled = to_schedule(_msg(**{DELAY: "3"}), levels)
    assert (scheduled.topic, scheduled.queue_id) == (SCHEDULE_TOPIC, 2)
    assert scheduled.properties[REAL_TOPIC] == "orders"
    assert scheduled.properties[REAL_QUEUE_ID] == "1"
    assert scheduled.properties[UNIQ_KEY] == "U1"


def test_to_schedule_clamps_and_rewrites_the_level() -> None:
    scheduled = to_schedule(_msg(**{DELAY: "40"}), DelayLevels.parse())
    assert scheduled.queue_id == 17
    assert scheduled.properties[DELAY] == "18"


def test_messages_without_delay_are_not_scheduled() -> None:
    msg = _msg()
    assert to_schedule(msg, DelayLevels.parse()) is msg
    assert to_schedule(_msg(**{DELAY: "0"}), DelayLevels.parse()).topic == "orders"


def test_schedule_round_trip_through_a_real_store(small_config: StoreConfig) -> None:
    """Stored under SCHEDULE_TOPIC_XXXX, read back, restored to its topic without DELAY."""
    levels = DelayLevels.parse(time_scale=0.001)
    with MessageStore(small_config) as store:
        put = store.put_message(to_schedule(_msg(**{DELAY: "2"}), levels))
        assert store.wait_dispatched(10)
        got = store.get_messages(SCHEDULE_TOPIC, queue_id_of_level(2), 0, 10).messages
        assert [m.phys_offset for m in got] == [put.phys_offset]
        stored = got[0]
        due = levels.deliver_at(2, stored.store_timestamp)
        assert due == stored.store_timestamp + 5
        back = from_schedule(stored)
        assert (back.topic, back.queue_id, back.body) == ("orders", 1, b"pay 10")
        assert DELAY not in back.properties
        assert back.properties[UNIQ_KEY] == "U1"
        assert back.reconsume_times == 1 and back.born_timestamp == 123
        store.put_message(back)
        assert store.wait_dispatched(10)
        assert store.get_messages("orders", 1, 0, 10).messages[0].body == b"pay 10"


def test_from_schedule_refuses_an_ordinary_message(small_config: StoreConfig) -> None:
    with MessageStore(small_config) as store:
        store.put_message(_msg())
        assert store.wait_dispatched(10)
        stored = store.get_messages("orders", 1, 0, 1).messages[0]
    with pytest.raises(DelayLevelError, match="REAL_TOPIC"):
        from_schedule(stored)


def test_delay_offsets_file_has_rocketmqs_shape(tmp_path: Path) -> None:
    write_delay_offsets(tmp_path, {3: 7, 1: 0, 18: 2})
    path = delay_offset_path(tmp_path)
    assert path == tmp_path / "config" / "delayOffset.json"
    assert json.loads(path.read_text()) == {"offsetTable": {"1": 0, "3": 7, "18": 2}}
    assert read_delay_offsets(tmp_path) == {1: 0, 3: 7, 18: 2}
    write_delay_offsets(tmp_path, {1: 4})
    assert read_delay_offsets(tmp_path) == {1: 4}
    assert json.loads(path.with_name("delayOffset.json.bak").read_text())["offsetTable"]["3"] == 7


def test_delay_offsets_missing_and_corrupt(tmp_path: Path) -> None:
    assert read_delay_offsets(tmp_path) == {}
    path = delay_offset_path(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text('{"offsetTable": {"one": 2}}')
    with pytest.raises(CorruptStateError, match="delay offsetTable"):
        read_delay_offsets(tmp_path)


def test_delay_offsets_refuse_bad_entries(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="level >= 1"):
        write_delay_offsets(tmp_path, {0: 1})
    assert not delay_offset_path(tmp_path).exists()
