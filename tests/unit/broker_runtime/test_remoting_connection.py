"""Connections and the processor table over real loopback TCP (one event loop per test)."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from broker_runtime.common import aio
from broker_runtime.remoting.client import RemotingClient, split_addr
from broker_runtime.remoting.command import RemotingCommand, request, response_to
from broker_runtime.remoting.connection import (
    ConnectionClosedError,
    RemotingConnectError,
    RemotingTimeoutError,
    connect,
)
from broker_runtime.remoting.framing import FrameDecoder, encode
from broker_runtime.remoting.protocol import RequestCode, ResponseCode
from broker_runtime.remoting.server import ProcessorTable, RemotingServer

ECHO, SLOW, BOOM, BAD = 1000, 1001, 1002, 1003


async def echo(cmd: RemotingCommand, conn: object) -> RemotingCommand:
    return response_to(cmd, ResponseCode.SUCCESS, fields=cmd.ext_fields, body=cmd.body)


async def slow(cmd: RemotingCommand, conn: object) -> RemotingCommand:
    await asyncio.sleep(float(cmd.field("sleep")))
    return response_to(cmd)


async def boom(cmd: RemotingCommand, conn: object) -> RemotingCommand:
    raise RuntimeError("kaput")


async def bad(cmd: RemotingCommand, conn: object) -> RemotingCommand:
    cmd.int_field("needed")
    return response_to(cmd)


def run_with_server(test: Callable[[RemotingServer, str], Awaitable[None]], **kw: object) -> None:
    async def main() -> None:
        table = ProcessorTable({ECHO: echo, SLOW: slow, BOOM: boom, BAD: bad}, **kw)  # type: ignore[arg-type]
        server = RemotingServer(table)
        port = await server.start()
        try:
            await test(server, f"127.0.0.1:{port}")
        finally:
            await server.close()

    asyncio.run(main())


def test_request_response_and_concurrency() -> None:
    async def t(server: RemotingServer, addr: str) -> None:
        client = RemotingClient()
        calls = [
            client.invoke(addr, request(ECHO, {"i": i}, b"x" * i), timeout=5) for i in range(200)
        ]
        results = await asyncio.gather(*calls)
        assert [r.ext_fields["i"] for r in results] == [str(i) for i in range(200)]
        assert all(r.body == b"x" * i for i, r in enumerate(results))
        await client.close()

    run_with_server(t)


def test_pipelined_frames_in_one_write_are_all_answered() -> None:
    """Several requests in one TCP write (the answers ready at once leave in one write),
    one of them waiting on a slow processor; TCP_NODELAY on both ends."""

    async def t(server: RemotingServer, addr: str) -> None:
        host, port = split_addr(addr)
        reader, writer = await asyncio.open_connection(host, port)
        sent = [request(ECHO, {"i": i}) for i in range(3)] + [request(SLOW, {"sleep": 0.1})]
        writer.write(b"".join(encode(c) for c in sent))
        decoder, got = FrameDecoder(), []
        while len(got) < len(sent):
            got += decoder.feed(await asyncio.wait_for(reader.read(65536), 5))
        assert sorted(r.opaque for r in got) == sorted(c.opaque for c in sent)
        assert got[-1].opaque == sent[-1].opaque  # the slow one last
        (conn,) = server.connections
        assert conn._transport is not None
        for end in (conn._transport, writer):
            assert end.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        writer.close()

    run_with_server(t)


def test_slow_request_does_not_block_the_connection() -> None:
    async def t(server: RemotingServer, addr: str) -> None:
        client = RemotingClient()
        slow_call = asyncio.ensure_future(client.invoke(addr, request(SLOW, {"sleep": 0.5}), 5))
        fast = await client.invoke(addr, request(ECHO), timeout=0.5)  # answered meanwhile
        assert fast.code == ResponseCode.SUCCESS and not slow_call.done()
        assert (await slow_call).code == ResponseCode.SUCCESS
        await client.close()

    run_with_server(t)


def test_errors_become_responses() -> None:
    async def t(server: RemotingServer, addr: str) -> None:
        client = RemotingClient()
        unknown = await client.invoke(addr, request(4242), 5)
        assert unknown.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        failed = await client.invoke(addr, request(BOOM), 5)
        assert failed.code == ResponseCode.SYSTEM_ERROR and "kaput" in (failed.remark or "")
        badreq = await client.invoke(addr, request(BAD), 5)
        assert badreq.code == ResponseCode.SYSTEM_ERROR and "'needed'" in (badreq.remark or "")
        assert (await client.invoke(addr, request(ECHO), 5)).code == ResponseCode.SUCCESS
        await client.close()

    run_with_server(t)


def test_timeout_and_oneway() -> None:
    async def t(server: RemotingServer, addr: str) -> None:
        client = RemotingClient()
        with pytest.raises(RemotingTimeoutError, match=r"within 0\.2 s"):
            await client.invoke(addr, request(SLOW, {"sleep": 0.5}), timeout=0.2)
        await client.invoke_oneway(addr, request(ECHO))  # no response comes back
        assert (await client.invoke(addr, request(ECHO, {"k": "v"}), 5)).ext_fields == {"k": "v"}
        await client.close()

    run_with_server(t)


def test_each_request_times_out_at_its_own_deadline_among_answered_ones() -> None:
    """One sweep timer serves every request of a connection: a short timeout sent after a
    long one still fires on time, answered requests in between change nothing, and each
    late request fails alone (the connection keeps serving)."""

    async def t(server: RemotingServer, addr: str) -> None:
        client = RemotingClient()
        loop = asyncio.get_running_loop()
        long_call = asyncio.ensure_future(client.invoke(addr, request(SLOW, {"sleep": 1.5}), 1.0))
        await asyncio.sleep(0.05)
        for i in range(100):  # answered, each leaves a deadline 5 s out behind
            assert (await client.invoke(addr, request(ECHO, {"i": i}), 5)).code == 0
        start = loop.time()
        with pytest.raises(RemotingTimeoutError, match=r"within 0\.2 s"):
            await client.invoke(addr, request(SLOW, {"sleep": 1.0}), timeout=0.2)
        short_waited = loop.time() - start
        assert not long_call.done()
        with pytest.raises(RemotingTimeoutError, match=r"within 1 s"):
            await long_call
        long_waited = loop.time() - start
        assert 0.2 <= short_waited < 0.6, short_waited
        assert long_waited < 1.4, long_waited  # its deadline, not the sleep's 1.5 s
        assert (await client.invoke(addr, request(ECHO), 5)).code == ResponseCode.SUCCESS
        await client.close()

    run_with_server(t)


def test_malformed_frame_closes_that_connection_only() -> None:
    async def t(server: RemotingServer, addr: str) -> None:
        host, port = split_addr(addr)
        good = RemotingClient()
        assert (await good.invoke(addr, request(ECHO), 5)).code == 0
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"\x00\x00\x00\x0c\x00\x00\x00\x04nope1234")
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the server
        writer.close()
        assert (await good.invoke(addr, request(ECHO), 5)).code == 0
        await good.close()

    run_with_server(t)


def test_hook_can_refuse_before_the_processor() -> None:
    def deny(cmd: RemotingCommand, conn: object) -> RemotingCommand | None:
        if cmd.ext_fields.get("user") != "admin":
            return response_to(cmd, ResponseCode.NO_PERMISSION, "no")
        return None

    async def t(server: RemotingServer, addr: str) -> None:
        client = RemotingClient()
        assert (await client.invoke(addr, request(ECHO), 5)).code == ResponseCode.NO_PERMISSION
        ok = await client.invoke(addr, request(ECHO, {"user": "admin"}), 5)
        assert ok.code == ResponseCode.SUCCESS
        await client.close()

    run_with_server(t, hooks=[deny])


def test_pending_request_fails_when_the_server_goes_away() -> None:
    async def main() -> None:
        server = RemotingServer(ProcessorTable({SLOW: slow}))
        port = await server.start()
        conn = await connect("127.0.0.1", port)
        pending = asyncio.ensure_future(conn.request(request(SLOW, {"sleep": 5}), 10))
        await asyncio.sleep(0.1)
        for c in list(server.connections):
            c.close("test")
        with pytest.raises(ConnectionClosedError):
            await pending
        await server.close(grace_s=0.1)

    asyncio.run(main())


def test_connect_refused_is_a_clear_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused

        async def main() -> None:
            with pytest.raises(RemotingConnectError, match=f"127.0.0.1:{port}"):
                await connect("127.0.0.1", port, timeout=2)

        asyncio.run(main())


def test_bad_address() -> None:
    with pytest.raises(ValueError, match="not host:port"):
        split_addr("localhost")
    assert RequestCode.SEND_MESSAGE == 10


def test_nearly_spent_timeouts_time_out_on_uvloop() -> None:
    """uvloop's call_at gives a plain Handle (no `when`) for a deadline under half a
    millisecond away: the next request must still arm its sweep, and each times out."""

    async def main() -> None:
        table = ProcessorTable({SLOW: slow})
        server = RemotingServer(table)
        port = await server.start()
        client = RemotingClient()
        try:
            addr = f"127.0.0.1:{port}"
            assert (await client.invoke(addr, request(SLOW, {"sleep": 0}), 5)).code == 0
            calls = [client.invoke(addr, request(SLOW, {"sleep": 1}), 1e-5) for _ in range(3)]
            results = await asyncio.gather(*calls, return_exceptions=True)
            assert [type(r) for r in results] == [RemotingTimeoutError] * 3, results
        finally:
            await client.close()
            await server.close()

    aio.run(main())


async def _half_frame(host: str, port: int, size: int) -> tuple[asyncio.StreamReader, Any]:
    """A connection that announced a `size`-byte frame and sent all of it but one byte."""
    reader, writer = await asyncio.open_connection(host, port)
    header = b'{"code":1000,"opaque":1}'
    writer.write(struct.pack(">ii", 4 + len(header) + size, len(header)) + header)
    writer.write(b"x" * (size - 1))
    await writer.drain()
    return reader, writer


def test_half_frames_are_bounded_in_bytes_and_in_idle_time() -> None:
    """Connections holding unfinished frames: past the server's buffer budget the stalest are
    closed at once (not a client streaming a large frame now), and a half-frame left idle
    is closed after the idle limit; a client sending whole frames is served throughout."""

    async def main() -> None:
        server = RemotingServer(
            ProcessorTable({ECHO: echo}),
            max_frame=2 << 20,
            max_buffered_bytes=3 << 20,
            half_frame_idle_s=1.0,
        )
        port = await server.start()
        good = RemotingClient()
        addr = f"127.0.0.1:{port}"
        try:
            held = [await _half_frame("127.0.0.1", port, 1 << 20) for _ in range(5)]
            loop = asyncio.get_running_loop()
            start = loop.time()

            async def closed_after(reader: asyncio.StreamReader) -> float:
                assert await asyncio.wait_for(reader.read(), 10) == b""
                return loop.time() - start

            big = request(ECHO, body=b"b" * (3 << 19))  # streamed past the budget: stale go
            assert (await good.invoke(addr, big, 5)).body == big.body
            closed_at = await asyncio.gather(*(closed_after(r) for r, _ in held))
            assert sum(1 for t in closed_at if t < 0.5) >= 4, closed_at  # over the budget
            assert max(closed_at) >= 0.9, closed_at  # the rest: idle for the limit
            assert sum(c.buffered for c in server.connections) == 0
            assert (await good.invoke(addr, request(ECHO), 5)).code == 0
            for _, writer in held:
                writer.close()
        finally:
            await good.close()
            await server.close()

    aio.run(main())
