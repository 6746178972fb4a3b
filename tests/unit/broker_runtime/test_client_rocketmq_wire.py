"""What Apache RocketMQ's name server and broker need of mqaudit's client requests, against
scripted ones on loopback that answer as the real ones do (fastjson bodies) and keep every
request they get. The interop tests (tests/interop/test_our_clients.py) show the same
against the real processes; these say which field or answer it was, without a JVM."""

from __future__ import annotations

import asyncio

from broker_runtime.client.config import ClientConfig
from broker_runtime.client.consumer_options import ConsumerOptions
from broker_runtime.client.instance import ClientInstance
from broker_runtime.client.lite_pull_consumer import LitePullConsumer
from broker_runtime.client.model import SendStatus, new_message
from broker_runtime.client.offset_store import RemoteBrokerOffsetStore
from broker_runtime.client.producer import Producer
from broker_runtime.client.puller import Puller
from broker_runtime.client.push_consumer import PushConsumer
from broker_runtime.client.rebalance import MessageQueue
from broker_runtime.client.tag_filter import parse
from broker_runtime.remoting.bodies import BrokerData, HeartbeatData, QueueData, TopicRouteData
from broker_runtime.remoting.command import RemotingCommand, request, response_to
from broker_runtime.remoting.connection import Connection
from broker_runtime.remoting.headers import (
    OffsetResponseHeader,
    PullMessageRequestHeader,
    PullMessageResponseHeader,
    SendMessageRequestHeader,
    SendMessageResponseHeader,
)
from broker_runtime.remoting.protocol import (
    FLAG_COMMIT_OFFSET,
    MQVersion,
    RequestCode,
    ResponseCode,
)
from broker_runtime.remoting.server import Processor, ProcessorTable, RemotingServer

R = ResponseCode


async def serve(handlers: dict[int, Processor]) -> RemotingServer:
    """A scripted name server or broker on loopback, answering `handlers`' request codes."""
    server = RemotingServer(ProcessorTable(handlers))
    await server.start()
    return server


