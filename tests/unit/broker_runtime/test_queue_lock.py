"""Queue locks: the orderly LOCK_BATCH_MQ table (RebalanceLockManager), the queue access lock's
state machine (seed 001), and the lock request/response bodies.
"""

from __future__ import annotations

import json

import pytest

from broker_runtime.broker.queue_access import QueueAccessLocks
from broker_runtime.broker.rebalance_lock import MessageQueue, RebalanceLockManager
from broker_runtime.remoting.bodies import (
    BodyError,
    LockBatchRequestBody,
    decode_lock_ok,
    encode_lock_ok,
)

Q0, Q1, Q2 = (MessageQueue("T", "broker-a", q) for q in range(3))
KEY = ("G", "T", 0)


# -- orderly locks ----------------------------------------------------------------------------


def test_lock_is_taken_renewed_and_refused_to_others() -> None:
    m = RebalanceLockManager(max_live_ms=60_000)
    assert m.try_lock_batch("G", [Q0, Q1], "A", 0) == [Q0, Q1]
    assert m.try_lock_batch("G", [Q1, Q2], "B", 1_000) == [Q2]
    assert m.holder("G", Q1, 1_000) == "A"
    assert m.try_lock_batch("G", [Q0], "A", 50_000) == [Q0]  # renewed at 50 s
    # Q1 was last renewed at 0: past 60 s it is B's for the taking, Q0 is not.
    assert m.try_lock_batch("G", [Q0, Q1], "B", 60_001) == [Q1]
    assert m.holder("G", Q1, 60_001) == "B"
    assert m.try_lock_batch("OTHER", [Q0], "B", 60_001) == [Q0]  # groups are separate


def test_unlock_only_releases_the_callers_own_locks() -> None:
    m = RebalanceLockManager()
    m.try_lock_batch("G", [Q0, Q1], "A", 0)
    assert m.unlock_batch("G", [Q0, Q1], "B") == 0
    assert m.holder("G", Q0, 1) == "A"
    assert m.unlock_batch("G", [Q0], "A") == 1
    assert m.holder("G", Q0, 1) is None
    assert m.try_lock_batch("G", [Q0], "B", 2) == [Q0]
    assert not m.is_all_expired("G", 2)
    assert m.is_all_expired("G", 2 + 60_001)


def test_snapshot_shows_one_brokers_queues_of_a_topic() -> None:
    m = RebalanceLockManager(max_live_ms=10)
    m.try_lock_batch("G", [Q0, MessageQueue("T", "broker-b", 1), MessageQueue("U", "broker-a", 2)],
                     "A", 0)  # fmt: skip
    snap = m.snapshot("G", "T", "broker-a", 5)
    assert snap == {0: {"clientId": "A", "lastUpdateTimestamp": 0, "expired": False}}
    assert m.snapshot("G", "T", "broker-a", 11)[0]["expired"] is True


def test_lock_bodies_have_rocketmqs_shape() -> None:
    body = LockBatchRequestBody("G", "client-1", [("T", "broker-a", 0), ("T", "broker-a", 3)])
    raw = json.loads(body.encode())
    assert raw == {
        "consumerGroup": "G",
        "clientId": "client-1",
        "onlyThisBroker": False,
        "mqSet": [
            {"topic": "T", "brokerName": "broker-a", "queueId": 0},
            {"topic": "T", "brokerName": "broker-a", "queueId": 3},
        ],
    }
    assert LockBatchRequestBody.decode(body.encode()) == body
    ok = encode_lock_ok([("T", "broker-a", 3)])
    assert json.loads(ok) == {
        "lockOKMQSet": [{"topic": "T", "brokerName": "broker-a", "queueId": 3}]
    }
    assert decode_lock_ok(ok) == [("T", "broker-a", 3)]


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"[]",
        b'{"consumerGroup": "G", "mqSet": []}',
        b'{"consumerGroup": "G", "clientId": "", "mqSet": []}',
        b'{"consumerGroup": "G", "clientId": "c", "mqSet": {}}',
        b'{"consumerGroup": "G", "clientId": "c", "mqSet": [{"topic": "T", "queueId": 0}]}',
        b'{"consumerGroup": "G", "clientId": "c", '
        b'"mqSet": [{"topic": "T", "brokerName": "b", "queueId": -1}]}',
        b'{"consumerGroup": "G", "clientId": "c", '
        b'"mqSet": [{"topic": "T", "brokerName": "b", "queueId": true}]}',
    ],
)
def test_bad_lock_bodies_are_refused_with_a_reason(raw: bytes) -> None:
    with pytest.raises(BodyError):
        LockBatchRequestBody.decode(raw)


