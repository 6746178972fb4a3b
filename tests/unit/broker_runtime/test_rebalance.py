"""Queue allocation strategies: seed 003's tables, seed 000's split view, partition properties."""

from __future__ import annotations

import hashlib
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker_runtime.client.rebalance import (
    Allocate,
    HashRing,
    MessageQueue,
    Strategy,
    allocate_averagely,
    allocate_averagely_by_circle,
    allocate_by_machine_room,
    consistent_hash,
    machine_room_nearby,
    md5_hash,
    strategy,
)

GROUP = "g"
TOPIC = "orders"


def queues(n: int, broker: str = "broker-a", topic: str = TOPIC) -> list[MessageQueue]:
    return [MessageQueue(topic, broker, i) for i in range(n)]


def table(allocate: Allocate, mqs: list[MessageQueue], cids: list[str]) -> dict[str, list[int]]:
    """cid -> allocated queue ids, every consumer computing from the same view."""
    return {c: [mq.queue_id for mq in allocate(GROUP, c, mqs, cids)] for c in cids}


# -- seed 003: the allocation tables ------------------------------------------------------------


def test_avg_when_divisible() -> None:
    assert table(allocate_averagely, queues(6), ["c1", "c2", "c3"]) == {
        "c1": [0, 1],
        "c2": [2, 3],
        "c3": [4, 5],
    }


def test_avg_gives_the_remainder_to_the_first_consumers() -> None:
    # Seed 003: 5 queues, a second consumer joins -> one gets 3 queues, the other 2.
    assert table(allocate_averagely, queues(5), ["c1"]) == {"c1": [0, 1, 2, 3, 4]}
    assert table(allocate_averagely, queues(5), ["c1", "c2"]) == {"c1": [0, 1, 2], "c2": [3, 4]}
    assert table(allocate_averagely, queues(8), ["c1", "c2", "c3"]) == {
        "c1": [0, 1, 2],
        "c2": [3, 4, 5],
        "c3": [6, 7],
    }


def test_avg_with_more_consumers_than_queues_starves_the_last() -> None:
    assert table(allocate_averagely, queues(2), ["c1", "c2", "c3"]) == {
        "c1": [0],
        "c2": [1],
        "c3": [],
    }


def test_avg_by_circle_deals_queues_round_the_consumers() -> None:
    # RocketMQ's own example: q1..q8 over c1..c3 -> c1 q1 q4 q7, c2 q2 q5 q8, c3 q3 q6.
    assert table(allocate_averagely_by_circle, queues(8), ["c1", "c2", "c3"]) == {
        "c1": [0, 3, 6],
        "c2": [1, 4, 7],
        "c3": [2, 5],
    }


def test_inputs_are_sorted_like_rebalance_impl() -> None:
    mqs = queues(4, "broker-b") + queues(4, "broker-a")
    shuffled = [mqs[i] for i in (5, 0, 7, 2, 1, 6, 3, 4)]
    got = allocate_averagely(GROUP, "c1", shuffled, ["c2", "c1"])
    assert got == [MessageQueue(TOPIC, "broker-a", i) for i in range(4)]


def test_java_order_topic_then_broker_then_queue() -> None:
    mqs = [MessageQueue("b", "x", 0), MessageQueue("a", "y", 10), MessageQueue("a", "y", 9)]
    assert sorted(mqs) == [mqs[2], mqs[1], mqs[0]]


def test_a_consumer_not_in_the_group_gets_nothing() -> None:
    for name in Strategy:
        if name is Strategy.MACHINE_ROOM:
            continue  # needs rooms in the names; covered below
        assert strategy(name)(GROUP, "c9", queues(4), ["c1", "c2"]) == []


@pytest.mark.parametrize(
    "args",
    [("", queues(1), ["c1"]), ("c1", [], ["c1"]), ("c1", queues(1), [])],
)
def test_empty_inputs_are_errors(args: tuple[str, list[MessageQueue], list[str]]) -> None:
    with pytest.raises(ValueError, match="empty"):
        allocate_averagely(GROUP, *args)


