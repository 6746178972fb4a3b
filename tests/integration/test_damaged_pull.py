"""A damaged unit under a running broker: pulls deliver what precedes it and stop there, the
broker reports the position (log, GET_BROKER_RUNTIME_INFO), and after an operator's
`mqaudit store skip-unit` pulls go on past it."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import pytest

from broker_runtime.remoting.bodies import decode_json
from broker_runtime.remoting.protocol import RequestCode as C
from broker_runtime.remoting.protocol import ResponseCode as R
from tests.conftest import mqaudit_cmd
from tests.integration.cluster_fixtures import RawClient, running_cluster
from tests.integration.test_cluster_send_pull import dispatched

pytestmark = pytest.mark.integration
N = 10


def test_a_damaged_unit_is_reported_and_skipped_by_an_operator(tmp_path: Path) -> None:
    with running_cluster(tmp_path / "c", name_servers=1, slaves=False) as cluster:
        master = "broker-a-master"
        asyncio.run(_scenario(cluster.addr(master), cluster.store_dir(master)))
        log = Path(cluster.layout.node(master).log).read_text()
    assert "damaged unit: DMG/0 queue offset 4" in log, log[-3000:]


async def _scenario(addr: str, store: Path) -> None:
    c = RawClient()
    try:
        for i in range(N):
            assert (await c.send(addr, "DMG", f"m{i}".encode() * 20, 0)).code == R.SUCCESS
        await dispatched(c, addr, "DMG", 0, N)
        _resp, msgs = await c.pull(addr, "DMG", 0, 0)
        victim = msgs[4]
        segment = max(
            (p for p in (store / "commitlog").iterdir() if int(p.name) <= victim.phys_offset),
            key=lambda p: int(p.name),
        )
        with open(segment, "r+b") as f:  # its magic, under the running broker
            f.seek(victim.phys_offset - int(segment.name) + 4)
            f.write(b"\0\0\0\1")

        resp, got = await c.pull(addr, "DMG", 0, 0, group="new-group")
        assert resp.code == R.SUCCESS
        assert [m.body for m in got] == [f"m{i}".encode() * 20 for i in range(4)]
        assert int(resp.ext_fields["nextBeginOffset"]) == 4
        resp, got = await c.pull(addr, "DMG", 0, 4, group="new-group", suspend_ms=1500)
        assert (resp.code, got, int(resp.ext_fields["nextBeginOffset"])) == (
            R.PULL_NOT_FOUND, [], 4,
        )  # fmt: skip
        info = decode_json((await c.call(addr, C.GET_BROKER_RUNTIME_INFO)).body, "info")
        [unit] = json.loads(info["table"]["damagedUnits"])
        assert (unit["topic"], unit["queue_offset"], unit["phys_offset"]) == (
            "DMG", 4, victim.phys_offset,
        )  # fmt: skip

        skip = subprocess.run(
            mqaudit_cmd(
                "store", "skip-unit", "--store", str(store), "--topic", "DMG", "--queue", "0",
                "--offset", "4", "--by", "test", "--note", "damaged on disk",
            ),
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert skip.returncode == 0, skip.stderr
        resp, got = await c.pull(addr, "DMG", 0, 4, group="new-group", suspend_ms=3000)
        assert resp.code == R.SUCCESS
        assert [m.body for m in got] == [f"m{i}".encode() * 20 for i in range(5, N)]
    finally:
        await c.close()
