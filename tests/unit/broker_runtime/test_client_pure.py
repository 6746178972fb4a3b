"""Client pure parts: UNIQ_KEY ids, routes and queue choice, tag expressions."""

from __future__ import annotations

import calendar
import os

import pytest

from broker_runtime.client.msg_id import (
    UniqIdGenerator,
    month_start_ms,
    set_uniq_id,
    uniq_id_ip,
    uniq_id_pid,
    uniq_id_time_ms,
)
from broker_runtime.client.rebalance import MessageQueue
from broker_runtime.client.route import (
    FaultTable,
    PublishInfo,
    pick_read_addr,
    read_queues,
    write_queues,
)
from broker_runtime.client.tag_filter import SubscriptionError, parse
from broker_runtime.common.java_hash import java_string_hash
from broker_runtime.common.message import UNIQ_KEY, Message
from broker_runtime.remoting.bodies import BrokerData, QueueData, TopicRouteData

T0 = calendar.timegm((2026, 3, 15, 12, 0, 0)) * 1000


# -- UNIQ_KEY -------------------------------------------------------------------------------
def test_uniq_id_layout_matches_message_client_id_setter() -> None:
    gen = UniqIdGenerator("10.1.2.3", pid=0x12345, loader_hash=0xCAFEBABE, now_ms=lambda: T0)
    uid = gen.create()
    assert len(uid) == 32 and uid == uid.upper()
    # ip (4) | low 16 bits of the pid (2) | loader hash (4) | ms since month start (4) | counter
    assert uid[:20] == "0A010203" + "2345" + "CAFEBABE"
    assert int(uid[20:28], 16) == T0 - month_start_ms(T0)
    assert uid[28:] == "0000"
    assert gen.create()[28:] == "0001"
    assert uniq_id_ip(uid) == "10.1.2.3" and uniq_id_pid(uid) == 0x2345
    assert uniq_id_time_ms(uid, T0 + 5000) == T0


def test_a_uniq_key_made_on_an_ipv6_host_is_read_as_java_reads_it() -> None:
    # Made by Apache RocketMQ 4.9.7's DefaultMQProducer on this machine (UtilAll.getIP()
    # found an IPv6 address): 28 bytes, the address 16 of them.
    uid = "FD000000000000000000000000000002687B5FFD2B278339008D0000"
    assert uniq_id_ip(uid) == "fd00::2" and uniq_id_pid(uid) == 0x687B
    march, late_march = (calendar.timegm((2026, 3, d, 0, 0, 0)) * 1000 for d in (1, 28))
    assert uniq_id_time_ms(uid, late_march) == march + 0x8339008D  # ms since month start
    with pytest.raises(ValueError, match="32 hex digits"):
        uniq_id_ip(uid[:-2])


def test_uniq_ids_are_unique_and_the_counter_wraps_as_a_short() -> None:
    gen = UniqIdGenerator(now_ms=lambda: T0)
    ids = [gen.create() for _ in range(65_537)]
    assert len(set(ids[:65_536])) == 65_536
    assert ids[65_536] == ids[0]  # same ms, counter wrapped: Java's (short) cast does the same


def test_uniq_id_time_restarts_each_month_and_decodes_across_the_boundary() -> None:
    now = [calendar.timegm((2026, 1, 31, 23, 59, 59)) * 1000]
    gen = UniqIdGenerator(now_ms=lambda: now[0])
    late_january = gen.create()
    now[0] += 2000  # 1 February 00:00:01
    february = gen.create()
    assert int(february[20:28], 16) == 1000
    assert uniq_id_time_ms(late_january, now[0]) == now[0] - 2000
    assert uniq_id_time_ms(february, now[0]) == now[0]


def test_set_uniq_id_keeps_an_existing_id_for_resends() -> None:
    msg = Message("T", b"x")
    first = set_uniq_id(msg)
    assert msg.properties[UNIQ_KEY] == first
    assert set_uniq_id(msg) == first
    assert uniq_id_pid(first) == os.getpid() & 0xFFFF


# -- routes ---------------------------------------------------------------------------------
def route() -> TopicRouteData:
    return TopicRouteData(
        [
            QueueData("broker-b", 2, 2),
            QueueData("broker-a", 4, 3),
            QueueData("broker-c", 2, 2, perm=4),  # read only
            QueueData("broker-d", 1, 1),  # master gone: slave only
        ],
        [
            BrokerData("c", "broker-a", {0: "a0", 1: "a1"}),
            BrokerData("c", "broker-b", {0: "b0"}),
            BrokerData("c", "broker-c", {0: "c0"}),
            BrokerData("c", "broker-d", {1: "d1"}),
        ],
    )


