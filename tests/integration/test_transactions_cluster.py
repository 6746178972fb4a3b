"""Transactional messages through a real cluster, as RocketMQ 4.9 keeps them: half messages
invisible until committed, the committed message and the op message byte for byte as the
broker writes them, rollback, the check-back deciding an unknown or abandoned transaction,
and a transaction nobody answers for ending in TRANS_CHECK_MAX_TIME_TOPIC."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from broker_runtime.client.consumer_options import ConsumerOptions
from broker_runtime.client.model import ReceivedMessage, new_message
from broker_runtime.client.push_consumer import PushConsumer
from broker_runtime.client.transaction_producer import LocalTransactionState as S
from broker_runtime.client.transaction_producer import TransactionProducer
from broker_runtime.common.message import (
    PRODUCER_GROUP,
    REAL_QUEUE_ID,
    REAL_TOPIC,
    TRAN_MSG,
    TRANSACTION_CHECK_TIMES,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_MASK,
    Message,
    StoredMessage,
    decode_offset_msg_id,
)
from broker_runtime.common.topics import (
    TRANS_CHECK_MAX_TIME_TOPIC,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
)
from broker_runtime.remoting.headers import EndTransactionRequestHeader
from broker_runtime.remoting.protocol import RequestCode, ResponseCode
from tests.integration.cluster_fixtures import Cluster, RawClient, running_cluster
from tests.integration.test_clients_cluster import FIRST, collector, config, create_topic, until

pytestmark = pytest.mark.integration

CHECK_MAX = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    settings = {
        "transaction_timeout_ms": "300",
        "transaction_check_interval_ms": "300",
        "transaction_check_max": str(CHECK_MAX),
    }
    with running_cluster(
        tmp_path_factory.mktemp("tx") / "c", name_servers=1, slaves=False, settings=settings
    ) as c:
        yield c


class Listener:
    """Answers from tables keyed by message body; counts the checks it was asked."""

    def __init__(self, execute: dict[str, S], check: dict[str, S | None]) -> None:
        self.execute_answers, self.check_answers = execute, check
        self.checks: dict[str, int] = {}

    def execute(self, msg: Message, arg: object) -> S:
        return self.execute_answers[msg.body.decode()]

    async def check(self, msg: ReceivedMessage) -> S:
        body = msg.msg.body.decode()
        self.checks[body] = self.checks.get(body, 0) + 1
        answer = self.check_answers.get(body)
        if answer is None:  # a checker that never answers: the broker hears nothing
            await asyncio.sleep(3600)
        return answer or S.UNKNOW


async def read_all(raw: RawClient, addr: str, topic: str) -> list[StoredMessage]:
    resp, msgs = await raw.pull(addr, topic, 0, 0, max_nums=256)
    return msgs if resp.code == ResponseCode.SUCCESS else []


def test_commit_rollback_and_the_check_back_end_each_transaction_as_rocketmq(
    cluster: Cluster,
) -> None:
    async def t() -> None:
        ns, topic, addr = cluster.namesrv_addr, "TxT", cluster.addr("broker-a-master")
        await create_topic(ns, topic, queues=2, brokers=1)
        listener = Listener(
            execute={"commit": S.COMMIT_MESSAGE, "rollback": S.ROLLBACK_MESSAGE,
                     "unknown-then-commit": S.UNKNOW, "never-answered": S.UNKNOW},
            check={"unknown-then-commit": S.COMMIT_MESSAGE, "never-answered": None},
        )  # fmt: skip
        got: list[ReceivedMessage] = []
        consumer = PushConsumer(
            config(ns, "c"), "g-tx", collector(got), ConsumerOptions(consume_from=FIRST)
        )
        consumer.subscribe(topic)
        raw = RawClient()
        results = {}
        async with TransactionProducer(config(ns, "p"), "tx-producer", listener) as producer:
            for body in listener.execute_answers:
                msg = new_message(topic, body.encode(), keys=body)
                results[body] = await producer.send_in_transaction(msg)
            async with consumer:
                await until(lambda: len(got) >= 2, 30, "the committed messages")
                # The check gives up on the one nobody answers for after CHECK_MAX checks.
                await until(
                    lambda: listener.checks.get("never-answered", 0) >= CHECK_MAX, 30, "checks"
                )
                parked: list[StoredMessage] = []
                for _ in range(100):
                    parked = await read_all(raw, addr, TRANS_CHECK_MAX_TIME_TOPIC)
                    if parked:
                        break
                    await asyncio.sleep(0.1)
                await asyncio.sleep(1.0)  # room for a wrong delivery to show up
        try:
            delivered = {m.msg.body.decode(): m.msg for m in got}
            assert sorted(delivered) == ["commit", "unknown-then-commit"]
            assert len(got) == 2  # each committed once
            assert [m.body for m in parked] == [b"never-answered"]
            assert int(parked[0].properties[TRANSACTION_CHECK_TIMES]) == CHECK_MAX
            assert listener.checks.get("commit", 0) == listener.checks.get("rollback", 0) == 0
            halves = await read_all(raw, addr, TRANS_HALF_TOPIC)
            ops = await read_all(raw, addr, TRANS_OP_HALF_TOPIC)
            first = {
                h.body.decode(): h for h in halves if TRANSACTION_CHECK_TIMES not in h.properties
            }
            for body, committed in delivered.items():
                half = next(h for h in halves if h.body == committed.body and
                            h.phys_offset == committed.prepared_transaction_offset)  # fmt: skip
                assert committed.sys_flag & TRANSACTION_MASK == TRANSACTION_COMMIT_TYPE
                assert committed.queue_id == int(half.properties[REAL_QUEUE_ID])
                assert committed.uniq_key == first[body].uniq_key == results[body].send.msg_id
                # RocketMQ 4.9.7 writes these into committed units too (see transactions.py).
                assert committed.properties[TRAN_MSG] == "true"
                assert committed.properties[REAL_TOPIC] == topic
                assert committed.properties[PRODUCER_GROUP] == "tx-producer"
                assert str(half.queue_offset).encode() in {op.body for op in ops}
            rolled = first["rollback"]
            assert str(rolled.queue_offset).encode() in {op.body for op in ops}
            assert all(op.tags == "d" for op in ops)
            assert delivered["unknown-then-commit"].properties[TRANSACTION_CHECK_TIMES] == "1"
        finally:
            await raw.close()

    asyncio.run(t())


def test_an_end_for_the_wrong_group_or_offset_is_refused(cluster: Cluster) -> None:
    async def t() -> None:
        ns, topic, addr = cluster.namesrv_addr, "TxRefused", cluster.addr("broker-a-master")
        await create_topic(ns, topic, queues=1, brokers=1)
        listener = Listener(execute={"x": S.UNKNOW}, check={"x": S.UNKNOW})
        async with TransactionProducer(config(ns, "p2"), "tx-owner", listener) as producer:
            sent = (await producer.send_in_transaction(new_message(topic, b"x"))).send
        raw = RawClient()
        try:
            _, phys = decode_offset_msg_id(sent.offset_msg_id)
            qo = sent.queue_offset
            cases = {
                "The producer group wrong": ("someone-else", qo, phys),
                "The transaction state table offset wrong": ("tx-owner", qo + 7, phys),
                "Find prepared transaction message failed": ("tx-owner", qo, phys + 1),
            }
            for remark, (group, qo, offset) in cases.items():
                h = EndTransactionRequestHeader(group, qo, offset, TRANSACTION_COMMIT_TYPE)
                resp = await raw.call(addr, RequestCode.END_TRANSACTION, h.fields())
                assert (resp.code, resp.remark) == (ResponseCode.SYSTEM_ERROR, remark)
            resp, msgs = await raw.pull(addr, topic, 0, 0)
            assert msgs == []  # nothing was committed
        finally:
            await raw.close()

    asyncio.run(t())
