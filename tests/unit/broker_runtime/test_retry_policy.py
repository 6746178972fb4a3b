"""Consumer send-back: retry with growing delays, then the dead-letter queue."""

from __future__ import annotations

import pytest

from broker_runtime.broker.retry_policy import (
    STRAIGHT_TO_DLQ,
    SendBackDecision,
    SendBackTarget,
    decide_send_back,
    send_back_message,
)
from broker_runtime.common.config import StoreConfig
from broker_runtime.common.constants import MAX_RECONSUME_TIMES
from broker_runtime.common.delay import DelayLevels, from_schedule, queue_id_of_level, to_schedule
from broker_runtime.common.message import (
    DELAY,
    KEYS,
    ORIGIN_MESSAGE_ID,
    REAL_TOPIC,
    RETRY_TOPIC,
    TAGS,
    UNIQ_KEY,
    Message,
    StoredMessage,
)
from broker_runtime.common.topics import SCHEDULE_TOPIC, InvalidNameError
from broker_runtime.store.message_store import MessageStore

GROUP = "pay_group"
S = 1000
M = 60 * S
# Seed 003, "无序消息的消费重试": the wait before the n-th retry, n = 1..16.
SEED_RETRY_INTERVALS = {
    1: 10 * S, 2: 30 * S, 3: 1 * M, 4: 2 * M, 5: 3 * M, 6: 4 * M, 7: 5 * M, 8: 6 * M,
    9: 7 * M, 10: 8 * M, 11: 9 * M, 12: 10 * M, 13: 20 * M, 14: 30 * M, 15: 60 * M, 16: 120 * M,
}  # fmt: skip


def test_retry_intervals_match_the_seed_table() -> None:
    levels = DelayLevels.parse()
    for n, interval in SEED_RETRY_INTERVALS.items():
        # The n-th retry is sent back by the delivery that carried reconsumeTimes n-1.
        d = decide_send_back(GROUP, reconsume_times=n - 1)
        assert d.target is SendBackTarget.RETRY
        assert (d.topic, d.queue_id) == ("%RETRY%pay_group", 0)  # its only queue
        assert d.delay_level == 3 + (n - 1)
        assert levels.delay_ms(d.delay_level) == interval, n
        assert d.reconsume_times == n
    # The 16 waits add up to 4 h 45 min 40 s: the seed's "4 hours 46 minutes", rounded.
    assert sum(SEED_RETRY_INTERVALS.values()) == (4 * 60 + 45) * M + 40 * S


def test_the_17th_failure_goes_to_the_dlq() -> None:
    d = decide_send_back(GROUP, reconsume_times=MAX_RECONSUME_TIMES)
    assert d == SendBackDecision(SendBackTarget.DLQ, "%DLQ%pay_group", 0, 0, 17)


def test_a_larger_max_keeps_retrying_every_two_hours() -> None:
    """Seed 003: with more than 16 retries, every retry past the 16th waits 2 hours."""
    levels = DelayLevels.parse()
    for rt in range(16, 20):
        d = decide_send_back(GROUP, rt, max_reconsume_times=20)
        assert d.target is SendBackTarget.RETRY
        assert d.delay_level == 18 and levels.delay_ms(18) == 2 * 60 * M
    assert decide_send_back(GROUP, 20, max_reconsume_times=20).target is SendBackTarget.DLQ


def test_a_smaller_max() -> None:
    assert decide_send_back(GROUP, 1, max_reconsume_times=2).target is SendBackTarget.RETRY
    assert decide_send_back(GROUP, 2, max_reconsume_times=2).target is SendBackTarget.DLQ
    assert decide_send_back(GROUP, 0, max_reconsume_times=0).target is SendBackTarget.DLQ


def test_client_chosen_levels() -> None:
    assert decide_send_back(GROUP, 5, delay_level=1).delay_level == 1
    assert decide_send_back(GROUP, 5, delay_level=30).delay_level == 18
    assert decide_send_back(GROUP, 0, delay_level=STRAIGHT_TO_DLQ).target is SendBackTarget.DLQ


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="reconsume_times"):
        decide_send_back(GROUP, -1)
    for bad in (-1, -2):  # 0 is allowed (test_a_smaller_max): the guard is exactly < 0
        with pytest.raises(ValueError, match=f"max_reconsume_times must be >= 0, got {bad}"):
            decide_send_back(GROUP, 0, max_reconsume_times=bad)
    with pytest.raises(InvalidNameError):
        decide_send_back("bad group", 0)


