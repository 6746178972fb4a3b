"""Name servers and registration on a real cluster: two name servers, two broker groups.

Brokers register with every name server and heartbeat; a cleanly stopped master leaves the
routes at once (its slave stays, for reads); a broker that stops heartbeating (SIGSTOP, its
connections stay open) is expired by each name server on its own; a resumed one returns.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from broker_runtime.remoting.bodies import TopicRouteData, decode_json
from broker_runtime.remoting.protocol import RequestCode, ResponseCode
from tests.integration.cluster_fixtures import RawClient, running_cluster

pytestmark = pytest.mark.integration


async def _route(client: RawClient, ns: str, topic: str) -> TopicRouteData | None:
    resp = await client.call(ns, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
    if resp.code == ResponseCode.TOPIC_NOT_EXIST:
        return None
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    return TopicRouteData.decode(resp.body)


async def _until(predicate: object, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await predicate():  # type: ignore[operator]
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"condition not met within {timeout} s")


def test_registration_routes_and_expiry(tmp_path: Path) -> None:
    with running_cluster(
        tmp_path / "c", groups=("broker-a", "broker-b"), namesrv_expiry_ms=3000
    ) as c:
        name_servers = c.namesrv_addr.split(";")
        assert len(name_servers) == 2
        a_master, b_master = c.addr("broker-a-master"), c.addr("broker-b-master")

        async def scenario() -> None:
            client = RawClient()
            try:
                for ns in name_servers:
                    info = decode_json(
                        (await client.call(ns, RequestCode.GET_BROKER_CLUSTER_INFO)).body, "x"
                    )
                    addrs = info["brokerAddrTable"]
                    assert addrs["broker-a"]["brokerAddrs"] == {
                        "0": a_master,
                        "1": c.addr("broker-a-slave"),
                    }
                    assert info["clusterAddrTable"] == {"DefaultCluster": ["broker-a", "broker-b"]}
                    assert await _route(client, ns, "NoSuchTopic") is None

                # A send auto-creates the topic on both masters; both re-register at once.
                for master in (a_master, b_master):
                    assert (await client.send(master, "RouteTopic", b"x")).code == 0

                async def both_listed() -> bool:
                    for ns in name_servers:
                        r = await _route(client, ns, "RouteTopic")
                        if r is None or len(r.queue_datas) != 2:
                            return False
                    return True

                await _until(both_listed)
                route = await _route(client, name_servers[0], "RouteTopic")
                assert route is not None
                assert {q.broker_name: q.write_queue_nums for q in route.queue_datas} == {
                    "broker-a": 4,
                    "broker-b": 4,
                }
                topics = decode_json(
                    (
                        await client.call(
                            name_servers[1], RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER
                        )
                    ).body,
                    "x",
                )
                assert "RouteTopic" in topics["topicList"]
                assert "%RETRY%test-consumer" not in topics["topicList"]
            finally:
                await client.close()

        asyncio.run(scenario())

        # A clean stop unregisters the master; the slave keeps its group in the route.
        c.stop("broker-b-master")

        async def after_stop() -> None:
            client = RawClient()
            try:
                for ns in name_servers:
                    r = await _route(client, ns, "RouteTopic")
                    assert r is not None
                    b = next(d for d in r.broker_datas if d.broker_name == "broker-b")
                    assert b.broker_addrs == {1: c.addr("broker-b-slave")}
            finally:
                await client.close()

        asyncio.run(after_stop())

        # SIGSTOP: no heartbeats, connections open. Each name server expires it by itself.
        pid = c.pid("broker-a-slave")
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:

            async def expired() -> None:
                client = RawClient()
                try:

                    async def slave_gone() -> bool:
                        for ns in name_servers:
                            r = await _route(client, ns, "RouteTopic")
                            a = r and next(d for d in r.broker_datas if d.broker_name == "broker-a")
                            if not a or 1 in a.broker_addrs:
                                return False
                        return True

                    await _until(slave_gone, 15)
                finally:
                    await client.close()

            asyncio.run(expired())
        finally:
            os.kill(pid, signal.SIGCONT)

        async def back() -> None:
            client = RawClient()
            try:

                async def slave_back() -> bool:
                    r = await _route(client, name_servers[0], "RouteTopic")
                    a = r and next(d for d in r.broker_datas if d.broker_name == "broker-a")
                    return bool(a) and 1 in a.broker_addrs  # type: ignore[union-attr]

                await _until(slave_back, 15)
            finally:
                await client.close()

        asyncio.run(back())
        status = c.status()
        by_name = {n["name"]: n for n in status["nodes"]}
        assert by_name["broker-b-master"]["alive"] is False
        assert by_name["broker-a-master"]["answering"] is True
        assert status["ok"] is False  # one node is down, and status says so
