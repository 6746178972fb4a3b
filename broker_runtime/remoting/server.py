"""Request code -> processor dispatch, and the TCP server that uses it.

As RocketMQ's NettyRemotingAbstract.processRequestCommand: an unknown code gets
REQUEST_CODE_NOT_SUPPORTED, a processor's error becomes a SYSTEM_ERROR response naming it,
hooks (ACL) run before the processor and may answer instead of it. Nothing a client sends
can stop the server: every failure is contained in the one request.
"""

from __future__ import annotations

import asyncio
import logging
import types
from collections.abc import Awaitable, Callable, Coroutine, Generator, Sequence
from typing import Any

from broker_runtime.common.topics import InvalidNameError
from broker_runtime.remoting.command import HeaderError, RemotingCommand, response_to
from broker_runtime.remoting.connection import Connection, RemotingError
from broker_runtime.remoting.framing import DEFAULT_MAX_FRAME
from broker_runtime.remoting.protocol import ResponseCode, code_name

log = logging.getLogger(__name__)

Processor = Callable[[RemotingCommand, Connection], Awaitable[RemotingCommand | None]]
Hook = Callable[[RemotingCommand, Connection], RemotingCommand | None]


class ProcessorTable:
    """Maps request codes to processors; `dispatch` is a Connection's `on_request`."""

    def __init__(
        self, processors: dict[int, Processor] | None = None, hooks: Sequence[Hook] = ()
    ) -> None:
        self.processors: dict[int, Processor] = dict(processors or {})
        self.hooks = list(hooks)
        self._tasks: set[asyncio.Task[None]] = set()

    def register(self, code: int, processor: Processor) -> None:
        self.processors[int(code)] = processor

    def dispatch(self, cmd: RemotingCommand, conn: Connection) -> None:
        """Run the request at once, as far as it gets without waiting; only a request that
        waits (a long-polling pull, a sync flush, a slave's ack) becomes a task of its own.

        Most requests finish without waiting, and a task per request (its creation and a
        turn of the loop before it starts) was a tenth of a send's cost in the broker.
        """
        coro = self._handle(cmd, conn)
        try:
            waiting_on = coro.send(None)
        except StopIteration:
            return
        task = asyncio.get_running_loop().create_task(_resume(coro, waiting_on))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _handle(self, cmd: RemotingCommand, conn: Connection) -> None:
        response = await self.process(cmd, conn)
        if response is None or cmd.is_oneway or conn.closed:
            return
        response.opaque = cmd.opaque
        try:
            conn.send(response)
        except RemotingError as e:
            log.info("response to %s not sent: %s", conn.peer, e)

    async def process(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand | None:
        try:
            for hook in self.hooks:
                refused = hook(cmd, conn)
                if refused is not None:
                    return refused
            processor = self.processors.get(cmd.code)
            if processor is None:
                return response_to(
                    cmd,
                    ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                    f"request code {cmd.code} not supported",
                )
            return await processor(cmd, conn)
        except (HeaderError, InvalidNameError, ValueError) as e:
            return response_to(cmd, ResponseCode.SYSTEM_ERROR, f"bad request: {e}")
        except Exception as e:
            log.exception("processor for %s failed", code_name(cmd.code, response=False))
            return response_to(cmd, ResponseCode.SYSTEM_ERROR, f"internal error: {e!r}")

    async def drain(self, grace_s: float = 2.0) -> None:
        """Wait up to `grace_s` for requests in flight, then cancel the rest (long polls)."""
        if not self._tasks:
            return
        _, late = await asyncio.wait(set(self._tasks), timeout=grace_s)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)


async def _resume(coro: Coroutine[Any, Any, None], waiting_on: Any) -> None:
    await _continue(coro, waiting_on)


@types.coroutine
def _continue(coro: Coroutine[Any, Any, None], waiting_on: Any) -> Generator[Any, Any, None]:
    """Go on with a coroutine started outside a task: hand what it waits on to the task
    running this, and whatever the task sends or throws back (results, cancellation) to it."""
    while True:
        try:
            sent = yield waiting_on
        except BaseException as e:
            try:
                waiting_on = coro.throw(e)
            except StopIteration:
                return
        else:
            try:
                waiting_on = coro.send(sent)
            except StopIteration:
                return


