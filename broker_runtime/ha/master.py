"""The master's side of replication (RocketMQ's HAService + HAConnection).

Each slave connection has a reader (the slave's acknowledged offset, and liveness) and a
pusher (CommitLog bytes from where the slave is, one segment at a time, as they arrive).
SYNC_MASTER sends wait in `wait_replicated` until some slave has acknowledged their end.

With a replication secret, a connection must answer the challenge (protocol.py) before it
is sent anything. A slave's reports count only up to what was sent on its connection, and
the acknowledged mark is the furthest of the slaves connected now: a peer that claims more
than it was sent, or goes away, leaves no acknowledgement behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import os
from dataclasses import dataclass, field

from broker_runtime.common.config import BrokerConfig
from broker_runtime.ha.protocol import (
    NONCE_SIZE,
    PROOF_SIZE,
    REPORT,
    HAProtocolError,
    decode_report,
    encode_challenge,
    encode_transfer,
    proof_ok,
)
from broker_runtime.store.message_store import MessageStore

log = logging.getLogger(__name__)


@dataclass(eq=False)
class SlaveConnection:
    peer: str
    acked: int = -1  # the slave's last report, capped at what this connection was sent
    next_transfer: int = -1  # the end of what this connection was sent
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    overclaimed: bool = False  # reported more than it was sent (said once in the log)


class HAMasterService:
    def __init__(
        self, store: MessageStore, config: BrokerConfig, secret: bytes | None = None
    ) -> None:
        self.store = store
        self.config = config
        self.secret = secret  # slaves must prove they hold it (None: RocketMQ's open port)
        self.port = config.ha_port
        self.slaves: set[SlaveConnection] = set()
        self.acked = 0  # push2SlaveMaxOffset: the furthest a connected slave acknowledged
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, self.config.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("HA service listening on %s:%d", self.config.host, self.port)
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def notify(self) -> None:
        """New bytes are in the log: wake every pusher."""
        for s in self.slaves:
            s.wake.set()

    def slave_ok(self, end: int) -> bool:
        """HAService.isSlaveOK: a slave is connected and not too far behind `end`."""
        connected = any(s.acked >= 0 for s in self.slaves)
        return connected and end - self.acked < self.config.ha_max_gap_bytes

    async def wait_replicated(self, end: int, timeout: float) -> bool:
        """Wait until a slave has acknowledged the log up to `end`; False on timeout."""
        if self.acked >= end:
            return True
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (end, next(self._seq), fut))
        try:
            await asyncio.wait_for(fut, timeout)
            return True
        except TimeoutError:
            return False

    def _acknowledged(self, slave: SlaveConnection, reported: int) -> None:
        if reported > slave.next_transfer:
            if not slave.overclaimed:
                slave.overclaimed = True
                log.warning(
                    "slave %s reports %d, past the %d bytes it was sent: counted as %d",
                    *(slave.peer, reported, slave.next_transfer, slave.next_transfer),
                )
            reported = slave.next_transfer
        slave.acked = reported
        self._recompute()

    def _recompute(self) -> None:
        """The acknowledged mark from the slaves connected now; wake the sends it covers."""
        self.acked = acked = max((s.acked for s in self.slaves), default=0)
        waiters = self._waiters
        while waiters and waiters[0][0] <= acked:
            fut = heapq.heappop(waiters)[2]
            if not fut.done():
                fut.set_result(None)

    def status(self) -> list[dict[str, object]]:
        return [
            {"peer": s.peer, "ackedOffset": s.acked, "nextTransfer": s.next_transfer}
            for s in self.slaves
        ]

    # -- one slave ----------------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        peer_info = writer.get_extra_info("peername")
        slave = SlaveConnection(f"{peer_info[0]}:{peer_info[1]}" if peer_info else "?")
        idle_s = self.config.ha_housekeeping_ms / 1000
        pusher: asyncio.Task[None] | None = None
        try:
            if self.secret is not None and not await self._authenticated(reader, writer, idle_s):
                log.warning("HA connection from %s refused: wrong challenge answer", slave.peer)
                return
            first = decode_report(await asyncio.wait_for(reader.readexactly(REPORT.size), idle_s))
            log_end = self.store.log_max_offset
            if first > log_end:
                # The slave holds bytes this master does not (it lost its tail): pushing from
                # our end would give the slave a log that differs at the same offsets.
                log.error(
                    "slave %s is ahead of this master (%d > %d): not replicating to it",
                    slave.peer,
                    first,
                    log_end,
                )
                return
            slave.next_transfer = first if first > 0 else self.store.log_min_offset
            self.slaves.add(slave)
            self._acknowledged(slave, first)
            log.info("slave %s connected at offset %d", slave.peer, first)
            pusher = asyncio.get_running_loop().create_task(self._push(slave, writer))
            while True:
                raw = await asyncio.wait_for(reader.readexactly(REPORT.size), idle_s)
                self._acknowledged(slave, decode_report(raw))
        except TimeoutError:
            log.warning("slave %s silent for %.1f s: dropped", slave.peer, idle_s)
        except (asyncio.IncompleteReadError, ConnectionError, HAProtocolError) as e:
            log.info("slave %s disconnected: %s", slave.peer, e or type(e).__name__)
        except asyncio.CancelledError:  # `stop`. Not re-raised, here or below: Python
            # 3.11's stream server logs a cancelled handler as an error.
            log.info("slave %s: closed, the HA service stops", slave.peer)
        finally:
            if slave in self.slaves:
                self.slaves.discard(slave)
                self._recompute()
            writer.close()
            self._tasks.discard(task)
            if pusher is not None:
                pusher.cancel()
                with contextlib.suppress(asyncio.CancelledError):  # `stop` while it ends
                    await asyncio.gather(pusher, return_exceptions=True)

    async def _authenticated(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, idle_s: float
    ) -> bool:
        assert self.secret is not None
        nonce = os.urandom(NONCE_SIZE)
        writer.write(encode_challenge(nonce))
        await writer.drain()
        answer = await asyncio.wait_for(reader.readexactly(PROOF_SIZE), idle_s)
        return proof_ok(self.secret, nonce, answer)

    async def _push(self, slave: SlaveConnection, writer: asyncio.StreamWriter) -> None:
        heartbeat_s = self.config.ha_heartbeat_interval_ms / 1000
        batch = self.config.ha_transfer_batch
        stuck_logged = False
        try:
            while True:
                slave.wake.clear()  # before reading: a put landing after the read sets it again
                data = self.store.read_log(slave.next_transfer, batch)
                if data:
                    writer.write(encode_transfer(slave.next_transfer, data))
                    slave.next_transfer += len(data)
                    await writer.drain()
                    continue
                behind = slave.next_transfer < self.store.log_max_offset
                if behind and not stuck_logged:
                    stuck_logged = True  # e.g. the slave's offset expired here: say so once
                    log.error(
                        "cannot read the log at %d for slave %s", slave.next_transfer, slave.peer
                    )
                try:
                    await asyncio.wait_for(slave.wake.wait(), heartbeat_s)
                except TimeoutError:
                    writer.write(encode_transfer(slave.next_transfer, b""))
                    await writer.drain()
        except (ConnectionError, OSError) as e:
            log.info("push to slave %s stopped: %s", slave.peer, e)
            writer.close()
