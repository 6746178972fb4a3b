"""`mqaudit admin resume-check` on a real cluster: a transaction the check-back gave up on
(TRANS_CHECK_MAX_TIME_TOPIC) goes back under checking with its check count reset, the
check-back asks its producer again, and the commit reaches a consumer; a second resume is
refused, as is an id that was never given up on."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator

import pytest

from broker_runtime.client.consumer_options import ConsumerOptions
from broker_runtime.client.model import ReceivedMessage, new_message
from broker_runtime.client.push_consumer import PushConsumer
from broker_runtime.client.transaction_producer import LocalTransactionState as S
from broker_runtime.client.transaction_producer import TransactionProducer
from broker_runtime.common.message import TRANSACTION_CHECK_TIMES, Message
from broker_runtime.common.topics import TRANS_CHECK_MAX_TIME_TOPIC, TRANS_HALF_TOPIC
from tests.conftest import mqaudit_cmd
from tests.integration.cluster_fixtures import Cluster, RawClient, running_cluster
from tests.integration.test_clients_cluster import FIRST, collector, config, create_topic, until
from tests.integration.test_transactions_cluster import read_all

pytestmark = pytest.mark.integration

CHECK_MAX = 2


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    settings = {
        "transaction_timeout_ms": "300",
        "transaction_check_interval_ms": "300",
        "transaction_check_max": str(CHECK_MAX),
    }
    with running_cluster(
        tmp_path_factory.mktemp("resume") / "c", name_servers=1, slaves=False, settings=settings
    ) as c:
        yield c


class Listener:
    """UNKNOW until `decided`; then COMMIT. Counts the checks."""

    def __init__(self) -> None:
        self.decided = False
        self.checks = 0

    def execute(self, msg: Message, arg: object) -> S:
        return S.UNKNOW

    def check(self, msg: ReceivedMessage) -> S:
        self.checks += 1
        return S.COMMIT_MESSAGE if self.decided else S.UNKNOW


def resume(c: Cluster, msg_id: str) -> subprocess.CompletedProcess[str]:
    argv = ["admin", "resume-check", "--namesrv", c.namesrv_addr, "--id", msg_id, "--json"]
    return subprocess.run(mqaudit_cmd(*argv), capture_output=True, text=True, timeout=60)


def test_a_given_up_transaction_is_checked_again_and_committed(cluster: Cluster) -> None:
    async def t() -> None:
        ns, topic, addr = cluster.namesrv_addr, "ResumeT", cluster.addr("broker-a-master")
        await create_topic(ns, topic, queues=2, brokers=1)
        listener = Listener()
        got: list[ReceivedMessage] = []
        consumer = PushConsumer(
            config(ns, "rc"), "g-resume", collector(got), ConsumerOptions(consume_from=FIRST)
        )
        consumer.subscribe(topic)
        raw = RawClient()
        try:
            async with TransactionProducer(config(ns, "rp"), "tx-resume", listener) as producer:
                sent = await producer.send_in_transaction(new_message(topic, b"resume-me"))
                msg_id = sent.send.msg_id
                parked: list = []

                async def given_up() -> bool:
                    parked[:] = await read_all(raw, addr, TRANS_CHECK_MAX_TIME_TOPIC)
                    return bool(parked)

                for _ in range(300):
                    if await given_up():
                        break
                    await asyncio.sleep(0.1)
                assert [m.uniq_key for m in parked] == [msg_id]
                assert int(parked[0].properties[TRANSACTION_CHECK_TIMES]) == CHECK_MAX
                checks_before = listener.checks
                listener.decided = True
                out = await asyncio.to_thread(resume, cluster, msg_id)
                assert out.returncode == 0, out.stderr
                [row] = json.loads(out.stdout)
                assert (row["msg_id"], row["broker"], row["topic"]) == (msg_id, "broker-a", topic)
                assert (row["producer_group"], row["checks_before"]) == ("tx-resume", CHECK_MAX)
                async with consumer:
                    await until(lambda: len(got) >= 1, 30, "the resumed transaction's commit")
                    await asyncio.sleep(1.0)  # room for a second commit to show up
            assert [m.msg_id for m in got] == [msg_id] and listener.checks == checks_before + 1
            halves = [
                h for h in await read_all(raw, addr, TRANS_HALF_TOPIC) if h.uniq_key == msg_id
            ]
            resumed = next(h for h in halves if h.queue_offset == row["half_queue_offset"])
            assert TRANSACTION_CHECK_TIMES not in resumed.properties  # the count starts again
            assert got[0].msg.prepared_transaction_offset in {h.phys_offset for h in halves}
            again = await asyncio.to_thread(resume, cluster, msg_id)
            assert again.returncode == 2 and "already back under checking" in again.stderr
            never = await asyncio.to_thread(resume, cluster, "0A000001000000000000000000000000")
            assert never.returncode == 2 and "is not in TRANS_CHECK_MAX_TIME_TOPIC" in never.stderr
        finally:
            await raw.close()

    asyncio.run(t())
