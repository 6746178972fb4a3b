"""The half message `mqaudit admin resume-check` sends for a given-up transaction, built from
the unit the broker moved to TRANS_CHECK_MAX_TIME_TOPIC (the broker's own builders)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from broker_runtime.broker.transactions import discarded_half, half_message, rechecked_half
from broker_runtime.client.check_resume import ResumeError, resumed_half
from broker_runtime.common.message import (
    PRODUCER_GROUP,
    REAL_QUEUE_ID,
    REAL_TOPIC,
    TRAN_MSG,
    TRANSACTION_CHECK_TIMES,
    TRANSACTION_MASK,
    TRANSACTION_PREPARED_TYPE,
    UNIQ_KEY,
    Message,
    StoredMessage,
)
from broker_runtime.store.message_store import MessageStore
from tests.unit.pipeline.stores import config


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MessageStore]:
    s = MessageStore(config(tmp_path / "store"), disk_ratio=lambda _p: 0.0)
    yield s
    s.shutdown()


def _put(store: MessageStore, msg: Message) -> StoredMessage:
    [r] = store.put_messages([msg])
    stored = store.message_at(r.phys_offset)
    assert stored is not None
    return stored


def test_the_resumed_half_goes_to_its_real_queue_with_no_check_count(
    store: MessageStore,
) -> None:
    sent = Message("Orders", b"pay", {UNIQ_KEY: "U1", TRAN_MSG: "true", PRODUCER_GROUP: "pg"})
    sent = replace(sent, queue_id=3, sys_flag=TRANSACTION_PREPARED_TYPE, flag=7)
    half = _put(store, half_message(sent))
    gave_up = _put(store, discarded_half(_put(store, rechecked_half(half, 15))))
    assert gave_up.properties[TRANSACTION_CHECK_TIMES] == "15"
    again = resumed_half(gave_up)
    assert (again.topic, again.queue_id, again.body, again.flag) == ("Orders", 3, b"pay", 7)
    assert again.sys_flag & TRANSACTION_MASK == TRANSACTION_PREPARED_TYPE
    assert again.properties == {UNIQ_KEY: "U1", TRAN_MSG: "true", PRODUCER_GROUP: "pg"}
    assert REAL_TOPIC in gave_up.properties and REAL_QUEUE_ID in gave_up.properties


def test_a_unit_that_was_never_a_half_message_is_refused(store: MessageStore) -> None:
    plain = _put(store, Message("TRANS_CHECK_MAX_TIME_TOPIC", b"x", {UNIQ_KEY: "U2"}))
    with pytest.raises(ResumeError, match="U2: no REAL_TOPIC"):
        resumed_half(plain)
