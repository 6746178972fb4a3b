"""The slave's HA client against a real master service over loopback TCP: it keeps
replicating through an unexpected failure, and a master stopping with a slave connected
logs no error."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable

import pytest

from broker_runtime.common import aio
from broker_runtime.common.config import BrokerConfig, BrokerRole, StoreConfig
from broker_runtime.common.message import Message
from broker_runtime.ha.master import HAMasterService
from broker_runtime.ha.slave import HASlaveClient
from broker_runtime.store.message_store import MessageStore
from tests.unit.broker_runtime.test_ha_master import wait_for

Test = Callable[[HAMasterService, HASlaveClient, MessageStore, MessageStore], Awaitable[None]]


def run_pair(small_config: StoreConfig, test: Test) -> None:
    """A master store of 20 messages and its HA service; an empty slave store and its client
    (not started: the test starts it)."""
    slave_config = dataclasses.replace(small_config, store_dir=small_config.store_dir / "slave")
    master_store, slave_store = MessageStore(small_config), MessageStore(slave_config)
    for i in range(20):
        master_store.put_message(Message("HaT", b"m%d" % i + b"." * 200))

    async def main() -> None:
        config = BrokerConfig(store=small_config, role=BrokerRole.ASYNC_MASTER, ha_port=0)
        slave_cfg = BrokerConfig(
            store=slave_config, role=BrokerRole.SLAVE, broker_id=1, ha_reconnect_ms=50
        )
        master = HAMasterService(master_store, config)
        slave = HASlaveClient(slave_store, slave_cfg, lambda: f"127.0.0.1:{master.port}")
        await master.start()
        try:
            await test(master, slave, master_store, slave_store)
        finally:
            await slave.stop()
            await master.stop()

    try:
        aio.run(main())
    finally:
        master_store.shutdown()
        slave_store.shutdown()


def test_an_unexpected_failure_is_logged_and_replication_goes_on(
    small_config: StoreConfig, caplog: pytest.LogCaptureFixture
) -> None:
    """The first append fails with an error no handler names (a bug, say): the slave logs
    it with its traceback, connects again and catches up, as RocketMQ's HAClient does."""

    async def t(
        master: HAMasterService, slave: HASlaveClient, store: MessageStore, copy: MessageStore
    ) -> None:
        append = slave.writer.append
        calls = []

        def failing_once(offset: int, data: bytes) -> int:
            calls.append(offset)
            if len(calls) == 1:
                raise RuntimeError("injected")
            return append(offset, data)

        slave.writer.append = failing_once  # type: ignore[method-assign,assignment]
        slave.start()
        await wait_for(lambda: copy.log_max_offset == store.log_max_offset > 0)
        assert len(calls) >= 2 and slave.connected_to is not None

    with caplog.at_level(logging.INFO, logger="broker_runtime.ha"):
        run_pair(small_config, t)
    failed = [r for r in caplog.records if r.getMessage().startswith("replication from")]
    assert failed and failed[0].exc_info is not None
    assert repr(failed[0].exc_info[1]) == "RuntimeError('injected')"


def test_a_master_stopping_with_a_slave_connected_logs_no_error(
    small_config: StoreConfig, caplog: pytest.LogCaptureFixture
) -> None:
    async def t(
        master: HAMasterService, slave: HASlaveClient, store: MessageStore, copy: MessageStore
    ) -> None:
        slave.start()
        await wait_for(lambda: copy.log_max_offset == store.log_max_offset and bool(master.slaves))
        await master.stop()
        await wait_for(lambda: slave.connected_to is None)

    with caplog.at_level(logging.INFO):
        run_pair(small_config, t)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]
    assert any("the HA service stops" in r.getMessage() for r in caplog.records)