# What peers may make the server hold in unfinished frames: all connections together, and
# how long one may leave a frame unfinished without sending a byte. 20 connections each
# holding 15 MiB of a 16 MiB frame took a broker from 112 to 394 MB before these bounds.
DEFAULT_MAX_BUFFERED = 4 * DEFAULT_MAX_FRAME
DEFAULT_HALF_FRAME_IDLE_S = 30.0


class RemotingServer:
    """A TCP server on `host:port` (0 = ephemeral) serving a ProcessorTable.

    When unfinished frames take the bytes buffered over all connections past
    `max_buffered_bytes`, the connections whose frames stalled longest are closed until they
    fit; a connection that sends nothing for `half_frame_idle_s` in the middle of a frame
    is closed too.
    """

    def __init__(
        self,
        table: ProcessorTable,
        host: str = "127.0.0.1",
        port: int = 0,
        max_frame: int = DEFAULT_MAX_FRAME,
        max_buffered_bytes: int = DEFAULT_MAX_BUFFERED,
        half_frame_idle_s: float = DEFAULT_HALF_FRAME_IDLE_S,
    ) -> None:
        if max_buffered_bytes < max_frame:
            raise ValueError("max_buffered_bytes must be at least max_frame")
        if half_frame_idle_s <= 0:
            raise ValueError("half_frame_idle_s must be positive")
        self.table = table
        self.host = host
        self.port = port
        self.max_frame = max_frame
        self.max_buffered_bytes = max_buffered_bytes
        self.half_frame_idle_s = half_frame_idle_s
        self.connections: set[Connection] = set()
        self.buffered = 0  # bytes of unfinished frames, all connections
        self._partial: set[_ServerConnection] = set()
        self._server: asyncio.Server | None = None
        self._idle_timer: asyncio.TimerHandle | None = None

    async def start(self) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._new_connection, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        self._idle_timer = loop.call_later(self._idle_check_s, self._close_idle, loop)
        return self.port

    def _new_connection(self) -> Connection:
        return _ServerConnection(self, self.table.dispatch, self.max_frame)

    async def close(self, grace_s: float = 2.0) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        if self._server is not None:
            self._server.close()
        await self.table.drain(grace_s)
        for conn in list(self.connections):
            conn.close("server shutting down")

    @property
    def _idle_check_s(self) -> float:
        return min(self.half_frame_idle_s / 4, 5.0)

    def _account(self, conn: _ServerConnection, buffered: int, now: float) -> None:
        """`conn` now buffers `buffered` bytes of an unfinished frame."""
        self.buffered += buffered - conn.accounted
        conn.accounted = buffered
        if not buffered:
            self._partial.discard(conn)
            return
        self._partial.add(conn)
        conn.partial_since = now
        while self.buffered > self.max_buffered_bytes:
            # The connection whose frame waited longest since its last byte goes first: a
            # client streaming a large frame right now is the least likely to be stalling.
            stale = min(self._partial, key=lambda c: c.partial_since)
            log.warning(
                "closing %s: unfinished frames on all connections hold %d bytes (limit %d)",
                *(stale.peer, self.buffered, self.max_buffered_bytes),
            )
            stale.close(f"server buffer limit of {self.max_buffered_bytes} bytes reached")
            self._account(stale, 0, now)

    def _close_idle(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        limit = self.half_frame_idle_s
        for conn in [c for c in self._partial if now - c.partial_since >= limit]:
            idle = now - conn.partial_since
            log.warning("closing %s: a frame left unfinished for %.1f s", conn.peer, idle)
            conn.close(f"frame unfinished for {limit:g} s")
            self._account(conn, 0, now)
        self._idle_timer = loop.call_later(self._idle_check_s, self._close_idle, loop)


class _ServerConnection(Connection):
    """Tracks itself in the server's connection set (closing them all on shutdown) and
    reports the bytes of its unfinished frame to the server's bounds."""

    def __init__(self, server: RemotingServer, on_request: Callable[..., None], max_frame: int):
        super().__init__(on_request, max_frame)
        self._server_ref = server
        self.accounted = 0  # of the server's `buffered`
        self.partial_since = 0.0  # loop time of the last bytes of an unfinished frame

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._server_ref.connections.add(self)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        buffered = self.buffered
        if buffered or self.accounted:
            assert self._loop is not None
            self._server_ref._account(self, buffered, self._loop.time())

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._server_ref._account(self, 0, 0.0)
        self._server_ref.connections.discard(self)
