"""The name server's route table (RouteInfoManager), without sockets."""

from __future__ import annotations

from broker_runtime.namesrv.route_table import RouteTable, TopicQueues

Q = {"T": TopicQueues(4, 4, 6)}


def test_master_topics_make_routes_slaves_learn_their_master() -> None:
    rt = RouteTable()
    assert rt.register("C", "h:1", "broker-a", 0, "h:2", Q, 1000) == (None, None)
    assert rt.register("C", "h:3", "broker-a", 1, "h:4", {"S": TopicQueues(1, 1, 6)}, 1000) == (
        "h:1",
        "h:2",
    )
    route = rt.route("T")
    assert route is not None
    assert [(q.broker_name, q.write_queue_nums) for q in route.queue_datas] == [("broker-a", 4)]
    assert route.broker_datas[0].broker_addrs == {0: "h:1", 1: "h:3"}
    assert rt.route("S") is None  # only a master's registration carries topics
    assert rt.topics() == ["T"]
    assert rt.cluster_info()["clusterAddrTable"] == {"C": ["broker-a"]}


def test_group_leaves_routes_only_with_its_last_broker() -> None:
    rt = RouteTable()
    rt.register("C", "h:1", "broker-a", 0, "h:2", Q, 1000)
    rt.register("C", "h:3", "broker-a", 1, "", None, 1000)
    assert rt.unregister("h:1", "broker-a", 0)
    route = rt.route("T")
    assert route is not None and route.broker_datas[0].broker_addrs == {1: "h:3"}
    assert not rt.unregister("h:1", "broker-a", 0)
    assert rt.unregister("h:3", "broker-a", 1)
    assert (
        rt.route("T") is None and rt.topics() == [] and rt.cluster_info()["clusterAddrTable"] == {}
    )


def test_expiry_and_closed_channels() -> None:
    rt = RouteTable()
    chan_a, chan_b = object(), object()
    rt.register("C", "h:1", "broker-a", 0, "", Q, 1000, chan_a)
    rt.register("C", "h:5", "broker-b", 0, "", Q, 1000, chan_b)
    rt.register("C", "h:5", "broker-b", 0, "", Q, 5000, chan_b)  # a heartbeat
    assert rt.expire(now_ms=122_000, expiry_ms=120_000) == ["h:1"]
    route = rt.route("T")
    assert route is not None and [b.broker_name for b in route.broker_datas] == ["broker-b"]
    assert rt.channel_closed(chan_b) == ["h:5"]
    assert rt.route("T") is None


def test_an_address_holds_one_id() -> None:
    rt = RouteTable()
    rt.register("C", "h:3", "broker-a", 1, "", None, 1000)
    rt.register("C", "h:3", "broker-a", 0, "", Q, 2000)  # the slave came back as master
    route = rt.route("T")
    assert route is not None and route.broker_datas[0].broker_addrs == {0: "h:3"}
