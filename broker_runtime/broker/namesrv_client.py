"""The broker's calls to the name servers (RocketMQ's BrokerOuterAPI): register, unregister.

A broker registers with every name server at start and every register interval; the name
servers never talk to each other, so each one only knows what this broker told it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from broker_runtime.remoting.bodies import encode_json
from broker_runtime.remoting.command import request
from broker_runtime.remoting.headers import (
    RegisterBrokerRequestHeader,
    RegisterBrokerResponseHeader,
    UnregisterBrokerRequestHeader,
)
from broker_runtime.remoting.protocol import RequestCode, ResponseCode

if TYPE_CHECKING:
    from broker_runtime.broker.controller import BrokerController

log = logging.getLogger(__name__)


def register_body(ctl: BrokerController) -> bytes:
    table = {
        name: {
            "readQueueNums": c.read_queue_nums,
            "writeQueueNums": c.write_queue_nums,
            "perm": c.perm,
        }
        for name, c in sorted(ctl.topics.table.items())
    }
    return encode_json({"topicConfigTable": table, "dataVersion": ctl.topics.version.to_json()})


async def _register_one(ctl: BrokerController, addr: str, body: bytes) -> bool:
    cfg = ctl.config
    ha_addr = f"{cfg.host}:{ctl.ha_master.port}" if ctl.ha_master else cfg.ha_addr
    header = RegisterBrokerRequestHeader(
        cfg.broker_name, cfg.addr, cfg.cluster_name, ha_addr, cfg.broker_id
    )
    try:
        resp = await ctl.call(addr, request(RequestCode.REGISTER_BROKER, header.fields(), body))
    except Exception as e:
        log.warning("register with name server %s failed: %s", addr, e)
        return False
    if resp.code != ResponseCode.SUCCESS:
        log.warning("name server %s refused registration: %s", addr, resp.remark)
        return False
    out = RegisterBrokerResponseHeader.decode(resp)
    if not ctl.is_master:
        if out.master_addr:
            ctl.master_addr = out.master_addr
        if out.ha_server_addr and not cfg.ha_master_addr:
            ctl.master_ha_addr = out.ha_server_addr
    return True


async def register_all(ctl: BrokerController) -> int:
    """Register with every name server at once; returns how many accepted."""
    body = register_body(ctl)
    results = await asyncio.gather(*(_register_one(ctl, a, body) for a in ctl.config.namesrv_addrs))
    return sum(results)


async def unregister_all(ctl: BrokerController) -> None:
    cfg = ctl.config
    header = UnregisterBrokerRequestHeader(
        cfg.broker_name, cfg.addr, cfg.cluster_name, cfg.broker_id
    )

    async def one(addr: str) -> None:
        try:
            await ctl.call(addr, request(RequestCode.UNREGISTER_BROKER, header.fields()), 2.0)
        except Exception as e:
            log.info("unregister from %s failed: %s", addr, e)

    await asyncio.gather(*(one(a) for a in cfg.namesrv_addrs))
