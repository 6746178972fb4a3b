"""One remoting connection over asyncio: frames in, opaque -> Future for responses.

A response completes the Future of the request with its opaque; a request is handed to the
`on_request` callback (the server's processor table, or a client's handler for calls the
broker makes back, like NOTIFY_CONSUMER_IDS_CHANGED). A frame that does not decode closes
the connection: the stream's position can no longer be trusted (aiokafka's conn.py does the
same with its length prefix and correlation ids).
"""

from __future__ import annotations

import asyncio
import heapq
import logging
from collections.abc import Callable
from typing import cast

from broker_runtime.remoting.command import FLAG_ONEWAY, FLAG_RESPONSE, RemotingCommand
from broker_runtime.remoting.framing import DEFAULT_MAX_FRAME, FrameDecoder, FrameError, encode

log = logging.getLogger(__name__)


class RemotingError(Exception):
    """A call did not complete; the message says where and why."""


class RemotingConnectError(RemotingError):
    pass


class RemotingTimeoutError(RemotingError):
    pass


class ConnectionClosedError(RemotingError):
    pass


RequestHandler = Callable[[RemotingCommand, "Connection"], None]

# Timeouts: one heap of (deadline, opaque) per connection and one timer that sweeps it, as
# RocketMQ's scanResponseTable (which sweeps every second). A timer per request (call_later,
# then cancel) was an eighth of a send's cost in the client. Answered requests leave their
# entry behind; a sweep drops them, so under traffic the timer runs every SWEEP_S, and a
# request times out at most SWEEP_S late.
SWEEP_S = 0.02


