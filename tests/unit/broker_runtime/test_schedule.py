"""The schedule service on a real store: tag codes of SCHEDULE_TOPIC_XXXX, due times under a
FakeClock and a time scale, delayOffset.json, resuming, and puts the store refuses.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from broker_runtime.broker.schedule import ScheduleService
from broker_runtime.common.clock import FakeClock, SystemClock
from broker_runtime.common.config import StoreConfig
from broker_runtime.common.delay import to_schedule
from broker_runtime.common.java_hash import tags_code
from broker_runtime.common.message import DELAY, REAL_TOPIC, TAGS, UNIQ_KEY, Message
from broker_runtime.common.topics import SCHEDULE_TOPIC
from broker_runtime.offsets.delay_offsets import delay_offset_path
from broker_runtime.store.message_store import MessageStore, StoreUnavailable
from broker_runtime.store.record_codec import MessageRejected

T0 = 1_700_000_000_000
SCALE = 0.01  # level 1 = 10 ms, level 2 = 50 ms, level 3 = 100 ms


@pytest.fixture
def config(small_config: StoreConfig) -> StoreConfig:
    return dataclasses.replace(small_config, delay_time_scale=SCALE)


def delayed(i: int, level: int, topic: str = "T", queue: int = 1) -> Message:
    props = {UNIQ_KEY: f"U{i}", TAGS: "tagA", DELAY: str(level)}
    return Message(topic, f"body-{i}".encode(), props, queue_id=queue, born_timestamp=T0)


def put_delayed(store: MessageStore, config: StoreConfig, *msgs: Message) -> None:
    store.put_messages([to_schedule(m, config.delay_levels()) for m in msgs])
    assert store.wait_dispatched(10)


def open_store(config: StoreConfig, clock: FakeClock) -> MessageStore:
    return MessageStore(config, clock, disk_ratio=lambda _p: 0.0)


def test_schedule_topic_tag_code_is_the_delivery_time(config: StoreConfig) -> None:
    clock = FakeClock(T0)
    with open_store(config, clock) as store:
        put_delayed(store, config, delayed(1, 2))
        clock.advance(7)
        put_delayed(store, config, delayed(2, 2), delayed(3, 3))
        store.put_message(Message("T", b"plain", {TAGS: "tagA"}))
        assert store.wait_dispatched(10)
        level2 = store.consume_queue(SCHEDULE_TOPIC, 1).entries(0, 10)
        level3 = store.consume_queue(SCHEDULE_TOPIC, 2).entries(0, 10)
        assert [e.tags_code for e in level2] == [T0 + 50, T0 + 7 + 50]
        assert [e.tags_code for e in level3] == [T0 + 7 + 100]
        # Every other topic keeps the tag hash.
        assert store.consume_queue("T", 0).entries(0, 1)[0].tags_code == tags_code("tagA")
    # A rebuild from the log (recovery) computes the same codes.
    shutil.rmtree(config.store_dir / "consumequeue")
    with open_store(config, clock) as store:
        rebuilt = store.consume_queue(SCHEDULE_TOPIC, 1).entries(0, 10)
        assert [e.tags_code for e in rebuilt] == [T0 + 50, T0 + 7 + 50]


def test_due_only_once_the_scaled_delay_has_passed(config: StoreConfig) -> None:
    clock = FakeClock(T0)
    with open_store(config, clock) as store:
        svc = ScheduleService(store, config.delay_levels(), clock, config.store_dir)
        put_delayed(store, config, delayed(1, 2), delayed(2, 2))
        due = svc.due(2, T0 + 49)
        assert due.messages == [] and due.next_due_at == T0 + 50 and due.next_offset == 0
        due = svc.due(2, T0 + 50)
        assert [qo for qo, _ in due.messages] == [0, 1] and due.next_offset == 2
        msg = due.messages[0][1]
        assert (msg.topic, msg.queue_id, msg.body) == ("T", 1, b"body-1")
        assert msg.properties[UNIQ_KEY] == "U1" and DELAY not in msg.properties
        assert msg.properties[REAL_TOPIC] == "T"  # kept, as RocketMQ's messageTimeup does
        svc.advance(2, due.next_offset)
        assert svc.due(2, T0 + 10_000).messages == []
        # Other levels are independent of level 2.
        assert svc.due(1, T0 + 10_000).next_offset == 0


def test_a_delivery_time_far_ahead_is_corrected_to_now(config: StoreConfig) -> None:
    clock = FakeClock(T0 + 3_600_000)  # stored an hour ahead: the clock was stepped back since
    with open_store(config, clock) as store:
        put_delayed(store, config, delayed(1, 1))
        svc = ScheduleService(store, config.delay_levels(), clock, config.store_dir)
        assert len(svc.due(1, T0).messages) == 1


def test_offsets_persist_and_resume_after_a_restart(config: StoreConfig) -> None:
    clock = FakeClock(T0)
    with open_store(config, clock) as store:
        svc = ScheduleService(store, config.delay_levels(), clock, config.store_dir)
        put_delayed(store, config, *(delayed(i, 3) for i in range(5)))
        assert svc.persist() is True  # the first write has every level
        assert svc.persist() is False  # nothing moved since
        due = svc.due(3, T0 + 100, limit=3)
        assert due.full and due.next_offset == 3
        svc.advance(3, due.next_offset)
        assert svc.persist() is True
    saved = json.loads(delay_offset_path(config.store_dir).read_text())
    assert saved["offsetTable"]["3"] == 3 and saved["offsetTable"]["1"] == 0
    assert len(saved["offsetTable"]) == 18
    with open_store(config, clock) as store:
        svc = ScheduleService(store, config.delay_levels(), clock, config.store_dir)
        due = svc.due(3, T0 + 100)
        assert [m.properties[UNIQ_KEY] for _, m in due.messages] == ["U3", "U4"]


def test_an_offset_past_the_queue_is_corrected(config: StoreConfig) -> None:
    clock = FakeClock(T0)
    delay_offset_path(config.store_dir).parent.mkdir(parents=True)
    delay_offset_path(config.store_dir).write_text('{"offsetTable": {"2": 99, "5": 7}}')
    with open_store(config, clock) as store:
        put_delayed(store, config, delayed(1, 2))
        svc = ScheduleService(store, config.delay_levels(), clock, config.store_dir)
        assert svc.offsets[2] == 1  # the queue ends at 1 (a log cut back after a crash)
        assert svc.offsets[5] == 0  # no queue: its first message will be number 0
        svc.offsets[2] = 5  # ... and the same correction while running
        assert svc.due(2, T0 + 1000).messages == [] and svc.offsets[2] == 1
        put_delayed(store, config, delayed(2, 2))
        assert [qo for qo, _ in svc.due(2, T0 + 1000).messages] == [1]


def test_run_delivers_through_the_put_and_tolerates_refusals(config: StoreConfig) -> None:
    cfg = dataclasses.replace(config, delay_time_scale=0.001)  # level 1 = 1 ms
    store = MessageStore(cfg, SystemClock(), disk_ratio=lambda _p: 0.0)
    svc = ScheduleService(store, cfg.delay_levels(), SystemClock(), cfg.store_dir)
    calls: list[list[str]] = []
    fail_once = {"unavailable": True}

    async def put(msgs: list[Message]) -> None:
        calls.append([m.properties[UNIQ_KEY] for m in msgs])
        if fail_once["unavailable"]:
            fail_once["unavailable"] = False
            raise StoreUnavailable("disk full")  # the level waits, then tries again
        if any(m.properties[UNIQ_KEY] == "bad" for m in msgs):
            raise MessageRejected("refused")
        store.put_messages(msgs)

    async def main() -> None:
        put_delayed(store, cfg, delayed(1, 1), delayed(0, 1, topic="T"))
        svc.offsets[1] = 0
        task = asyncio.get_running_loop().create_task(svc.run(put, persist_every_ms=10))
        try:
            await asyncio.sleep(0.3)
            assert svc.delivered == 0 and svc.offsets[1] == 0  # refused: waits RETRY_MS
            svc._retry_at.clear()  # skip the 10 s wait
            bad = delayed(2, 1)
            bad.properties[UNIQ_KEY] = "bad"
            put_delayed(store, cfg, bad, delayed(3, 1))
            for _ in range(200):
                if svc.offsets[1] == 4:
                    break
                await asyncio.sleep(0.01)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    try:
        asyncio.run(main())
        assert svc.offsets[1] == 4 and svc.delivered == 3 and svc.skipped == 1
        assert store.wait_dispatched(10)
        got = store.get_messages("T", 1, 0, 10).messages
        assert sorted(m.properties[UNIQ_KEY] for m in got) == ["U0", "U1", "U3"]
        assert all(m.store_timestamp >= m.born_timestamp for m in got)
        assert ["bad"] in calls  # the batch was retried one by one
        saved = json.loads(delay_offset_path(cfg.store_dir).read_text())
        assert saved["offsetTable"]["1"] == 4
    finally:
        store.shutdown()


def test_a_bad_level_table_fails_at_config_time(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="delay level 2"):
        StoreConfig(tmp_path, message_delay_level="1s 5x")
