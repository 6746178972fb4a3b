"""MQClientAPI against real loopback servers: name-server failover under concurrent calls."""

from __future__ import annotations

import asyncio
import socket

from broker_runtime.client.api import MQClientAPI
from broker_runtime.client.config import ClientConfig
from broker_runtime.common import aio
from broker_runtime.remoting.command import RemotingCommand, response_to
from broker_runtime.remoting.protocol import RequestCode, ResponseCode
from broker_runtime.remoting.server import ProcessorTable, RemotingServer


def closed_port() -> int:
    """A loopback port nothing listens on (connections to it are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def no_such_topic(cmd: RemotingCommand, conn: object) -> RemotingCommand:
    return response_to(cmd, ResponseCode.TOPIC_NOT_EXIST, "no route")


def test_concurrent_lookups_starting_at_a_dead_name_server_all_reach_the_live_one() -> None:
    """Each call tries every name server once: a concurrent call that moved the current
    server must not make another try the dead one twice and the live one never."""

    async def main() -> None:
        server = RemotingServer(ProcessorTable({RequestCode.GET_ROUTEINFO_BY_TOPIC: no_such_topic}))
        port = await server.start()
        api = MQClientAPI(ClientConfig(f"127.0.0.1:{closed_port()};127.0.0.1:{port}"))
        failed = 0
        try:
            for _ in range(20):
                api._ns_index = 0  # the dead one
                results = await asyncio.gather(
                    *(api.get_route(f"T{i}") for i in range(8)), return_exceptions=True
                )
                failed += sum(1 for r in results if r is not None)
        finally:
            await api.close()
            await server.close()
        assert failed == 0, f"{failed} of 160 look-ups failed"

    aio.run(main())
