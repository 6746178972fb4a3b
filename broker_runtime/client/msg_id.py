"""Client-side message ids (UNIQ_KEY), in RocketMQ's MessageClientIDSetter format.

16 bytes as 32 upper-case hex digits: client IPv4 (4), the low 16 bits of the pid (2), a
per-generator 32-bit "class loader hash" (4), milliseconds since the start of the current
month (4), a 16-bit counter (2). The first 20 digits are fixed for a generator; the id
therefore tells who sent a message and roughly when, which the audit reads back. Java
clients on a host whose address is IPv6 write 28 bytes (56 digits): the address is 16
bytes there, the rest the same; the readers below take both, as MessageClientIDSetter.
"""

from __future__ import annotations

import calendar
import itertools
import os
import secrets
import socket
import struct
import threading
import time
from collections.abc import Callable

from broker_runtime.common.message import UNIQ_KEY, Message


def month_start_ms(now_ms: int) -> int:
    """Epoch ms of the first instant of `now_ms`'s month (UTC: timestamps are UTC here)."""
    t = time.gmtime(now_ms // 1000)
    return calendar.timegm((t.tm_year, t.tm_mon, 1, 0, 0, 0)) * 1000


def _next_month_start_ms(start_ms: int) -> int:
    t = time.gmtime(start_ms // 1000)
    year, month = (t.tm_year + 1, 1) if t.tm_mon == 12 else (t.tm_year, t.tm_mon + 1)
    return calendar.timegm((year, month, 1, 0, 0, 0)) * 1000


class UniqIdGenerator:
    """Makes UNIQ_KEY ids; thread safe (the counter is an atomic `itertools.count`)."""

    def __init__(
        self,
        ip: str = "127.0.0.1",
        pid: int | None = None,
        loader_hash: int | None = None,
        now_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        pid = os.getpid() if pid is None else pid
        loader_hash = secrets.randbits(32) if loader_hash is None else loader_hash
        fixed = socket.inet_aton(ip) + struct.pack(">HI", pid & 0xFFFF, loader_hash & 0xFFFFFFFF)
        self.prefix = fixed.hex().upper()
        self._now_ms = now_ms
        self._counter = itertools.count()
        self._lock = threading.Lock()
        self._set_start(now_ms())

    def _set_start(self, now_ms: int) -> None:
        with self._lock:
            self._start = month_start_ms(now_ms)
            self._next_start = _next_month_start_ms(self._start)

    def create(self) -> str:
        now = self._now_ms()
        if now >= self._next_start:
            self._set_start(now)
        # Java casts to int and short: both wrap (the low 32 and 16 bits, in hex).
        return "%s%08X%04X" % (  # noqa: UP031 - the fastest of the formatting ways here
            self.prefix,
            (now - self._start) & 0xFFFFFFFF,
            next(self._counter) & 0xFFFF,
        )


def uniq_id_ip(msg_id: str) -> str:
    """The sender's address encoded in a UNIQ_KEY (IPv4, or IPv6 in a 56-digit id)."""
    raw = _raw(msg_id)
    if len(raw) == _LEN_V6:
        return socket.inet_ntop(socket.AF_INET6, raw[:16])
    return socket.inet_ntoa(raw[:4])


def uniq_id_pid(msg_id: str) -> int:
    """The low 16 bits of the sender's pid."""
    return int.from_bytes(_raw(msg_id)[-12:-10], "big")


def uniq_id_time_ms(msg_id: str, now_ms: int) -> int:
    """When the id was made, assuming it was made within a month before `now_ms`."""
    span = int.from_bytes(_raw(msg_id)[-6:-2], "big")  # unsigned, as Java reads it back
    start = month_start_ms(now_ms)
    if start + span > now_ms:  # in the future: made last month (Java says >=, which
        # misreads an id made this very millisecond)
        start = month_start_ms(start - 1)
    return start + span


_LEN_V4, _LEN_V6 = 16, 28  # bytes of an id made on an IPv4 / an IPv6 host


def _raw(msg_id: str) -> bytes:
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError:
        raw = b""
    if len(raw) not in (_LEN_V4, _LEN_V6):
        raise ValueError(f"a UNIQ_KEY has 32 hex digits (56 from an IPv6 host), got {msg_id!r}")
    return raw


_default: tuple[int, UniqIdGenerator] | None = None  # (pid, generator): a fork gets its own
_default_lock = threading.Lock()


def default_generator() -> UniqIdGenerator:
    """This process's generator, made on first use."""
    global _default
    with _default_lock:
        if _default is None or _default[0] != os.getpid():
            _default = (os.getpid(), UniqIdGenerator())
        return _default[1]


def set_uniq_id(msg: Message, gen: UniqIdGenerator | None = None) -> str:
    """Give `msg` a UNIQ_KEY unless it has one (a resend keeps its id); return the id."""
    existing = msg.properties.get(UNIQ_KEY)
    if existing:
        return existing
    uid = (gen or default_generator()).create()
    msg.properties[UNIQ_KEY] = uid
    return uid
