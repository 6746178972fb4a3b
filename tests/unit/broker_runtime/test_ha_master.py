"""The master's HA port over real loopback TCP: challenge, capped reports, the acked mark."""

from __future__ import annotations

import asyncio
import struct

import pytest

from broker_runtime.common import aio
from broker_runtime.common.config import BrokerConfig, BrokerRole, StoreConfig
from broker_runtime.common.message import Message
from broker_runtime.ha.master import HAMasterService
from broker_runtime.ha.protocol import (
    CHALLENGE,
    TRANSFER_HEADER,
    decode_challenge,
    encode_report,
    proof,
)
from broker_runtime.store.message_store import MessageStore

SECRET = b"replication-secret"


async def wait_for(cond: object, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def read_pushed(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    offset, size = TRANSFER_HEADER.unpack(await reader.readexactly(TRANSFER_HEADER.size))
    return offset, await reader.readexactly(size)


def run_master(small_config: StoreConfig, test: object, secret: bytes | None = SECRET) -> None:
    store = MessageStore(small_config)
    for i in range(20):
        store.put_message(Message("HaT", b"m%d" % i + b"." * 200))

    async def main() -> None:
        config = BrokerConfig(store=small_config, role=BrokerRole.SYNC_MASTER, ha_port=0)
        master = HAMasterService(store, config, secret)
        await master.start()
        try:
            await test(master, store)  # type: ignore[operator]
        finally:
            await master.stop()

    try:
        aio.run(main())
    finally:
        store.shutdown()


def test_a_peer_without_the_secret_gets_no_log_byte(small_config: StoreConfig) -> None:
    async def t(master: HAMasterService, store: MessageStore) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", master.port)
        writer.write(encode_report(0) * 8)  # a RocketMQ slave's report, and junk as "proof"
        got = await asyncio.wait_for(reader.read(), 10)
        assert len(got) == CHALLENGE.size and got.startswith(b"mqaudit-ha-auth1"), got[:40]
        assert master.slaves == set() and master.acked == 0
        writer.close()

    run_master(small_config, t)


def test_reports_count_only_up_to_what_the_connection_was_sent(small_config: StoreConfig) -> None:
    """A slave (secret known) reporting 0 then 1 << 60 acknowledges only the bytes it was
    sent; when it goes, the acked mark falls back to the slaves still connected."""

    async def t(master: HAMasterService, store: MessageStore) -> None:
        end = store.log_max_offset
        reader, writer = await asyncio.open_connection("127.0.0.1", master.port)
        nonce = decode_challenge(await reader.readexactly(CHALLENGE.size))
        writer.write(proof(SECRET, nonce) + encode_report(0))
        offset, data = await read_pushed(reader)
        assert offset == 0 and 0 < len(data) <= end
        writer.write(encode_report(1 << 60))
        await wait_for(lambda: master.acked > 0)
        assert master.acked == len(data) <= end
        assert not await master.wait_replicated(end + 1, 0.3)  # nothing past the log
        writer.close()
        await wait_for(lambda: not master.slaves)
        assert master.acked == 0
        assert not master.slave_ok(end + 100)
        assert not await master.wait_replicated(len(data), 0.3)

    run_master(small_config, t)


@pytest.mark.parametrize("secret", [SECRET, None])
def test_a_slave_with_the_secret_replicates(
    small_config: StoreConfig, secret: bytes | None
) -> None:
    async def t(master: HAMasterService, store: MessageStore) -> None:
        end = store.log_max_offset
        reader, writer = await asyncio.open_connection("127.0.0.1", master.port)
        if secret is not None:
            nonce = decode_challenge(await reader.readexactly(CHALLENGE.size))
            writer.write(proof(secret, nonce))
        writer.write(encode_report(0))
        got = 0
        while got < end:
            offset, data = await read_pushed(reader)
            assert offset == got
            got += len(data)
            writer.write(struct.pack(">q", got))
        assert await master.wait_replicated(end, 5)
        assert master.acked == end
        writer.close()

    run_master(small_config, t, secret)
