"""Replication through a fault-injecting proxy (Toxiproxy) between master and slave.

The slave is restarted with its master's HA address pointing at the proxy; toxics then delay,
drop and cut the link under send load. SYNC_MASTER must never answer SEND_OK for a message
the slave does not hold at that moment; ASYNC_MASTER killed mid-load loses only the tail the
slave had not received, and the test reports exactly which messages that is.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from toxiproxy import Toxiproxy

from broker_runtime.remoting.command import RemotingCommand
from broker_runtime.remoting.protocol import RequestCode as C
from broker_runtime.remoting.protocol import ResponseCode as R
from tests.fault_proxy import toxiproxy_server
from tests.integration.cluster_fixtures import Cluster, RawClient, running_cluster
from tests.integration.test_cluster_ha import (
    crash_under_load,
    failover_loss,
    load,
    runtime,
    wait_caught_up,
)

pytestmark = pytest.mark.integration


def wait_until(cond: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


def slave_behind_proxy(c: Cluster, server: Toxiproxy) -> Any:
    """Restart the slave so that it replicates through a new proxy; returns the proxy."""
    master = c.layout.node("broker-a-master")
    proxy = server.create(upstream=f"{master.host}:{master.ha_port}", name="ha-link")
    c.stop("broker-a-slave")
    conf = Path(c.layout.node("broker-a-slave").config or "")
    data = json.loads(conf.read_text())
    data["ha_master_addr"] = proxy.listen
    conf.write_text(json.dumps(data))
    c.start("broker-a-slave")
    wait_until(lambda: int(asyncio.run(runtime(c.addr("broker-a-master")))["haConnections"]) == 1)
    return proxy


async def sync_sends(c: Cluster, seconds: float, senders: int = 4) -> tuple[Counter[str], int]:
    """Sends for `seconds`; each SEND_OK is checked against the slave's log end at once.
    Returns (answers by name, SEND_OKs whose message the slave did not hold)."""
    slave = c.addr("broker-a-slave")
    codes: Counter[str] = Counter()
    unheld = 0

    async def check(client: RawClient, r: RemotingCommand) -> None:
        nonlocal unheld
        codes[R(r.code).name] += 1
        if r.code == R.SUCCESS:
            end = int(r.ext_fields["physOffset"])
            rt = await client.call(slave, C.GET_BROKER_RUNTIME_INFO)
            unheld += int(json.loads(rt.body)["table"]["commitLogMaxOffset"]) <= end

    await load(c.addr("broker-a-master"), seconds, senders, on_answer=check)
    return codes, unheld


FAULTS: list[tuple[str, dict[str, Any]]] = [
    ("delay 1.5 s", {"type": "latency", "attributes": {"latency": 1500}}),
    ("drop everything", {"type": "timeout", "attributes": {"timeout": 0}}),
    ("cut (RST)", {"type": "reset_peer", "attributes": {"timeout": 0}}),
]


def test_sync_master_acknowledges_only_what_the_slave_holds(tmp_path: Path) -> None:
    with (
        toxiproxy_server() as server,
        running_cluster(
            tmp_path / "c",
            name_servers=1,
            flush="sync",
            replication="sync",
            settings={"sync_replica_timeout_ms": "500"},
        ) as c,
    ):
        proxy = slave_behind_proxy(c, server)
        report: dict[str, dict[str, int]] = {}
        codes, unheld = asyncio.run(sync_sends(c, 2.0))
        report["clean"] = {**codes, "unheld": unheld}
        assert codes["SUCCESS"] > 0 and unheld == 0, report
        for name, toxic in FAULTS:
            proxy.add_toxic(name="fault", stream="downstream", **toxic)
            codes, unheld = asyncio.run(sync_sends(c, 3.0))
            proxy.destroy_toxic("fault")
            report[name] = {**codes, "unheld": unheld}
            assert unheld == 0, report
            assert codes["SUCCESS"] < sum(codes.values()), report  # the fault was felt

            def healed() -> bool:
                return asyncio.run(sync_sends(c, 0.2, senders=1))[0]["SUCCESS"] > 0

            wait_until(healed, 60)
        codes, unheld = asyncio.run(sync_sends(c, 2.0))
        report["healed"] = {**codes, "unheld": unheld}
        print(f"\nSYNC_MASTER through the proxy: {json.dumps(report)}")
        assert codes["SUCCESS"] > 0 and unheld == 0, report


def test_async_master_loses_only_the_tail_the_slave_never_got(tmp_path: Path) -> None:
    with (
        toxiproxy_server() as server,
        running_cluster(tmp_path / "c", name_servers=1, flush="async", replication="async") as c,
    ):
        proxy = slave_behind_proxy(c, server)
        before, failed_before = asyncio.run(load(c.addr("broker-a-master"), 2.0))
        wait_caught_up(c)
        proxy.add_toxic(name="fault", stream="downstream", **FAULTS[1][1])  # drop
        after, failed = crash_under_load(c, 4.0)
        proxy.destroy_toxic("fault")
        assert after, "the master acknowledged nothing between the toxic and the kill"
        acks, failed = before + after, failed_before + failed
        assert len(acks) > 200
        report = failover_loss(c, acks, failed)
        print(f"\nASYNC_MASTER, link dropping, master killed: {json.dumps(report)[:300]}")
        # Nothing sent while the link dropped everything reached the slave.
        assert report["lost_at_failover"] == len(after), report
        assert report["slave_log_end"] > max(a.phys_offset for a in before)  # caught up first
