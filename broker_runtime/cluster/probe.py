"""One request to a node from synchronous code (the supervisor's "is it answering?")."""

from __future__ import annotations

import asyncio

from broker_runtime.acl.signing import sign_command
from broker_runtime.remoting.bodies import decode_json
from broker_runtime.remoting.client import split_addr
from broker_runtime.remoting.command import RemotingCommand, request
from broker_runtime.remoting.connection import RemotingError, connect
from broker_runtime.remoting.protocol import RequestCode, ResponseCode

Credentials = tuple[str, str]  # access key, secret key


async def call(
    addr: str, code: int, timeout: float, credentials: Credentials | None = None
) -> RemotingCommand:
    host, port = split_addr(addr)
    conn = await connect(host, port, timeout=timeout)
    try:
        cmd = request(code)
        if credentials is not None:
            sign_command(cmd, *credentials)
        return await conn.request(cmd, timeout)
    finally:
        conn.close()


def probe_json(
    addr: str, code: int, timeout: float = 2.0, credentials: Credentials | None = None
) -> dict[str, object] | None:
    """The JSON body of a successful answer to a field-less request, else None."""
    try:
        resp = asyncio.run(call(addr, code, timeout, credentials))
    except (RemotingError, OSError, TimeoutError):
        return None
    if resp.code != ResponseCode.SUCCESS:
        return None
    try:
        return decode_json(resp.body, "probe")
    except ValueError:
        return None


def namesrv_info(addr: str, timeout: float = 2.0) -> dict[str, object] | None:
    return probe_json(addr, RequestCode.GET_BROKER_CLUSTER_INFO, timeout)


def broker_info(
    addr: str, timeout: float = 2.0, credentials: Credentials | None = None
) -> dict[str, str] | None:
    """GET_BROKER_RUNTIME_INFO's table."""
    body = probe_json(addr, RequestCode.GET_BROKER_RUNTIME_INFO, timeout, credentials)
    table = body.get("table") if body else None
    return {str(k): str(v) for k, v in table.items()} if isinstance(table, dict) else None
