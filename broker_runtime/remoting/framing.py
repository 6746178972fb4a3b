"""Sans-I/O framing: `length | serialize type + header length | header | body`.

As RocketMQ's RemotingCommand.encode/decode: `length` (i32, big-endian) counts everything
after itself; the next i32 holds the serialize type in its high byte (0 = JSON, the only one
accepted here) and the header length in the low three bytes. No sockets in this module:
bytes in, commands out (python-hyper/h11's rule).
"""

from __future__ import annotations

import struct

from broker_runtime.remoting.command import HeaderError, RemotingCommand

_I32 = struct.Struct(">i")
_LEN_AND_HEADER = struct.Struct(">iI")
SERIALIZE_JSON = 0
DEFAULT_MAX_FRAME = 16 << 20  # a batch of 4 MiB messages plus headers fits; RocketMQ: 16 MiB


class FrameError(ValueError):
    """The byte stream is not a frame; the connection cannot be trusted past this point."""


def encode(cmd: RemotingCommand) -> bytes:
    header = cmd.encode_header()
    length = 4 + len(header) + len(cmd.body)
    return b"".join(
        (_LEN_AND_HEADER.pack(length, (SERIALIZE_JSON << 24) | len(header)), header, cmd.body)
    )


class FrameDecoder:
    """Feed it bytes as they arrive; it returns the complete commands they finish."""

    __slots__ = ("_buf", "max_frame")

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self._buf = bytearray()
        self.max_frame = max_frame

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> list[RemotingCommand]:
        """Raises FrameError on a frame no RocketMQ peer would send (then drop the connection).

        A header that frames correctly but is not valid JSON is reported the same way: the
        request cannot be answered without its opaque.
        """
        buf = self._buf
        src: bytes | bytearray
        if buf:
            buf += data
            src = buf
        else:  # the usual case, whole frames: read them out of `data` without a copy first
            src = data
        out: list[RemotingCommand] = []
        pos = 0
        n = len(src)
        while n - pos >= 4:
            (length,) = _I32.unpack_from(src, pos)
            if length < 4 or length > self.max_frame:
                raise FrameError(f"frame length {length} outside 4..{self.max_frame}")
            if n - pos - 4 < length:
                break
            (type_and_len,) = _I32.unpack_from(src, pos + 4)
            serialize_type, header_len = (type_and_len >> 24) & 0xFF, type_and_len & 0xFFFFFF
            if serialize_type != SERIALIZE_JSON:
                raise FrameError(f"serialize type {serialize_type} not supported (JSON only)")
            if header_len > length - 4:
                raise FrameError(f"header length {header_len} exceeds frame length {length}")
            body_start = pos + 8 + header_len
            end = pos + 4 + length
            try:
                cmd = RemotingCommand.decode_header(src[pos + 8 : body_start], b"")
            except HeaderError as e:
                raise FrameError(str(e)) from None
            cmd.body = bytes(buf[body_start:end]) if src is buf else data[body_start:end]
            out.append(cmd)
            pos = end
        if src is buf:
            if pos:
                del buf[:pos]
        elif pos < n:
            buf += memoryview(data)[pos:]
        return out