class Connection(asyncio.Protocol):
    """A connection's protocol object; also its handle (request / oneway / send / close)."""

    def __init__(
        self, on_request: RequestHandler | None = None, max_frame: int = DEFAULT_MAX_FRAME
    ) -> None:
        self._on_request = on_request
        self._decoder = FrameDecoder(max_frame)
        self._pending: dict[int, asyncio.Future[RemotingCommand]] = {}
        self._deadlines: list[tuple[float, int]] = []  # a heap of (deadline, opaque)
        # uvloop's call_at returns a plain Handle (no `when`) for a deadline under half a
        # millisecond away, so the sweep's time is kept here.
        self._sweep: asyncio.Handle | None = None
        self._sweep_at = 0.0
        self._transport: asyncio.Transport | None = None
        self._writable = asyncio.Event()
        self._writable.set()
        self._paused = False  # the hot path reads this, not the Event
        self._closed = asyncio.Event()
        self._is_closed = False
        self._held: list[bytes] | None = None  # frames sent while a read is handled
        self._loop: asyncio.AbstractEventLoop | None = None
        self.peer = "?"
        self.peer_addr: tuple[str, int] | None = None
        self.close_reason: str | None = None

    # -- asyncio.Protocol ---------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport; uvloop's are not asyncio.Transport subclasses, so no isinstance.
        self._transport = cast(asyncio.Transport, transport)
        self._loop = asyncio.get_running_loop()
        peer = transport.get_extra_info("peername")
        if peer:
            self.peer = f"{peer[0]}:{peer[1]}"
            self.peer_addr = (peer[0], peer[1])

    def data_received(self, data: bytes) -> None:
        try:
            commands = self._decoder.feed(data)
        except FrameError as e:
            log.warning("closing %s: malformed frame: %s", self.peer, e)
            self.close(f"malformed frame: {e}")
            return
        if len(commands) > 1:  # pipelined requests: the answers leave in one write
            self._held = []
        try:
            for cmd in commands:
                if cmd.flag & FLAG_RESPONSE:
                    fut = self._pending.pop(cmd.opaque, None)
                    if fut is not None and not fut.done():
                        fut.set_result(cmd)
                elif self._on_request is not None:
                    self._on_request(cmd, self)
        finally:
            if self._held is not None:
                self._release()

    def connection_lost(self, exc: Exception | None) -> None:
        reason = self.close_reason or (f"connection lost: {exc}" if exc else "closed by peer")
        self.close_reason = reason
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(ConnectionClosedError(f"{self.peer}: {reason}"))
        self._pending.clear()
        self._deadlines.clear()
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        self._paused = False
        self._writable.set()
        self._is_closed = True
        self._closed.set()

    def pause_writing(self) -> None:
        self._paused = True
        self._writable.clear()

    def resume_writing(self) -> None:
        self._paused = False
        self._writable.set()

    # -- the handle ------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._is_closed

    @property
    def buffered(self) -> int:
        """Bytes received of a frame not yet complete."""
        return self._decoder.buffered

    def send(self, cmd: RemotingCommand) -> None:
        """Queue a frame (a response, or a request whose answer nobody waits for)."""
        transport = self._transport
        if transport is None or transport.is_closing():
            raise ConnectionClosedError(f"{self.peer}: {self.close_reason or 'closed'}")
        if self._held is not None:
            self._held.append(encode(cmd))
        else:
            transport.write(encode(cmd))

    def _release(self) -> None:
        held, self._held = self._held, None
        transport = self._transport
        if held and transport is not None and not transport.is_closing():
            transport.write(b"".join(held))

    async def drain(self) -> None:
        if self._paused:
            await self._writable.wait()

    async def request(self, cmd: RemotingCommand, timeout: float) -> RemotingCommand:
        """Send `cmd` and wait for the response with its opaque (unique among requests in
        flight: request() numbers them)."""
        loop = self._loop or asyncio.get_running_loop()  # get_running_loop: a getpid() each
        fut: asyncio.Future[RemotingCommand] = loop.create_future()
        opaque = cmd.opaque
        self._pending[opaque] = fut
        deadline = loop.time() + timeout
        heapq.heappush(self._deadlines, (deadline, opaque))
        if self._sweep is None or deadline < self._sweep_at:
            self._arm(loop, deadline)
        try:
            self.send(cmd)
            if self._paused:
                await self._writable.wait()
            return await fut
        except TimeoutError:
            raise RemotingTimeoutError(
                f"{self.peer}: no response to request {cmd.code} within {timeout:g} s"
            ) from None
        finally:
            self._pending.pop(opaque, None)

    def _arm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._sweep is not None:
            self._sweep.cancel()
        self._sweep = loop.call_at(when, self._expire, loop)
        self._sweep_at = when

    def _expire(self, loop: asyncio.AbstractEventLoop) -> None:
        """Fail the requests whose deadline has passed; drop the entries of answered ones."""
        self._sweep = None
        now, heap, pending = loop.time(), self._deadlines, self._pending
        while heap and heap[0][0] <= now:
            fut = pending.get(heapq.heappop(heap)[1])
            if fut is not None and not fut.done():
                fut.set_exception(TimeoutError())
        if heap:
            self._arm(loop, max(heap[0][0], now + SWEEP_S))

    async def oneway(self, cmd: RemotingCommand) -> None:
        cmd.flag |= FLAG_ONEWAY
        self.send(cmd)
        await self.drain()

    def close(self, reason: str = "closed locally") -> None:
        self.close_reason = self.close_reason or reason
        if self._held:
            self._release()  # answers already given still go out
        if self._transport is not None:
            self._transport.close()

    async def wait_closed(self) -> None:
        await self._closed.wait()


async def connect(
    host: str,
    port: int,
    on_request: RequestHandler | None = None,
    timeout: float = 3.0,
    max_frame: int = DEFAULT_MAX_FRAME,
) -> Connection:
    loop = asyncio.get_running_loop()
    try:
        _, conn = await asyncio.wait_for(
            loop.create_connection(lambda: Connection(on_request, max_frame), host, port),
            timeout,
        )
    except (OSError, TimeoutError) as e:
        raise RemotingConnectError(f"cannot connect to {host}:{port}: {e or 'timeout'}") from e
    return conn