async def with_fastjson_peers(topics: set[str]) -> list[RemotingCommand]:
    """Send to each topic of `topics` (known to the name server) and to one it does not
    know; every request the name server and the broker got."""
    got: list[RemotingCommand] = []

    async def send(cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        got.append(cmd)
        h = SendMessageRequestHeader.of(cmd)
        out = SendMessageResponseHeader("7F00000100002A9F0000000000000000", h.queue_id, 0)
        return response_to(cmd, R.SUCCESS, fields=out.fields())

    async def ok(cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        got.append(cmd)
        return response_to(cmd, R.SUCCESS)

    broker = await serve(
        {
            RequestCode.SEND_MESSAGE: send,
            RequestCode.SEND_BATCH_MESSAGE: send,
            RequestCode.UNREGISTER_CLIENT: ok,
        }
    )
    addr = f"127.0.0.1:{broker.port}".encode()

    async def route(cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        got.append(cmd)
        if cmd.ext_fields.get("topic") not in topics:
            return response_to(cmd, R.TOPIC_NOT_EXIST, "No topic route info in name server")
        body = (  # as Apache RocketMQ 4.9.7's name server writes it for a version-0 request
            b'{"brokerDatas":[{"brokerAddrs":{0:"' + addr + b'"},"brokerName":"broker-r",'
            b'"cluster":"interop"}],"filterServerTable":{},"queueDatas":[{"brokerName":'
            b'"broker-r","perm":6,"readQueueNums":4,"topicSysFlag":0,"writeQueueNums":4}]}'
        )
        return response_to(cmd, R.SUCCESS, body=body)

    async def cluster(cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        got.append(cmd)
        body = (
            b'{"brokerAddrTable":{"broker-r":{"brokerAddrs":{0:"' + addr + b'"},'
            b'"brokerName":"broker-r","cluster":"interop"}},'
            b'"clusterAddrTable":{"interop":["broker-r"]}}'
        )
        return response_to(cmd, R.SUCCESS, body=body)

    ns = await serve(
        {
            RequestCode.GET_ROUTEINFO_BY_TOPIC: route,
            RequestCode.GET_BROKER_CLUSTER_INFO: cluster,
        }
    )
    try:
        async with Producer(f"127.0.0.1:{ns.port}", "PG") as p:
            for topic in [*sorted(topics), "NewTopic"]:
                result = await p.send(new_message(topic, b"x"))
                assert result.status is SendStatus.SEND_OK
            batch = [new_message("Known", b"1", tags="A"), new_message("Known", b"2")]
            assert (await p.send_batch(batch)).status is SendStatus.SEND_OK
    finally:
        await ns.close()
        await broker.close()
    return got


def test_sends_to_a_known_and_an_unknown_topic_through_fastjson_routes() -> None:
    got = asyncio.run(with_fastjson_peers({"Known"}))
    sends = [c for c in got if c.code in (RequestCode.SEND_MESSAGE, RequestCode.SEND_BATCH_MESSAGE)]
    assert [SendMessageRequestHeader.of(c).topic for c in sends] == ["Known", "NewTopic", "Known"]
    # The broker creates a topic it does not know from defaultTopic's config with
    # defaultTopicQueueNums queues; without them Apache RocketMQ's broker failed the send
    # with a NullPointerException (msgCheck).
    singles = [c.ext_fields for c in sends if c.code == RequestCode.SEND_MESSAGE]
    assert [(f["defaultTopic"], f["defaultTopicQueueNums"]) for f in singles] == [
        ("TBW102", "4")
    ] * 2
    # A batch's header as SendMessageRequestHeaderV2, the only way the real broker reads one
    # ("The specified topic is blank" else).
    (batch,) = [c for c in got if c.code == RequestCode.SEND_BATCH_MESSAGE]
    assert {k: v for k, v in batch.ext_fields.items() if k not in "eg"} == {
        "a": "PG",
        "b": "Known",
        "c": "TBW102",
        "d": "4",
        "f": "0",
        "h": "0",
        "i": "",
        "j": "0",
        "k": "false",
        "m": "true",
    }
    assert SendMessageRequestHeader.of(batch).batch
    # NewTopic: the route came from the cluster info's brokerAddrs {0:"..."} (fastjson).
    assert RequestCode.GET_BROKER_CLUSTER_INFO in {c.code for c in got}


def test_every_request_says_it_is_a_4_9_7_client() -> None:
    """Apache RocketMQ's broker reads a send-back's maxReconsumeTimes only from a client of
    V3_4_9 or later (version 0 got the group's 16 retries), and tells consumers of an
    admin's offset reset only from V3_0_7 on."""
    got = asyncio.run(with_fastjson_peers({"Known"}))
    assert {c.code for c in got} >= {
        RequestCode.GET_ROUTEINFO_BY_TOPIC,
        RequestCode.GET_BROKER_CLUSTER_INFO,
        RequestCode.SEND_MESSAGE,
        RequestCode.UNREGISTER_CLIENT,
    }
    assert {c.version for c in got} == {MQVersion.V4_9_7} == {593}


def test_a_pull_carries_every_field_the_real_broker_requires() -> None:
    """PullMessageRequestHeader's CFNotNull fields (4.9.7), subVersion among them."""
    fields = PullMessageRequestHeader("G", "T", 0, 0).fields()
    assert set(fields) >= {
        "consumerGroup",
        "topic",
        "queueId",
        "queueOffset",
        "maxMsgNums",
        "sysFlag",
        "commitOffset",
        "suspendTimeoutMillis",
        "subVersion",
    }


def test_a_lite_pull_waits_for_a_long_poll_held_past_its_suspend_time() -> None:
    """Apache RocketMQ's broker answers a held pull at its next 5 s check after
    suspendTimeoutMillis: the client waits that long, not suspend + request timeout (it
    timed out, logged, and waited pull_delay_on_error_s before pulling again)."""
    pulls: list[float] = []
    commits: list[tuple[int, int]] = []  # sysFlag & 1, commitOffset of each pull
    late_s = 1.2  # past suspend + request timeout, within the broker's 5 s check

    async def pull(cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        h = PullMessageRequestHeader.decode(cmd)
        pulls.append(asyncio.get_running_loop().time())
        commits.append((h.sys_flag & FLAG_COMMIT_OFFSET, h.commit_offset))
        await asyncio.sleep(h.suspend_timeout_millis / 1000 + late_s)
        out = PullMessageResponseHeader(h.queue_offset, 0, 0)
        return response_to(cmd, R.PULL_NOT_FOUND, fields=out.fields())

    async def offset(cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        return response_to(cmd, R.SUCCESS, fields=OffsetResponseHeader(0).fields())

    async def ok(cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        return response_to(cmd, R.SUCCESS)

    async def t() -> None:
        broker = await serve(
            {
                RequestCode.PULL_MESSAGE: pull,
                RequestCode.QUERY_CONSUMER_OFFSET: offset,
                RequestCode.HEART_BEAT: ok,
                RequestCode.UNREGISTER_CLIENT: ok,
                RequestCode.UPDATE_CONSUMER_OFFSET: ok,
            }
        )
        route = TopicRouteData(
            [QueueData("broker-r", 1, 1)],
            [BrokerData("interop", "broker-r", {0: f"127.0.0.1:{broker.port}"})],
        ).encode()

        async def routes(cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
            return response_to(cmd, R.SUCCESS, body=route)

        ns = await serve({RequestCode.GET_ROUTEINFO_BY_TOPIC: routes})
        config = ClientConfig(f"127.0.0.1:{ns.port}", request_timeout_s=0.5)
        consumer = LitePullConsumer(
            config, "G", ConsumerOptions(suspend_ms=300, pull_delay_on_error_s=5.0)
        )
        try:
            await consumer.assign([MessageQueue("T", "broker-r", 0)])
            await consumer.start()
            async with asyncio.timeout(10):
                while len(pulls) < 2:
                    await asyncio.sleep(0.05)
        finally:
            await consumer.shutdown()
            await ns.close()
            await broker.close()
        # The second pull followed the first one's (late) answer, not a timeout + 5 s delay.
        assert pulls[1] - pulls[0] < 0.3 + late_s + 1.0
        # A lite pull consumer's pulls carry no offset (DefaultLitePullConsumer: commit only).
        assert set(commits) == {(0, -1)}

    asyncio.run(t())


def test_an_offset_reset_from_the_real_broker_is_committed_by_the_consumer() -> None:
    """RESET_CONSUMER_CLIENT_OFFSET as Apache RocketMQ 4.9.7's broker sends it (a
    ResetOffsetBody keyed by MessageQueue, fastjson): it commits nothing itself, so the
    consumer commits the new offsets before taking its queues again (as MQClientInstance
    .resetOffset); else it read back its old offsets and nothing was consumed again."""
    body = (
        b'{"offsetTable":{{"brokerName":"broker-r","queueId":0,"topic":"T"}:0,'
        b'{"brokerName":"broker-r","queueId":1,"topic":"T"}:3}}'
    )
    commits: list[tuple[MessageQueue, int]] = []

    async def commit(mq: MessageQueue, offset: int) -> None:
        commits.append((mq, offset))

    async def fetch(mq: MessageQueue) -> int:
        return 8

    async def t() -> None:
        consumer = PushConsumer("127.0.0.1:9876", "G", lambda msgs, ctx: None)
        consumer.offset_store = RemoteBrokerOffsetStore(fetch, commit)
        consumer._rebalance_lock = asyncio.Lock()
        for q in (0, 1):
            consumer.offset_store.update(MessageQueue("T", "broker-r", q), 8)
        header = {"topic": "T", "group": "G", "timestamp": "0", "isForce": "true"}
        note = request(RequestCode.RESET_CONSUMER_CLIENT_OFFSET, header, body)
        await consumer._on_reset_offset(note, None)  # type: ignore[arg-type]

    asyncio.run(t())
    assert commits == [(MessageQueue("T", "broker-r", 0), 0), (MessageQueue("T", "broker-r", 1), 3)]


def test_a_pull_carries_a_commit_offset_only_past_zero() -> None:
    """As DefaultMQPushConsumerImpl (commitOffsetValue > 0): a queue's first pulls carried
    its start, 0; the real broker handled one after the consumer's commit and stored the 0
    ("[NOTIFYME]update consumer offset less than store ... requestOffset=0, storeOffset=6")."""
    flags: list[tuple[int, int]] = []

    async def pull(cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        h = PullMessageRequestHeader.decode(cmd)
        flags.append((h.sys_flag & FLAG_COMMIT_OFFSET, h.commit_offset))
        out = PullMessageResponseHeader(h.queue_offset, 0, 0)
        return response_to(cmd, R.PULL_NOT_FOUND, fields=out.fields())

    async def t() -> None:
        broker = await serve({RequestCode.PULL_MESSAGE: pull})
        instance = ClientInstance(
            ClientConfig("127.0.0.1:9876"), "c", lambda: HeartbeatData("c"), lambda: []
        )
        instance.brokers["broker-r"] = {0: f"127.0.0.1:{broker.port}"}
        puller = Puller(instance, "G")
        try:
            for commit in (0, 5):
                await puller.pull(MessageQueue("T", "broker-r", 0), parse("T", "*"), 0, 32, commit)
        finally:
            await instance.close()
            await broker.close()

    asyncio.run(t())
    assert flags == [(0, -1), (FLAG_COMMIT_OFFSET, 5)]
