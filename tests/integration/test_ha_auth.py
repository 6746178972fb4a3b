"""The master's HA port against a peer that is not its slave, on a real SYNC_MASTER cluster.

A fake "slave" (8 zero bytes, then reports of 1 << 60) once received the raw CommitLog and
turned SLAVE_NOT_AVAILABLE answers into SEND_OK although no replica held the messages; the
real slave (the cluster's generated secret, or the ACL admin's) still replicates. Nor can
it acknowledge for a real slave that is connected but frozen (SIGSTOP).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import pytest

from broker_runtime.ha.protocol import CHALLENGE, encode_report
from broker_runtime.remoting.bodies import decode_json
from broker_runtime.remoting.protocol import RequestCode as C
from broker_runtime.remoting.protocol import ResponseCode as R
from tests.integration.cluster_fixtures import Cluster, RawClient, running_cluster
from tests.integration.test_cluster_acl import ACCOUNTS, ADMIN

pytestmark = pytest.mark.integration

TOPIC = "HaAuthTopic"


async def send_codes(c: Cluster, n: int, creds: tuple[str, str] | None) -> list[int]:
    client = RawClient(creds)
    try:
        return [
            (await client.send(c.addr("broker-a-master"), TOPIC, b"m%d" % i, i % 4)).code
            for i in range(n)
        ]
    finally:
        await client.close()


def ha_connections(c: Cluster, creds: tuple[str, str] | None) -> int:
    async def ask() -> int:
        client = RawClient(creds)
        try:
            r = await client.call(c.addr("broker-a-master"), C.GET_BROKER_RUNTIME_INFO)
            return int(decode_json(r.body, "runtime")["table"]["haConnections"])
        finally:
            await client.close()

    return asyncio.run(ask())


def wait_until(cond: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


async def fake_slave(host: str, port: int) -> tuple[bytes, asyncio.StreamWriter]:
    """Connect as a RocketMQ slave at offset 0, then claim 1 << 60; what came back in 2 s."""
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(encode_report(0) + encode_report(1 << 60) * 3)
    got = b""
    loop = asyncio.get_running_loop()
    until = loop.time() + 2.0
    try:
        while chunk := await asyncio.wait_for(reader.read(1 << 16), until - loop.time()):
            got += chunk
    except TimeoutError:
        pass
    return got, writer


@pytest.mark.parametrize("acl", [False, True], ids=["generated-secret", "acl-secret"])
def test_a_fake_slave_gets_no_log_and_acknowledges_nothing(tmp_path: Path, acl: bool) -> None:
    acl_file = None
    creds = None
    if acl:
        acl_file = tmp_path / "acl.json"
        acl_file.write_text(json.dumps(ACCOUNTS))
        creds = ADMIN
    with running_cluster(
        tmp_path / "c", name_servers=1, flush="sync", replication="sync", acl=acl_file
    ) as c:
        wait_until(lambda: ha_connections(c, creds) == 1)
        assert asyncio.run(send_codes(c, 5, creds)) == [R.SUCCESS] * 5
        c.stop("broker-a-slave")
        wait_until(lambda: ha_connections(c, creds) == 0)
        assert set(asyncio.run(send_codes(c, 3, creds))) == {R.SLAVE_NOT_AVAILABLE}

        node = c.layout.node("broker-a-master")
        assert node.ha_port is not None

        async def attack() -> tuple[bytes, list[int], list[int]]:
            got, writer = await fake_slave(node.host, node.ha_port or 0)
            during = await send_codes(c, 20, creds)
            writer.close()
            await asyncio.sleep(0.5)  # let the master see the disconnect
            after = await send_codes(c, 3, creds)
            return got, during, after

        got, during, after = asyncio.run(attack())
        assert len(got) <= CHALLENGE.size, f"the fake slave got {len(got)} bytes of the log"
        assert set(during) == {R.SLAVE_NOT_AVAILABLE}, during
        assert set(after) == {R.SLAVE_NOT_AVAILABLE}, after

        c.start("broker-a-slave")  # the real slave answers the challenge and replicates
        wait_until(lambda: ha_connections(c, creds) == 1)
        assert asyncio.run(send_codes(c, 5, creds)) == [R.SUCCESS] * 5


def test_a_fake_slave_cannot_acknowledge_for_a_frozen_slave(tmp_path: Path) -> None:
    """The real slave stays connected but frozen (SIGSTOP): sends time out waiting for it, a
    fake "slave" claiming 1 << 60 meanwhile turns none of them into SEND_OK, and once the
    real slave runs again it acknowledges what it then holds."""
    with running_cluster(
        tmp_path / "c",
        name_servers=1,
        flush="sync",
        replication="sync",
        # The frozen slave must stay connected for the whole attack (about 6 s of sends): a
        # slave silent for ha_housekeeping_ms (5 s in the test clusters) is dropped, and then
        # the later sends say SLAVE_NOT_AVAILABLE, right but not what is tested here.
        settings={"sync_replica_timeout_ms": "700", "ha_housekeeping_ms": "600000"},
    ) as c:
        wait_until(lambda: ha_connections(c, None) == 1)
        assert asyncio.run(send_codes(c, 2, None)) == [R.SUCCESS] * 2
        slave = c.pid("broker-a-slave")
        assert slave is not None
        node = c.layout.node("broker-a-master")
        os.kill(slave, signal.SIGSTOP)
        try:
            frozen = asyncio.run(send_codes(c, 2, None))

            async def attack() -> tuple[bytes, list[int], list[int]]:
                got, writer = await fake_slave(node.host, node.ha_port or 0)
                during = await send_codes(c, 3, None)
                writer.close()
                await asyncio.sleep(0.5)  # let the master see the disconnect
                return got, during, await send_codes(c, 2, None)

            got, during, after = asyncio.run(attack())
        finally:
            os.kill(slave, signal.SIGCONT)
        assert set(frozen) == {R.FLUSH_SLAVE_TIMEOUT}, frozen
        assert len(got) <= CHALLENGE.size, f"the fake slave got {len(got)} bytes of the log"
        assert set(during) == {R.FLUSH_SLAVE_TIMEOUT}, during
        assert set(after) == {R.FLUSH_SLAVE_TIMEOUT}, after
        wait_until(lambda: asyncio.run(send_codes(c, 1, None)) == [R.SUCCESS])
