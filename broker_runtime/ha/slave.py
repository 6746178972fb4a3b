"""The slave's side of replication (RocketMQ's HAClient).

Connects to the master's HA port, reports its max offset, appends what the master pushes
at the same offsets, and reports again. The master's address comes from the config or from
the name servers (the register response names the group's master). A lost or silent
connection is dropped and re-made, as is one that failed in any other way (logged with
its traceback); the slave resumes from its own log's end.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from broker_runtime.common.config import BrokerConfig, FlushMode
from broker_runtime.ha.protocol import (
    CHALLENGE,
    TRANSFER_HEADER,
    HAProtocolError,
    decode_challenge,
    decode_transfer_header,
    encode_report,
    proof,
)
from broker_runtime.remoting.client import split_addr
from broker_runtime.store.message_store import MessageStore
from broker_runtime.store.replica import ReplicaError, ReplicaWriter

log = logging.getLogger(__name__)


class HASlaveClient:
    def __init__(
        self,
        store: MessageStore,
        config: BrokerConfig,
        master_ha_addr: Callable[[], str | None],
        secret: bytes | None = None,
    ) -> None:
        self.store = store
        self.secret = secret  # answers the master's challenge (None: RocketMQ's open port)
        self.config = config
        self.master_ha_addr = master_ha_addr
        self.writer = ReplicaWriter(store)
        self.connected_to: str | None = None
        self.master_pushed = 0  # end of the master's last transfer
        self.transfers = 0
        self.last_error: str | None = None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="ha-append")
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._executor.shutdown(wait=True)

    def status(self) -> dict[str, object]:
        return {
            "masterHaAddr": self.connected_to,
            "connected": self.connected_to is not None,
            "slaveMaxOffset": self.writer.max_offset,
            "masterPushedOffset": self.master_pushed,
            "lastError": self.last_error,
        }

    async def _run(self) -> None:
        pause = self.config.ha_reconnect_ms / 1000
        while True:
            addr = self.master_ha_addr()
            if addr is not None:
                try:
                    await self._replicate(addr)
                except (OSError, TimeoutError, asyncio.IncompleteReadError) as e:
                    self._lost(addr, f"{type(e).__name__}: {e}")
                except (HAProtocolError, ReplicaError) as e:
                    self._lost(addr, str(e))
                    log.error("replication from %s failed: %s", addr, e)
                except Exception as e:  # a bug must not end replication for good, unseen
                    self._lost(addr, f"{type(e).__name__}: {e}")
                    log.exception("replication from %s failed", addr)
            await asyncio.sleep(pause)

    def _lost(self, addr: str, why: str) -> None:
        if self.connected_to is not None:
            log.warning("lost the master %s: %s", addr, why)
        self.connected_to = None
        self.last_error = why

    async def _replicate(self, addr: str) -> None:
        host, port = split_addr(addr)
        idle_s = self.config.ha_housekeeping_ms / 1000
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 3.0)
        heartbeat: asyncio.Task[None] | None = None
        try:
            if self.secret is not None:
                raw = await asyncio.wait_for(reader.readexactly(CHALLENGE.size), idle_s)
                writer.write(proof(self.secret, decode_challenge(raw)))
            writer.write(encode_report(self.writer.max_offset))
            await writer.drain()
            self.connected_to = addr
            self.last_error = None
            log.info("replicating from %s, from offset %d", addr, self.writer.max_offset)
            heartbeat = asyncio.get_running_loop().create_task(self._heartbeat(writer))
            loop = asyncio.get_running_loop()
            sync_flush = self.config.store.flush is FlushMode.SYNC
            while True:
                head = await asyncio.wait_for(reader.readexactly(TRANSFER_HEADER.size), idle_s)
                offset, size = decode_transfer_header(head)
                if size == 0:
                    self.master_pushed = max(self.master_pushed, offset)
                    continue
                body = await asyncio.wait_for(reader.readexactly(size), idle_s)
                end = await loop.run_in_executor(self._executor, self.writer.append, offset, body)
                if sync_flush:
                    await loop.run_in_executor(self._executor, self.writer.flush)
                self.master_pushed = offset + size
                self.transfers += 1
                writer.write(encode_report(end))
                await writer.drain()
        finally:
            if heartbeat is not None:
                heartbeat.cancel()
                await asyncio.gather(heartbeat, return_exceptions=True)
            writer.close()

    async def _heartbeat(self, writer: asyncio.StreamWriter) -> None:
        every = self.config.ha_heartbeat_interval_ms / 1000
        while True:
            await asyncio.sleep(every)
            writer.write(encode_report(self.writer.max_offset))
            await writer.drain()