# -- the queue access lock --------------------------------------------------------------------


def test_first_client_gets_a_free_queue_and_keeps_it() -> None:
    locks = QueueAccessLocks(hold_timeout_ms=30_000)
    a = locks.check(KEY, "A", 0, committed=-1, holder_alive=True)
    assert a.allowed and a.acquired
    again = locks.check(KEY, "A", 10, committed=-1, holder_alive=True)
    assert again.allowed and not again.acquired


def test_new_owner_waits_until_the_holder_acked_what_it_was_delivered() -> None:
    locks = QueueAccessLocks(hold_timeout_ms=30_000)
    locks.check(KEY, "A", 0, committed=10, holder_alive=True)
    locks.pull_started(KEY, "A", 0)
    locks.pull_ended(KEY, "A", 5, delivered=42)  # A got offsets 10..41
    b = locks.check(KEY, "B", 100, committed=30, holder_alive=True)
    assert not b.allowed and "locked by A" in b.reason and "delivered up to 42" in b.reason
    locks.refuse(KEY)
    assert locks.refused == 1 and locks.table[KEY].refused == 1
    b = locks.check(KEY, "B", 200, committed=42, holder_alive=True)
    assert b.allowed and b.acquired and "acked" in b.reason
    assert locks.holds(KEY, "B") and not locks.holds(KEY, "A")
    assert locks.transfers == {"acked": 1}
    # A, no longer the holder, is now the one held back (B has had nothing delivered yet).
    entry = locks.table[KEY]
    assert entry.delivered == 42 and entry.since_ms == 200
    locks.pull_ended(KEY, "A", 300, delivered=99)  # a late end of A's pull changes nothing
    assert entry.delivered == 42


def test_the_hold_times_out_only_while_the_holder_is_idle() -> None:
    locks = QueueAccessLocks(hold_timeout_ms=1_000)
    locks.check(KEY, "A", 0, committed=0, holder_alive=True)
    locks.pull_started(KEY, "A", 0)
    locks.pull_ended(KEY, "A", 100, delivered=5)
    locks.pull_started(KEY, "A", 200)  # a long-polling pull still running
    assert not locks.check(KEY, "B", 5_000, committed=0, holder_alive=True).allowed
    locks.pull_ended(KEY, "A", 5_100, delivered=None)
    assert not locks.check(KEY, "B", 6_000, committed=0, holder_alive=True).allowed
    b = locks.check(KEY, "B", 6_101, committed=0, holder_alive=True)
    assert b.allowed and b.acquired and "idle 1001 ms" in b.reason
    assert locks.transfers == {"timeout": 1}


def test_a_holder_that_left_the_group_gives_the_queue_up_at_once() -> None:
    locks = QueueAccessLocks()
    locks.check(KEY, "A", 0, committed=0, holder_alive=True)
    locks.pull_ended(KEY, "A", 1, delivered=50)
    b = locks.check(KEY, "B", 2, committed=0, holder_alive=False)
    assert b.allowed and b.acquired and "left the group" in b.reason
    assert locks.transfers == {"left": 1}


def test_snapshot_for_consume_stats() -> None:
    locks = QueueAccessLocks()
    locks.check(("G", "T", 1), "A", 7, committed=3, holder_alive=True)
    locks.check(("G", "U", 0), "A", 7, committed=3, holder_alive=True)
    snap = locks.snapshot("G", "T")
    assert list(snap) == [1]
    assert snap[1]["clientId"] == "A" and snap[1]["deliveredOffset"] == 3
