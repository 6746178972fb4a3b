"""The broker's periodic work: registration, offset persistence, client expiry, slave sync,
the rate samples."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from broker_runtime.broker.namesrv_client import register_all
from broker_runtime.broker.processors.consumer import notify_ids_changed
from broker_runtime.broker.slave_sync import sync_from_master
from broker_runtime.offsets import offset_history

if TYPE_CHECKING:
    from broker_runtime.broker.controller import BrokerController

log = logging.getLogger(__name__)


def background_tasks(ctl: BrokerController) -> list[Coroutine[Any, Any, None]]:
    tasks = [_register_loop(ctl), _persist_offsets_loop(ctl), _expire_clients_loop(ctl)]
    tasks.append(_stats_loop(ctl))
    if not ctl.is_master:
        tasks.append(_slave_sync_loop(ctl))
    elif ctl.config.offset_history_interval_ms > 0:
        tasks.append(_offset_history_loop(ctl))
    return tasks


async def _register_loop(ctl: BrokerController) -> None:
    every = ctl.config.register_interval_ms / 1000
    event = ctl._register_now
    while True:
        event.clear()
        await register_all(ctl)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), every)


async def _persist_offsets_loop(ctl: BrokerController) -> None:
    every = ctl.config.offset_persist_interval_ms / 1000
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(every)
        try:
            await loop.run_in_executor(None, ctl.offsets.persist)
            await loop.run_in_executor(None, ctl.filters.persist, ctl.clock.now_ms())
        except OSError as e:
            log.error("persisting consumer offsets or filters failed: %s", e)


async def _offset_history_loop(ctl: BrokerController) -> None:
    """A snapshot of the committed offsets and the queues' bounds, per interval."""
    every = ctl.config.offset_history_interval_ms / 1000
    loop = asyncio.get_running_loop()
    store = ctl.require_store()
    while True:
        await asyncio.sleep(every)
        entry = offset_history.snapshot(
            ctl.clock.now_ms(),
            ctl.offsets.table(),
            lambda topic, qid: (store.min_offset(topic, qid), store.max_offset(topic, qid)),
        )
        try:
            await loop.run_in_executor(
                None,
                offset_history.write,
                store.root,
                entry,
                ctl.config.offset_history_keep,
            )
        except OSError as e:
            log.error("writing a consumer offset snapshot failed: %s", e)


async def _expire_clients_loop(ctl: BrokerController) -> None:
    every = ctl.config.client_scan_interval_ms / 1000
    while True:
        await asyncio.sleep(every)
        for group in ctl.consumers.expire(ctl.clock.now_ms(), ctl.config.client_expiry_ms):
            log.info("consumer group %s: silent clients expired", group)
            notify_ids_changed(ctl, group)


async def _slave_sync_loop(ctl: BrokerController) -> None:
    every = ctl.config.slave_sync_interval_ms / 1000
    while True:
        await asyncio.sleep(every)
        if ctl.master_addr is None:
            continue
        try:
            await sync_from_master(ctl, ctl.master_addr)
        except Exception as e:  # the master may be down: the slave keeps what it has
            log.info("sync from master %s failed: %s", ctl.master_addr, e)


async def _stats_loop(ctl: BrokerController) -> None:
    while True:
        ctl.stats.sample(ctl.clock.now_ms())
        await asyncio.sleep(1.0)