def test_write_queues_need_write_perm_and_a_master() -> None:
    qs = write_queues("T", route())
    assert [(q.broker, q.queue_id) for q in qs] == [
        ("broker-a", 0), ("broker-a", 1), ("broker-a", 2), ("broker-b", 0), ("broker-b", 1),
    ]  # fmt: skip


def test_read_queues_include_brokers_served_by_a_slave() -> None:
    qs = read_queues("T", route())
    assert {q.broker for q in qs} == {"broker-a", "broker-b", "broker-c", "broker-d"}
    assert len(qs) == 4 + 2 + 2 + 1


def mqs(*brokers: str, n: int = 2) -> list[MessageQueue]:
    return [MessageQueue("T", b, i) for b in brokers for i in range(n)]


def test_select_is_round_robin() -> None:
    info = PublishInfo(mqs("a", "b"))
    picked = [info.select() for _ in range(8)]
    assert picked == info.queues * 2


def test_select_avoids_the_broker_that_just_failed() -> None:
    info = PublishInfo(mqs("a", "b"))
    for _ in range(10):
        assert info.select(last_broker="a").broker == "b"


def test_select_avoids_isolated_brokers_until_the_isolation_ends() -> None:
    faults = FaultTable(isolation_ms=1000)
    faults.failed("b", now_ms=0)
    info = PublishInfo(mqs("a", "b", "c"))
    assert {info.select(None, faults, 500).broker for _ in range(12)} == {"a", "c"}
    assert {info.select("a", faults, 500).broker for _ in range(12)} == {"c"}
    assert faults.isolated(500) == ["b"]
    assert {info.select(None, faults, 1000).broker for _ in range(12)} == {"a", "b", "c"}
    faults.failed("c", 2000)
    faults.succeeded("c")
    assert faults.isolated(2000) == []


def test_select_falls_back_when_every_broker_is_excluded() -> None:
    faults = FaultTable()
    faults.failed("a", 0)
    info = PublishInfo(mqs("a"))
    assert info.select("a", faults, 1).broker == "a"  # one broker still gets its retries
    info2 = PublishInfo(mqs("a", "b"))
    faults.failed("b", 0)
    assert info2.select("a", faults, 1).broker == "b"  # isolated, but not the last failure
    with pytest.raises(LookupError):
        PublishInfo([]).select()


def test_pick_read_addr_prefers_suggestion_then_master_then_slave() -> None:
    addrs = {0: "m", 1: "s"}
    assert pick_read_addr(addrs) == (0, "m")
    assert pick_read_addr(addrs, suggested_id=1) == (1, "s")
    assert pick_read_addr(addrs, down={"m"}) == (1, "s")
    assert pick_read_addr({1: "s"}) == (1, "s")  # master dropped from the route
    assert pick_read_addr(addrs, down={"m", "s"}) == (0, "m")  # all down: try anyway
    assert pick_read_addr({}) is None


# -- tag expressions ------------------------------------------------------------------------
@pytest.mark.parametrize("expr", [None, "", "*", "  *  ", "A || *"])
def test_everything_expressions(expr: str | None) -> None:
    sub = parse("T", expr)
    assert sub.all and sub.expression == "*"
    assert sub.matches(None) and sub.matches("X") and sub.matches_code(123)


def test_tag_expression_parsing_and_matching() -> None:
    sub = parse("T", " TAGA ||TAGB||  || TAGA ")
    assert sub.expression == "TAGA || TAGB"
    assert sub.tags == {"TAGA", "TAGB"}
    assert sub.codes == {java_string_hash("TAGA"), java_string_hash("TAGB")}
    assert sub.matches("TAGA") and sub.matches("TAGB")
    assert not sub.matches("TAGC") and not sub.matches(None)
    assert sub.matches_code(java_string_hash("TAGB")) and not sub.matches_code(0)


def test_hash_collision_is_caught_by_the_string_check() -> None:
    # "Aa" and "BB" share Java's hash code: the broker lets both through, the client not.
    assert java_string_hash("Aa") == java_string_hash("BB")
    sub = parse("T", "Aa")
    assert sub.matches_code(java_string_hash("BB")) and not sub.matches("BB")


def test_expression_without_a_tag_is_refused() -> None:
    with pytest.raises(SubscriptionError, match="names no tag"):
        parse("T", " || ")


def test_hash_selector_is_stable_and_matches_java() -> None:
    from broker_runtime.client.producer import select_by_hash

    qs = mqs("a", "b", n=4)  # 8 queues
    msg = Message("T", b"x")
    assert select_by_hash(qs, msg, "order-42") == qs[abs(java_string_hash("order-42")) % 8]
    assert select_by_hash(qs, msg, 13) == qs[13 % 8] and select_by_hash(qs, msg, -13) == qs[5]
    assert select_by_hash(qs, msg, b"k") == select_by_hash(qs, msg, "b'k'")
