"""Blocking remoting calls over plain sockets, for a thread that waits for each answer.

A caller that sends and then waits gains nothing from an event loop: here a call is one
`sendall` and (usually) one `recv`, with no loop turns and no hand-over between threads.
A channel carries one request at a time, so its answer is the next response frame with the
request's opaque; a frame with another opaque can only be the late answer to a request that
timed out, which closed the channel, so none is expected, and one that comes is dropped.
Any failure (timeout included) closes the channel: its stream position is then unknown.
"""

from __future__ import annotations

import logging
import socket
import struct
import threading
import time

from broker_runtime.remoting.client import split_addr
from broker_runtime.remoting.command import FLAG_RESPONSE, RemotingCommand
from broker_runtime.remoting.connection import (
    ConnectionClosedError,
    RemotingConnectError,
    RemotingError,
    RemotingTimeoutError,
)
from broker_runtime.remoting.framing import DEFAULT_MAX_FRAME, FrameDecoder, FrameError, encode

log = logging.getLogger(__name__)

RECV_SIZE = 256 * 1024
_TIMEVAL = struct.Struct("@ll")  # struct timeval: tv_sec, tv_usec (Linux, 64-bit)


class BlockingChannel:
    """One TCP connection; `invoke` sends a request and blocks until its response."""

    def __init__(
        self, addr: str, connect_timeout: float = 3.0, max_frame: int = DEFAULT_MAX_FRAME
    ) -> None:
        self.addr = addr
        try:
            self._sock = socket.create_connection(split_addr(addr), connect_timeout)
        except OSError as e:
            raise RemotingConnectError(f"cannot connect to {addr}: {e or 'timeout'}") from e
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock.settimeout(None)  # blocking; the timeouts are _set_timeout's
        self._decoder = FrameDecoder(max_frame)
        self._timeout = 0.0
        # One buffer for every read: a fresh 256 KiB bytes per recv is an mmap and munmap.
        self._buf = bytearray(RECV_SIZE)
        self._view = memoryview(self._buf)
        self.closed = False

    def invoke(self, cmd: RemotingCommand, timeout: float) -> RemotingCommand:
        if self.closed:
            raise ConnectionClosedError(f"{self.addr}: closed")
        deadline = time.monotonic() + timeout
        sock = self._sock
        try:
            self._set_timeout(timeout)
            sock.sendall(encode(cmd))
            while True:
                n = sock.recv_into(self._buf)
                if not n:
                    raise ConnectionClosedError(f"{self.addr}: closed by peer")
                for frame in self._decoder.feed(self._view[:n].tobytes()):
                    if frame.flag & FLAG_RESPONSE and frame.opaque == cmd.opaque:
                        return frame
                    log.debug("%s: dropped a frame that answers nothing (code %d, opaque %d)",
                              self.addr, frame.code, frame.opaque)  # fmt: skip
                remaining = deadline - time.monotonic()  # a frame in pieces: wait for the rest
                if remaining <= 0:
                    raise BlockingIOError
                self._set_timeout(remaining)
        except BlockingIOError:  # SO_RCVTIMEO / SO_SNDTIMEO ran out
            self.close()
            raise RemotingTimeoutError(
                f"{self.addr}: no response to request {cmd.code} within {timeout:g} s"
            ) from None
        except FrameError as e:
            self.close()
            raise RemotingError(f"{self.addr}: malformed frame: {e}") from e
        except RemotingError:
            self.close()
            raise
        except OSError as e:
            self.close()
            raise ConnectionClosedError(f"{self.addr}: connection lost: {e}") from e

    def _set_timeout(self, seconds: float) -> None:
        """Kernel timeouts on a blocking socket: recv is one system call. (Python's own
        socket timeouts make every recv a poll and a non-blocking recv, 2-3 calls.)"""
        if seconds != self._timeout:
            whole = int(seconds)
            timeval = _TIMEVAL.pack(whole, max(1, int((seconds - whole) * 1_000_000)))
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)
            self._timeout = seconds

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._sock.close()


class BlockingPool:
    """Idle channels by address, shared by threads: a call takes one (or opens one), and
    gives it back when it ended well."""

    def __init__(self, connect_timeout: float = 3.0) -> None:
        self.connect_timeout = connect_timeout
        self._idle: dict[str, list[BlockingChannel]] = {}
        self._lock = threading.Lock()
        self._closed = False

    def invoke(self, addr: str, cmd: RemotingCommand, timeout: float) -> RemotingCommand:
        with self._lock:
            if self._closed:
                raise ConnectionClosedError(f"{addr}: the client is shut down")
            idle = self._idle.get(addr)
            channel = idle.pop() if idle else None
        if channel is None:
            channel = BlockingChannel(addr, self.connect_timeout)
        response = channel.invoke(cmd, timeout)  # on failure the channel closed itself
        with self._lock:
            if self._closed:
                channel.close()
            else:
                self._idle.setdefault(addr, []).append(channel)
        return response

    def close(self) -> None:
        with self._lock:
            self._closed = True
            channels = [c for idle in self._idle.values() for c in idle]
            self._idle.clear()
        for channel in channels:
            channel.close()
