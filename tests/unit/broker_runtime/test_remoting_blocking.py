"""BlockingChannel and BlockingPool against a raw socket peer on loopback that answers what
each test scripts: whole frames, frames in pieces, stray frames, garbage, silence."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from broker_runtime.remoting.blocking import BlockingChannel, BlockingPool
from broker_runtime.remoting.command import RemotingCommand, request, response_to
from broker_runtime.remoting.connection import (
    ConnectionClosedError,
    RemotingConnectError,
    RemotingError,
    RemotingTimeoutError,
)
from broker_runtime.remoting.framing import FrameDecoder, encode

# A peer's script: given the request and the connection, answer (or not).
Script = Callable[[RemotingCommand, socket.socket], None]


@contextmanager
def peer(script: Script) -> Iterator[tuple[str, list[int]]]:
    """A server thread running `script` for every request; yields its address and the
    number of requests each accepted connection carried."""
    srv = socket.create_server(("127.0.0.1", 0))
    served: list[int] = []

    def serve(conn: socket.socket) -> None:
        decoder, i = FrameDecoder(), len(served)
        served.append(0)
        with conn:
            while data := conn.recv(65536):
                for cmd in decoder.feed(data):
                    served[i] += 1
                    script(cmd, conn)

    def accept() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"127.0.0.1:{srv.getsockname()[1]}", served
    finally:
        srv.close()


def ok(cmd: RemotingCommand, conn: socket.socket) -> None:
    conn.sendall(encode(response_to(cmd, 0, fields={"echo": cmd.ext_fields.get("n", "")})))


def test_answers_come_back_in_order_over_one_connection() -> None:
    with peer(ok) as (addr, served):
        ch = BlockingChannel(addr)
        for n in range(50):
            resp = ch.invoke(request(10, {"n": n}), 2.0)
            assert resp.is_response and resp.ext_fields == {"echo": str(n)}
        ch.close()
    assert served == [50]


def test_a_frame_in_pieces_and_a_stray_frame_before_the_answer() -> None:
    def slow(cmd: RemotingCommand, conn: socket.socket) -> None:
        conn.sendall(encode(response_to(request(99), 0, "stray")))  # answers nothing we sent
        frame = encode(response_to(cmd, 0, "mine"))
        for i in range(0, len(frame), 7):
            conn.sendall(frame[i : i + 7])
            time.sleep(0.002)

    with peer(slow) as (addr, _):
        ch = BlockingChannel(addr)
        assert ch.invoke(request(10), 2.0).remark == "mine"
        assert ch.invoke(request(10), 2.0).remark == "mine"
        ch.close()


def test_silence_times_out_on_time_and_closes_the_channel() -> None:
    with peer(lambda cmd, conn: None) as (addr, _):
        ch = BlockingChannel(addr)
        start = time.monotonic()
        with pytest.raises(RemotingTimeoutError, match=r"within 0\.3 s"):
            ch.invoke(request(10), 0.3)
        assert 0.29 <= time.monotonic() - start < 2.0
        assert ch.closed
        with pytest.raises(ConnectionClosedError):
            ch.invoke(request(10), 0.3)


def test_garbage_and_a_closed_peer_are_errors_that_close_the_channel() -> None:
    def garbage(cmd: RemotingCommand, conn: socket.socket) -> None:
        conn.sendall(b"\x00\x00\x00\x08\x00\x00\x00\x20notjson!")  # header longer than frame

    with peer(garbage) as (addr, _):
        ch = BlockingChannel(addr)
        with pytest.raises(RemotingError, match="malformed frame"):
            ch.invoke(request(10), 2.0)
        assert ch.closed

    def hang_up(cmd: RemotingCommand, conn: socket.socket) -> None:
        conn.shutdown(socket.SHUT_RDWR)

    with peer(hang_up) as (addr, _):
        ch = BlockingChannel(addr)
        with pytest.raises(ConnectionClosedError, match="closed by peer"):
            ch.invoke(request(10), 2.0)
        assert ch.closed


def test_nobody_listening_is_a_connect_error() -> None:
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
    with pytest.raises(RemotingConnectError, match=f"127.0.0.1:{port}"):
        BlockingChannel(f"127.0.0.1:{port}")


def test_the_pool_reuses_channels_drops_failed_ones_and_refuses_after_close() -> None:
    answer = {"on": True}

    def flaky(cmd: RemotingCommand, conn: socket.socket) -> None:
        if answer["on"]:
            ok(cmd, conn)

    with peer(flaky) as (addr, served):
        pool = BlockingPool()
        for n in range(5):
            assert pool.invoke(addr, request(10, {"n": n}), 2.0).ext_fields["echo"] == str(n)
        answer["on"] = False
        with pytest.raises(RemotingTimeoutError):
            pool.invoke(addr, request(10), 0.2)
        answer["on"] = True
        pool.invoke(addr, request(10), 2.0)  # on a new connection
        assert served == [6, 1]
        pool.close()
        with pytest.raises(ConnectionClosedError, match="shut down"):
            pool.invoke(addr, request(10), 2.0)
