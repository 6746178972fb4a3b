"""mqaudit's own clients against Apache RocketMQ's name server and broker, with the official
Java client and mqadmin as referees: what ours send, the official consumer sees; what the
official producer sends, ours receive; offsets ours commit, the official tools read back.

Every message is held to its other side whole: body, msgId (UNIQ_KEY), KEYS, TAGS, every
property (the sender's, plus only those the broker and the receiving client are known to add),
queue and offset; nothing missing, nothing extra.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from broker_runtime.client.config import ClientConfig
from broker_runtime.client.consume_service import ConsumeContext
from broker_runtime.client.consumer_options import ConsumerOptions
from broker_runtime.client.lite_pull_consumer import LitePullConsumer
from broker_runtime.client.model import ConsumeStatus, MessageModel, ReceivedMessage, SendResult
from broker_runtime.client.orderly import OrderlyPushConsumer
from broker_runtime.client.producer import Producer
from broker_runtime.client.push_consumer import PushConsumer
from broker_runtime.client.sync import SyncProducer
from broker_runtime.common.message import UNIQ_KEY, Message
from broker_runtime.offsets.consumer_filters import (
    ConsumerFilterManager,
    consumer_filter_path,
    encode_filters,
)
from tests.interop.conftest import RealRocketMQ
from tests.interop.our_clients_checks import (
    BROKER_ADDS,
    FIRST,
    JAVA_CONSUMER_ADDS,
    Got,
    check_ours_seen_by_ours,
    check_seen_by_java,
    check_seen_by_ours,
    consumer_progress,
    mqaudit,
    mqaudit_out,
    nth,
    ours,
    progress_table,
)
from tests.interop.rocketmq import java, mqadmin

pytestmark = [pytest.mark.integration, pytest.mark.interop]


def test_what_our_producers_send_the_official_consumer_receives(
    real_rocketmq: RealRocketMQ,
) -> None:
    ns, topic = real_rocketmq.namesrv_addr, "OurProducersT"
    sent: list[tuple[Message, SendResult | None]] = []

    async def produce() -> None:
        async with Producer(ns, "oc_producer") as p:
            msgs = [ours(topic, i) for i in range(10)]
            sent.append((msgs[0], await p.send(msgs[0])))
            sent.append((msgs[1], await p.send_async(msgs[1])))
            await p.send_oneway(msgs[2])
            sent.append((msgs[2], None))
            batch = await p.send_batch(msgs[3:6])
            sent.extend((m, nth(batch, k)) for k, m in enumerate(msgs[3:6]))
            for m in msgs[6:8]:  # ordered: one sharding key, one queue
                sent.append((m, await p.send_orderly(m, "order-1")))
            assert sent[-1][1] and sent[-2][1] and sent[-1][1].mq == sent[-2][1].mq
            delayed = ours(topic, 8, delay_level=2)
            sent.append((delayed, await p.send(delayed)))

    asyncio.run(produce())
    with SyncProducer(Producer(ns, "oc_sync_producer")) as sp:
        m = ours(topic, 10)
        sent.append((m, sp.send(m)))
        pair = [ours(topic, 11), ours(topic, 12)]
        batch = sp.send_batch(pair)
        sent += [(m, nth(batch, k)) for k, m in enumerate(pair)]
        m = ours(topic, 13)
        sent.append((m, sp.send_async(m).result(30)))
        m = ours(topic, 14)
        sp.send_oneway(m)
        sent.append((m, None))
    cli_args = f"--topic {topic} --count 3 --keys --tags TagC --size 16".split()
    summary = mqaudit("produce", "--namesrv", ns, *cli_args)
    assert (summary["sent"], summary["failed"], summary["statuses"]) == (3, 0, {"SEND_OK": 3})

    reader = f"--topic {topic} --group oc_java_reader --expect {len(sent) + 3} --idle-ms 10000"
    rows = java("PushConsumer", "--namesrv", ns, *reader.split())
    got = [r for r in rows if "msgId" in r]
    by_body = {r["body"]: r for r in got}
    assert len(by_body) == len(got) == len(sent) + 3  # each once, nothing else
    seen = {r["msgId"]: r for r in got}
    for msg, result in sent:
        check_seen_by_java(by_body.pop(msg.body.decode()), msg, result)
    # `mqaudit admin query-msg` finds one by UNIQ_KEY on the real broker (QUERY_MESSAGE, its
    # index), as the official consumer saw it.
    msg, _ = sent[0]
    uid = msg.properties[UNIQ_KEY]
    (found,) = mqaudit(
        "admin", "query-msg", "--namesrv", ns, "--topic", topic, "--id", uid, "--json"
    )
    java_row = seen[uid]
    java_props = {k: v for k, v in java_row["properties"].items() if k not in JAVA_CONSUMER_ADDS}
    assert found["properties"] == java_props
    for name in ("msgId", "topic", "queueId", "queueOffset", "commitLogOffset", "body"):
        assert found[name] == java_row[name], name
    for i in range(3):  # the CLI's: body "msg-i:" padded to --size, key key-i, its tag
        row = by_body.pop(f"msg-{i}:" + "x" * (16 - len(f"msg-{i}:")))
        assert (row["keys"], row["tags"]) == (f"key-{i}", "TagC")
        assert (
            set(row["properties"])
            == {"UNIQ_KEY", "KEYS", "TAGS"} | BROKER_ADDS | JAVA_CONSUMER_ADDS
        )
        assert row["msgId"] == row["properties"][UNIQ_KEY]
    assert by_body == {}


def test_what_the_official_producer_sends_our_consumers_receive(
    real_rocketmq: RealRocketMQ, tmp_path: Path
) -> None:
    ns, topic = real_rocketmq.namesrv_addr, "OfficialProducerT"
    sender = f"--topic {topic} --count 8 --mode ordered --shards 2 --tags TagA --keys k"
    sender += " --prop color=red"  # message i: body-i, key k-i; queue i % 2, in order
    acks = [r for r in java("Producer", "--namesrv", ns, *sender.split()) if "status" in r]
    assert [a["status"] for a in acks] == ["SEND_OK"] * 8
    official = {a["msgId"]: a for a in acks}
    mine: dict[str, tuple[Message, SendResult]] = {}  # TagB: what the tag filter leaves out
    push, orderly, lite, bcast = Got(), Got(), Got(), [Got(), Got()]

    async def run() -> None:
        async with Producer(ns, "oc_producer") as p:
            for i in (100, 102, 104, 106):  # even: TagB
                m = ours(topic, i)
                r = await p.send(m)
                mine[r.msg_id] = (m, r)
        consumers = [
            PushConsumer(ns, "oc_push_tags", push.listener, ConsumerOptions(consume_from=FIRST)),
            OrderlyPushConsumer(
                ns, "oc_orderly", orderly.listener, ConsumerOptions(consume_from=FIRST)
            ),
            *(
                PushConsumer(
                    ClientConfig(ns, instance_name=f"b{k}"),
                    "oc_bcast",
                    got.listener,
                    ConsumerOptions(
                        consume_from=FIRST,
                        message_model=MessageModel.BROADCASTING,
                        offsets_dir=tmp_path / f"b{k}",
                    ),
                )
                for k, got in enumerate(bcast)
            ),
        ]
        consumers[0].subscribe(topic, "TagA")
        consumers[1].subscribe(topic, "TagA")
        for c in consumers[2:]:
            c.subscribe(topic, "*")
        puller = LitePullConsumer(
            ns, "oc_lite", ConsumerOptions(consume_from=FIRST), auto_commit=False
        )
        puller.subscribe(topic, "*")
        for c in [*consumers, puller]:
            await c.start()
        try:
            while len(lite.msgs) < 12:
                lite.add(await puller.poll(5.0))
            await puller.commit()
            await asyncio.gather(push.wait(8), orderly.wait(8), *(g.wait(12) for g in bcast))
            # mqadmin moves the push group back to the start: the broker tells our consumer
            # (a client below V3_0_7 is refused), which commits that and reads from there.
            await consumers[0].persist_offsets()  # the broker has the group at the end
            args = ("resetOffsetByTime", "-g", "oc_push_tags", "-t", topic, "-s", "0")
            await asyncio.to_thread(mqadmin, ns, *args)
            await push.wait(16)
            highest = {
                mq: max(m.queue_offset for m in lite.msgs if m.mq == mq) + 1
                for mq in puller.pq_table
            }
            assert {mq: await puller.committed(mq) for mq in highest} == highest
        finally:
            for c in [*consumers, puller]:
                await c.shutdown()

    asyncio.run(run())
    # The tag filter: TagA only, each once, then each once more after the reset.
    assert sorted(m.msg_id for m in push.msgs[:8]) == sorted(official)
    assert sorted(m.msg_id for m in push.msgs[8:]) == sorted(official)
    assert sorted(m.msg_id for m in orderly.msgs) == sorted(official)
    for q in (0, 1):  # orderly: each queue in the order its shard was sent
        assert [int(m.body[5:]) for m in orderly.msgs if m.queue_id == q] == list(range(q, 8, 2))
    for got in [push, orderly, lite, *bcast]:
        if got in (lite, *bcast):  # no filter: every message, each once
            assert sorted(m.msg_id for m in got.msgs) == sorted([*official, *mine])
        for m in got.msgs:
            if m.msg_id in official:
                check_seen_by_ours(m, official[m.msg_id], topic)
            else:
                check_ours_seen_by_ours(m, *mine[m.msg_id])

    # The offsets ours committed, as the official tools read them back: mqadmin shows the
    # push group at the end of every queue (the filtered TagB ones passed too) ...
    progress = consumer_progress(ns, "oc_push_tags")
    queues = {k: v for k, v in progress.items() if k[0] == topic}
    assert len(queues) == 4 and all(broker == mine_ for broker, mine_ in queues.values())
    assert sum(broker for broker, _ in queues.values()) == 12
    # `mqaudit admin` reads the same from the real broker (ConsumeStats keyed by queue).
    ours_view = mqaudit_out(
        "admin", "consumer-progress", "--namesrv", ns, "--group", "oc_push_tags"
    )
    assert progress_table(ours_view) == progress
    status = mqaudit_out("admin", "topic-status", "--namesrv", ns, "--topic", topic).splitlines()
    max_offsets = {(topic, int(r[1])): int(r[3]) for r in map(str.split, status[1:])}
    assert max_offsets == {k: broker for k, (broker, _) in queues.items()}
    # ... and the official LitePullConsumer of the lite-pull group starts where it committed.
    later: dict[str, tuple[Message, SendResult]] = {}

    async def two_more() -> None:
        async with Producer(ns, "oc_producer") as p:
            for i in (200, 201):
                m = ours(topic, i)
                r = await p.send(m)
                later[r.msg_id] = (m, r)

    asyncio.run(two_more())
    reader = f"--topic {topic} --group oc_lite --expect 2 --idle-ms 10000"
    rows = java("LitePullConsumer", "--namesrv", ns, *reader.split())
    got_ids = [r["msgId"] for r in rows if "msgId" in r]
    assert sorted(got_ids) == sorted(later)
    for r in rows:
        if "msgId" in r:
            check_seen_by_java(
                r, *later[r["msgId"]], adds=BROKER_ADDS | {"MIN_OFFSET", "MAX_OFFSET"}
            )

    cli_args = f"--group oc_cli --topic {topic} --count 14 --timeout 10".split()
    assert mqaudit("consume", "--namesrv", ns, *cli_args) == {"consumed": 14, "unique": 14}
    # What it committed as it stopped stays: the end of every queue.
    cli_view = mqaudit_out("admin", "consumer-progress", "--namesrv", ns, "--group", "oc_cli")
    cli_progress = {k: v for k, v in progress_table(cli_view).items() if k[0] == topic}
    assert len(cli_progress) == 4 and sum(b for b, _ in cli_progress.values()) == 14
    assert all(broker == committed for broker, committed in cli_progress.values()), cli_view


def test_failed_messages_go_to_retry_then_dlq_on_the_real_broker(
    real_rocketmq: RealRocketMQ,
) -> None:
    """Our push consumer (no queue lock: the real broker has none) fails the odd messages
    every time, with maxReconsumeTimes 1: the broker redelivers each once through
    %RETRY%{group}, then dead-letters it in %DLQ%{group}, where the official consumer
    finds it whole, with the lineage the broker wrote."""
    ns, topic, group = real_rocketmq.namesrv_addr, "OurRetryT", "oc_retry"
    sent: dict[str, tuple[Message, SendResult]] = {}
    got = Got()

    async def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeStatus:
        got.add(msgs)
        failing = int(msgs[0].body[5:]) % 2
        return ConsumeStatus.RECONSUME_LATER if failing else ConsumeStatus.CONSUME_SUCCESS

    async def run() -> PushConsumer:
        async with Producer(ns, "oc_producer") as p:
            for i in range(4):
                m = ours(topic, i)
                r = await p.send(m)
                sent[r.msg_id] = (m, r)
        consumer = PushConsumer(
            ns, group, listener, ConsumerOptions(consume_from=FIRST), max_reconsume_times=1
        )
        consumer.subscribe(topic, "*")
        await consumer.start()
        try:
            await got.wait(6)  # 2 good once, 2 failing twice
            async with asyncio.timeout(30):
                while consumer.retry.sent_back < 4:  # 2 to %RETRY%, then 2 to %DLQ%
                    await asyncio.sleep(0.05)
        finally:
            await consumer.shutdown()
        return consumer

    consumer = asyncio.run(run())
    assert (consumer.retry.sent_direct, consumer.retry.failed) == (0, 0)
    failing = {uid for uid, (m, _) in sent.items() if int(m.body[5:]) % 2}
    firsts = [m for m in got.msgs if m.reconsume_times == 0]
    retries = [m for m in got.msgs if m.reconsume_times == 1]
    assert sorted(m.msg_id for m in firsts) == sorted(sent)
    assert sorted(m.msg_id for m in retries) == sorted(failing)
    for m in firsts:
        check_ours_seen_by_ours(m, *sent[m.msg_id])
    for m in retries:  # from %RETRY%oc_retry, its first topic given back (resetRetryTopic)
        msg, result = sent[m.msg_id]
        assert (m.topic, m.body, m.queue_id) == (topic, msg.body, 0)
        assert m.properties == {
            **msg.properties,
            "CLUSTER": "interop",
            "RETRY_TOPIC": topic,
            "ORIGIN_MESSAGE_ID": result.offset_msg_id,
            "REAL_TOPIC": f"%RETRY%{group}",
            "REAL_QID": "0",
            "DELAY": "3",  # 3 + reconsumeTimes, the broker's choice for level 0 (1 s here)
            "WAIT": "false",
        }

    progress = consumer_progress(ns, group)  # offsets as mqadmin reads them back
    assert progress[(f"%RETRY%{group}", 0)] == (2, 2)
    assert sorted(v for (t, _), v in progress.items() if t == topic) == [(1, 1)] * 4

    reader = f"--topic %DLQ%{group} --group oc_dlq_reader --expect 2 --idle-ms 10000"
    rows = java("LitePullConsumer", "--namesrv", ns, *reader.split())
    dead = {r["msgId"]: r for r in rows if "msgId" in r}
    assert set(dead) == failing
    for uid, row in dead.items():
        msg, result = sent[uid]
        lineage = {
            "RETRY_TOPIC": topic,
            "ORIGIN_MESSAGE_ID": result.offset_msg_id,
            "REAL_TOPIC": f"%RETRY%{group}",
            "REAL_QID": "0",
            "DELAY": "0",
            "WAIT": "false",
        }
        dlq_copy = Message(f"%DLQ%{group}", msg.body, {**msg.properties, **lineage})
        check_seen_by_java(row, dlq_copy, None, adds=BROKER_ADDS | {"MIN_OFFSET", "MAX_OFFSET"})
        assert (row["topic"], row["reconsumeTimes"]) == (f"%DLQ%{group}", 2)


def test_our_sql92_subscription_is_kept_as_the_real_broker_keeps_it(
    real_rocketmq: RealRocketMQ, tmp_path: Path
) -> None:
    """The real broker's consumerFilter.json (written every 10 s) after our SQL92 consumer's
    heartbeats: the same entry mqaudit's broker writes for that subscription, Bloom filter
    bits and all; its clientVersion is our subscription's subVersion."""
    ns, topic, group = real_rocketmq.namesrv_addr, "OurFilterT", "oc_sql_filter"
    expression = "color = 'red' AND n BETWEEN 1 AND 5"
    store = Path(real_rocketmq.broker.settings["storePathRootDir"])

    def kept() -> dict[str, Any] | None:
        path = consumer_filter_path(store)
        by_topic = json.loads(path.read_text())["filterDataByTopic"] if path.exists() else {}
        return by_topic.get(topic, {}).get("groupFilterData", {}).get(group)

    async def run() -> tuple[int, dict[str, Any]]:
        async with Producer(ns, "oc_producer") as p:  # the topic exists before the route query
            await p.send(ours(topic, 0))
        consumer = PushConsumer(ns, group, Got().listener, ConsumerOptions(consume_from=FIRST))
        consumer.subscribe(topic, expression, "SQL92")
        await consumer.start()
        try:
            async with asyncio.timeout(40):
                while (entry := kept()) is None:
                    await asyncio.sleep(0.2)
        finally:
            await consumer.shutdown()
        return consumer.subscriptions[topic].sub_version, entry

    version, real = asyncio.run(run())
    assert (real["clientVersion"], real["deadTime"], real["dead"]) == (version, 0, False)
    mine = ConsumerFilterManager(tmp_path, now_ms=0)
    mine.register_group(group, [(topic, expression, "SQL92", version)], real["bornTime"])
    assert encode_filters(mine.entries())["filterDataByTopic"][topic] == {
        "groupFilterData": {group: real},
        "topic": topic,
    }