def test_unknown_strategy_name() -> None:
    with pytest.raises(ValueError, match="RANDOM"):
        strategy("RANDOM")


# -- seed 000: two name server views, two owners of queue 2 -------------------------------------


def test_name_server_disagreement_gives_queue_2_two_owners() -> None:
    """The topic's queues 1, 2, 3: broker-a holds 1 and 2, broker-b holds 3.

    broker-b lost its link to namesrv1 only. c1 routes by namesrv2 (all three queues), c2 by
    namesrv1 (broker-a's two). Both take the whole consumer list from a broker.
    """
    q1 = MessageQueue(TOPIC, "broker-a", 0)
    q2 = MessageQueue(TOPIC, "broker-a", 1)
    q3 = MessageQueue(TOPIC, "broker-b", 0)
    namesrv2_view = [q1, q2, q3]
    namesrv1_view = [q1, q2]
    cids = ["c1", "c2"]
    c1 = allocate_averagely(GROUP, "c1", namesrv2_view, cids)
    c2 = allocate_averagely(GROUP, "c2", namesrv1_view, cids)
    assert c1 == [q1, q2]  # "c1 订阅队列1和2"
    assert c2 == [q2]  # "c2 订阅队列2"
    assert set(c1) & set(c2) == {q2}  # queue 2 is consumed twice
    assert q3 not in set(c1) | set(c2)  # and queue 3 by no one
    # Once the name servers agree again, the next rebalance heals the split.
    healed = table(allocate_averagely, namesrv2_view, cids)
    assert healed == {"c1": [0, 1], "c2": [0]}
    assert allocate_averagely(GROUP, "c2", namesrv2_view, cids) == [q3]


# -- CONSISTENT_HASH ---------------------------------------------------------------------------


def test_md5_hash_is_the_first_four_digest_bytes_unsigned() -> None:
    # RFC 1321 test vectors: MD5("") = d41d8cd9..., MD5("abc") = 90015098...
    assert md5_hash("") == 0xD41D8CD9
    assert md5_hash("abc") == 0x90015098


def _reference_route(cids: list[str], vnodes: int, key: str) -> str:
    """A linear scan over the ring, written without the module's helpers."""
    points = {}
    for cid in cids:
        for i in range(vnodes):
            digest = hashlib.md5(f"{cid}-{i}".encode()).digest()
            points[struct.unpack(">I", digest[:4])[0]] = cid
    h = struct.unpack(">I", hashlib.md5(key.encode()).digest()[:4])[0]
    at_or_after = [p for p in points if p >= h]
    return points[min(at_or_after) if at_or_after else min(points)]


def test_consistent_hash_matches_a_reference_ring() -> None:
    cids = ["10.0.0.1@111", "10.0.0.2@222", "10.0.0.3@333"]
    mqs = queues(8, "broker-a") + queues(8, "broker-b")
    got = table(consistent_hash(), mqs, cids)
    for cid in cids:
        want = [mq for mq in sorted(mqs) if _reference_route(cids, 10, str(mq)) == cid]
        assert got[cid] == [mq.queue_id for mq in want]


def test_consistent_hash_keys_are_rocketmqs_message_queue_strings() -> None:
    assert (
        str(MessageQueue("t", "broker-a", 3))
        == "MessageQueue [topic=t, brokerName=broker-a, queueId=3]"
    )


def test_a_ring_without_points_routes_nowhere() -> None:
    assert HashRing(["c1"], virtual_nodes=0).route("x") is None
    assert consistent_hash(0)(GROUP, "c1", queues(2), ["c1"]) == []
    with pytest.raises(ValueError, match="virtual_nodes"):
        HashRing(["c1"], virtual_nodes=-1)


