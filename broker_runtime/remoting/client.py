"""A pool of remoting connections by address, for clients and for brokers calling out."""

from __future__ import annotations

import asyncio

from broker_runtime.remoting.command import RemotingCommand
from broker_runtime.remoting.connection import Connection, connect
from broker_runtime.remoting.server import ProcessorTable


def split_addr(addr: str) -> tuple[str, int]:
    """`host:port` -> (host, port), with a clear error for anything else."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"address {addr!r} is not host:port")
    return host, int(port)


class RemotingClient:
    """One connection per address, opened on first use and re-opened after it closes.

    `table` serves requests the peer sends back on these connections.
    """

    def __init__(self, table: ProcessorTable | None = None, connect_timeout: float = 3.0):
        self.table = table or ProcessorTable()
        self.connect_timeout = connect_timeout
        self._conns: dict[str, Connection] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def connection(self, addr: str) -> Connection:
        conn = self._conns.get(addr)
        if conn is not None and not conn.closed:
            return conn
        lock = self._locks.setdefault(addr, asyncio.Lock())
        async with lock:
            conn = self._conns.get(addr)
            if conn is None or conn.closed:
                host, port = split_addr(addr)
                conn = await connect(host, port, self.table.dispatch, self.connect_timeout)
                self._conns[addr] = conn
            return conn

    async def invoke(self, addr: str, cmd: RemotingCommand, timeout: float) -> RemotingCommand:
        conn = self._conns.get(addr)
        if conn is None or conn.closed:
            conn = await self.connection(addr)
        return await conn.request(cmd, timeout)

    async def invoke_oneway(self, addr: str, cmd: RemotingCommand) -> None:
        conn = await self.connection(addr)
        await conn.oneway(cmd)

    def close_connection(self, addr: str) -> None:
        conn = self._conns.pop(addr, None)
        if conn is not None:
            conn.close()

    async def close(self) -> None:
        conns = list(self._conns.values())
        self._conns.clear()
        for conn in conns:
            conn.close()
        for conn in conns:
            await conn.wait_closed()
        await self.table.drain()