def _put_and_read(store: MessageStore, msg: Message) -> StoredMessage:
    put = store.put_message(msg)
    stored = store.message_at(put.phys_offset)
    assert stored is not None
    return stored


def test_lineage_survives_two_retries_and_the_dlq(small_config: StoreConfig) -> None:
    """Through real store files: each copy keeps UNIQ_KEY, the first topic and first id."""
    levels = DelayLevels.parse(time_scale=0.001)
    props = {UNIQ_KEY: "C0A8000100002A9F0000000000000001", KEYS: "order-7", TAGS: "paid"}
    with MessageStore(small_config) as store:
        first = _put_and_read(store, Message("orders", b"pay 10", props, queue_id=3, flag=5))

        d1 = decide_send_back(GROUP, first.reconsume_times)
        copy1 = send_back_message(first, d1)
        assert copy1.topic == "%RETRY%pay_group" and copy1.reconsume_times == 1
        assert copy1.properties[RETRY_TOPIC] == "orders"
        assert copy1.properties[ORIGIN_MESSAGE_ID] == first.msg_id
        assert copy1.properties[DELAY] == "3"
        assert {k: copy1.properties[k] for k in props} == props
        assert (copy1.body, copy1.flag, copy1.born_timestamp) == (
            b"pay 10",
            5,
            first.born_timestamp,
        )

        # The store keeps it under SCHEDULE_TOPIC_XXXX until due, then under %RETRY%.
        scheduled = _put_and_read(store, to_schedule(copy1, levels))
        assert scheduled.topic == SCHEDULE_TOPIC and scheduled.queue_id == queue_id_of_level(3)
        assert scheduled.properties[REAL_TOPIC] == "%RETRY%pay_group"
        retry1 = _put_and_read(store, from_schedule(scheduled))
        assert retry1.topic == "%RETRY%pay_group" and retry1.reconsume_times == 1

        # Second failure, read back from the retry topic: lineage is not overwritten.
        copy2 = send_back_message(retry1, decide_send_back(GROUP, retry1.reconsume_times))
        assert copy2.properties[RETRY_TOPIC] == "orders"
        assert copy2.properties[ORIGIN_MESSAGE_ID] == first.msg_id
        assert copy2.properties[DELAY] == "4" and copy2.reconsume_times == 2

        # Out of retries: the DLQ copy carries no DELAY, so it is stored straight away.
        dlq = decide_send_back(GROUP, retry1.reconsume_times, max_reconsume_times=1)
        dead = send_back_message(retry1, dlq)
        assert DELAY not in dead.properties
        assert to_schedule(dead, levels) is dead
        stored_dead = _put_and_read(store, dead)
        assert stored_dead.topic == "%DLQ%pay_group" and stored_dead.queue_id == 0
        assert stored_dead.properties[ORIGIN_MESSAGE_ID] == first.msg_id
        assert stored_dead.properties[UNIQ_KEY] == props[UNIQ_KEY]
        assert stored_dead.reconsume_times == 2


def test_a_delay_the_producer_set_is_dropped_on_the_way_to_the_dlq() -> None:
    failed = StoredMessage(
        total_size=0, magic=0, body_crc=0, queue_id=0, flag=0, queue_offset=0, phys_offset=64,
        sys_flag=0, born_timestamp=1, born_host=("127.0.0.1", 1), store_timestamp=2,
        store_host=("127.0.0.1", 10911), reconsume_times=16, prepared_transaction_offset=0,
        body=b"x", topic="%RETRY%pay_group", properties={DELAY: "5", RETRY_TOPIC: "orders"},
    )  # fmt: skip
    dead = send_back_message(failed, decide_send_back(GROUP, failed.reconsume_times))
    assert dead.topic == "%DLQ%pay_group" and DELAY not in dead.properties
    assert dead.properties[RETRY_TOPIC] == "orders"
    assert dead.properties[ORIGIN_MESSAGE_ID] == failed.msg_id