def test_consistent_hash_moves_queues_only_to_a_new_consumer() -> None:
    mqs = queues(16, "broker-a") + queues(16, "broker-b")
    before = {
        mq: c for c, got in _owners(consistent_hash(), mqs, ["c1", "c2"]).items() for mq in got
    }
    after = {
        mq: c
        for c, got in _owners(consistent_hash(), mqs, ["c1", "c2", "c3"]).items()
        for mq in got
    }
    moved = {mq for mq in mqs if before[mq] != after[mq]}
    assert moved and all(after[mq] == "c3" for mq in moved)


def _owners(
    allocate: Allocate, mqs: list[MessageQueue], cids: list[str]
) -> dict[str, list[MessageQueue]]:
    return {c: allocate(GROUP, c, mqs, cids) for c in cids}


# -- MACHINE_ROOM ------------------------------------------------------------------------------


ROOMS = {"hz@broker-a": "hz", "sh@broker-b": "sh", "bj@broker-c": "bj"}
CONSUMER_ROOMS = {"hz@c1": "hz", "hz@c2": "hz", "sh@c3": "sh"}


def test_machine_room_nearby_keeps_queues_in_their_room() -> None:
    mqs = queues(4, "hz@broker-a") + queues(2, "sh@broker-b") + queues(3, "bj@broker-c")
    got = _owners(machine_room_nearby(ROOMS, CONSUMER_ROOMS), mqs, list(CONSUMER_ROOMS))
    named = {c: [(mq.broker.split("@")[1], mq.queue_id) for mq in v] for c, v in got.items()}
    # hz queues stay in hz, sh in sh; bj has no consumer, so its queues are shared by all.
    assert named == {
        "hz@c1": [("broker-a", 0), ("broker-a", 1), ("broker-c", 0)],
        "hz@c2": [("broker-a", 2), ("broker-a", 3), ("broker-c", 1)],
        "sh@c3": [("broker-b", 0), ("broker-b", 1), ("broker-c", 2)],
    }


def test_machine_room_strategy_reads_rooms_from_names() -> None:
    mqs = queues(4, "hz@broker-a") + queues(2, "sh@broker-b") + queues(3, "bj@broker-c")
    by_name = _owners(strategy(Strategy.MACHINE_ROOM), mqs, list(CONSUMER_ROOMS))
    by_table = _owners(machine_room_nearby(ROOMS, CONSUMER_ROOMS), mqs, list(CONSUMER_ROOMS))
    assert by_name == by_table


def test_machine_room_unknown_room_is_an_error() -> None:
    with pytest.raises(ValueError, match="machine room unknown"):
        strategy(Strategy.MACHINE_ROOM)(GROUP, "c1", queues(2, "broker-a"), ["c1"])


def test_by_machine_room_takes_only_the_listed_rooms() -> None:
    mqs = queues(5, "hz@broker-a") + queues(3, "sh@broker-b")
    got = _owners(allocate_by_machine_room({"hz"}), mqs, ["c1", "c2"])
    assert {c: [mq.queue_id for mq in v] for c, v in got.items()} == {
        "c1": [0, 1, 4],
        "c2": [2, 3],
    }


# -- every strategy partitions the queues when the views agree ----------------------------------


@given(
    n_a=st.integers(0, 9),
    n_b=st.integers(0, 9),
    n_cid=st.integers(1, 7),
    name=st.sampled_from([Strategy.AVG, Strategy.AVG_BY_CIRCLE, Strategy.CONSISTENT_HASH]),
)
def test_equal_views_give_each_queue_exactly_one_owner(
    n_a: int, n_b: int, n_cid: int, name: Strategy
) -> None:
    mqs = queues(n_a, "broker-a") + queues(n_b, "broker-b")
    if not mqs:
        return
    cids = [f"10.0.0.{i}@{1000 + i}" for i in range(n_cid)]
    got = _owners(strategy(name), mqs, cids)
    flat = [mq for v in got.values() for mq in v]
    assert sorted(flat) == sorted(mqs)
