"""Clients under failure on a real cluster: a consumer killed with an unacked message (seed
002 2.3: redelivery from the lowest unacked offset), and reads from the slave once the
master is gone."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from broker_runtime.client.admin import MQAdmin
from broker_runtime.client.consumer_options import ConsumerOptions
from broker_runtime.client.model import ReceivedMessage
from broker_runtime.client.push_consumer import PushConsumer
from tests.integration.cluster_fixtures import running_cluster
from tests.integration.test_clients_cluster import (
    FIRST,
    collector,
    config,
    create_topic,
    produce,
    until,
)

pytestmark = pytest.mark.integration

# A consumer process that records each message it finished and never finishes `hold`.
STUCK_CONSUMER = r"""
import asyncio, sys
from broker_runtime.client.config import ClientConfig
from broker_runtime.client.consumer_options import ConsumerOptions
from broker_runtime.client.model import ConsumeFromWhere, ConsumeStatus
from broker_runtime.client.push_consumer import PushConsumer

ns, group, topic, out, hold = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])

async def main():
    log = open(out, "a", buffering=1)

    async def listener(msgs, ctx):
        for m in msgs:
            if m.queue_offset == hold:
                await asyncio.Event().wait()  # stuck: this message is never acked
            log.write(f"{m.queue_offset} {m.msg_id}\n")
        return ConsumeStatus.CONSUME_SUCCESS

    c = PushConsumer(
        ClientConfig(ns, persist_offset_interval_s=0.5), group, listener,
        ConsumerOptions(consume_from=ConsumeFromWhere.FIRST_OFFSET), threads=4,
    )
    c.subscribe(topic)
    await c.start()
    await asyncio.Event().wait()

asyncio.run(main())
"""


def test_killed_consumer_is_redelivered_from_its_lowest_unacked_offset(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    with running_cluster(tmp_path / "c", groups=("broker-a",), slaves=False) as cluster:
        ns, topic, group = cluster.namesrv_addr, "KILL", "g-kill"
        out = tmp_path / "first-run.txt"

        async def setup() -> list[str]:
            await create_topic(ns, topic, queues=1, brokers=1)
            return await produce(ns, topic, 50)

        sent = asyncio.run(setup())
        child = subprocess.Popen(
            [sys.executable, "-c", STUCK_CONSUMER, ns, group, topic, str(out), "10"],
            env=cli_env,
            stderr=subprocess.DEVNULL,
        )
        try:

            async def committed_offset() -> int:
                async with MQAdmin(ns) as admin:
                    rows = await admin.consumer_progress(group, topic)
                return int(rows[0]["consumerOffset"])

            async def wait_for_child() -> None:
                def lines() -> int:
                    return len(out.read_text().splitlines()) if out.exists() else 0

                await until(lambda: lines() == 49, 60, "49 messages done, offset 10 stuck")
                for _ in range(100):  # the commit reaches the broker within a second or so
                    if await committed_offset() == 10:
                        return
                    await asyncio.sleep(0.1)
                raise AssertionError(f"committed offset is {await committed_offset()}, not 10")

            asyncio.run(wait_for_child())
        finally:
            os.kill(child.pid, signal.SIGKILL)
            child.wait()

        first = {int(line.split()[0]) for line in out.read_text().splitlines()}
        assert first == set(range(50)) - {10}

        async def second_run() -> list[ReceivedMessage]:
            got: list[ReceivedMessage] = []
            c = PushConsumer(
                config(ns), group, collector(got), options=ConsumerOptions(consume_from=FIRST)
            )
            c.subscribe(topic)
            async with c:
                await until(lambda: len(got) >= 40, 60, "redelivery of offsets 10..49")
                await asyncio.sleep(0.5)
            return got

        again = asyncio.run(second_run())
        offsets = sorted(m.queue_offset for m in again)
        assert offsets == list(range(10, 50))  # from the lowest unacked offset, once each
        assert set(first) | set(offsets) == set(range(50))  # nothing lost
        assert len(set(first) & set(offsets)) == 39  # processed before the kill, delivered again
        assert sorted(m.msg_id for m in again) == sorted(sent[10:])


def test_consumers_read_from_the_slave_when_the_master_is_down(tmp_path: Path) -> None:
    with running_cluster(tmp_path / "c", groups=("broker-a",), replication="sync") as cluster:
        ns, topic = cluster.namesrv_addr, "SLAVE"

        async def t() -> None:
            await create_topic(ns, topic, brokers=1)
            sent = await produce(ns, topic, 200)  # SYNC_MASTER: the slave has every one
            got: list[ReceivedMessage] = []
            before = PushConsumer(
                config(ns), "g-slave-1", collector(got), options=ConsumerOptions(consume_from=FIRST)
            )
            before.subscribe(topic)
            async with before:
                await until(lambda: len(got) >= 1, 30, "the first messages")
                cluster.kill("broker-a-master")
                await until(lambda: len({m.msg_id for m in got}) >= 200, 60, "all 200 after kill")
            assert {m.msg_id for m in got} == set(sent)
            # A group that starts now can only be served by the slave.
            fresh: list[ReceivedMessage] = []
            after = PushConsumer(
                config(ns),
                "g-slave-2",
                collector(fresh),
                options=ConsumerOptions(consume_from=FIRST),
            )
            after.subscribe(topic)
            async with after:
                await until(lambda: len(fresh) >= 200, 60, "200 messages from the slave")
                await asyncio.sleep(0.5)
            assert sorted(m.msg_id for m in fresh) == sorted(sent)
            alive = {n["name"]: n["alive"] for n in cluster.status()["nodes"]}
            assert alive["broker-a-master"] is False and alive["broker-a-slave"] is True

        asyncio.run(t())
