"""A real cluster for tests: brought up through the CLI in a data dir, taken down by PID.

    with running_cluster(tmp_path / "c", groups=("broker-a",), replication="sync") as c:
        c.addr("broker-a-master")            # "127.0.0.1:port"
        c.namesrv_addr                       # "127.0.0.1:p1;127.0.0.1:p2"
        c.kill("broker-a-master")            # SIGKILL (a crash); c.stop(...) is SIGTERM
        c.start("broker-a-master")           # again, on its old ports; waits until answering
        c.status()                           # `mqaudit cluster status` JSON

Brokers get small files and short intervals (TEST_BROKER_SETTINGS) so that tests are fast;
pass `settings` to override. `RawClient` is a minimal request/response client on
RemotingClient + the typed headers, for tests of the broker itself (not the product client).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psutil

from broker_runtime.acl.signing import sign_command
from broker_runtime.cluster.layout import ClusterLayout
from broker_runtime.common.message import StoredMessage, properties_to_string
from broker_runtime.remoting.client import RemotingClient
from broker_runtime.remoting.command import RemotingCommand, request
from broker_runtime.remoting.headers import PullMessageRequestHeader, SendMessageRequestHeader
from broker_runtime.remoting.protocol import RequestCode
from broker_runtime.store import record_codec as codec
from tests.conftest import mqaudit_cmd

TEST_BROKER_SETTINGS: dict[str, str] = {
    "register_interval_ms": "1000",
    "client_scan_interval_ms": "1000",
    "offset_persist_interval_ms": "1000",
    "slave_sync_interval_ms": "1000",
    "ha_heartbeat_interval_ms": "1000",
    "ha_housekeeping_ms": "5000",
    "ha_reconnect_ms": "200",
    "store.cq_entries_per_file": "4096",
    "store.index_hash_slots": "4096",
    "store.index_max_entries": "16384",
    "store.flush_interval_ms": "100",
    "store.cq_flush_interval_ms": "200",
}


class Cluster:
    """Handle on a cluster started by `running_cluster`; every action goes through the CLI."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir

    @property
    def layout(self) -> ClusterLayout:
        return ClusterLayout.load(self.data_dir)

    @property
    def namesrv_addr(self) -> str:
        return self.layout.namesrv_addr

    def addr(self, node: str) -> str:
        return self.layout.node(node).addr

    def store_dir(self, node: str) -> Path:
        return Path(self.layout.node(node).store_dir)

    def pid(self, node: str) -> int | None:
        return self.layout.node(node).pid

    def _cli(self, *args: str, timeout: float = 120) -> str:
        out = subprocess.run(
            mqaudit_cmd("cluster", *args, "--data-dir", str(self.data_dir)),
            capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        if out.returncode not in (0, 1) or (out.returncode == 1 and args[0] != "status"):
            raise RuntimeError(f"cluster {args} failed ({out.returncode}): {out.stderr[-3000:]}")
        return out.stdout

    def kill(self, node: str) -> None:
        """SIGKILL: the node gets no chance to flush or clean up."""
        self._cli("stop-node", node, "--kill")

    def stop(self, node: str) -> None:
        """SIGTERM and wait: a clean stop."""
        self._cli("stop-node", node)

    def start(self, node: str) -> None:
        self._cli("start-node", node)

    def status(self) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self._cli("status"))
        return result

    def down(self) -> dict[str, str]:
        result: dict[str, str] = json.loads(self._cli("down"))
        return result


@contextlib.contextmanager
def running_cluster(
    data_dir: Path,
    *,
    name_servers: int = 2,
    groups: Sequence[str] = ("broker-a",),
    slaves: bool = True,
    flush: str = "async",
    replication: str = "async",
    segment_size: int = 1 << 20,
    acl: Path | None = None,
    settings: dict[str, str] | None = None,
    namesrv_expiry_ms: int | None = None,
) -> Iterator[Cluster]:
    """`mqaudit cluster up --detach` in `data_dir`; down (by PID) when the block ends."""
    argv = ["up", "--data-dir", str(data_dir), "--detach", "--name-servers", str(name_servers)]
    argv += ["--groups", ",".join(groups), "--slaves" if slaves else "--no-slaves"]
    argv += ["--flush", flush, "--replication", replication, "--segment-size", str(segment_size)]
    argv += ["--namesrv-scan-ms", "500"]
    if namesrv_expiry_ms is not None:
        argv += ["--namesrv-expiry-ms", str(namesrv_expiry_ms)]
    if acl is not None:
        argv += ["--acl", str(acl)]
    for key, value in {**TEST_BROKER_SETTINGS, **(settings or {})}.items():
        argv += ["--set", f"{key}={value}"]
    out = subprocess.run(mqaudit_cmd("cluster", *argv), capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        kill_leftovers(data_dir)
        raise RuntimeError(f"cluster up failed ({out.returncode}):\n{out.stderr[-5000:]}")
    cluster = Cluster(data_dir)
    try:
        yield cluster
    finally:
        try:
            cluster.down()
        finally:
            kill_leftovers(data_dir)


def kill_leftovers(data_dir: Path) -> None:
    """Whatever `down` could not stop is SIGKILLed by the PIDs cluster.json records."""
    with contextlib.suppress(FileNotFoundError, ValueError):
        for node in ClusterLayout.load(data_dir).nodes:
            if node.pid is not None and psutil.pid_exists(node.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(node.pid, signal.SIGKILL)


class RawClient:
    """Requests to nodes with the typed headers; optional ACL signing."""

    def __init__(self, credentials: tuple[str, str] | None = None) -> None:
        self.remoting = RemotingClient()
        self.credentials = credentials

    async def call(
        self,
        addr: str,
        code: int,
        fields: dict[str, object] | None = None,
        body: bytes = b"",
        timeout: float = 10.0,
    ) -> RemotingCommand:
        cmd = request(code, fields, body)
        if self.credentials is not None:
            sign_command(cmd, *self.credentials)
        return await self.remoting.invoke(addr, cmd, timeout)

    async def send(
        self,
        addr: str,
        topic: str,
        body: bytes,
        queue_id: int = 0,
        properties: dict[str, str] | None = None,
        timeout: float = 10.0,
    ) -> RemotingCommand:
        h = SendMessageRequestHeader(
            "test-producer", topic, queue_id, int(time.time() * 1000),
            properties=properties_to_string(properties or {}),
        )  # fmt: skip
        return await self.call(addr, RequestCode.SEND_MESSAGE, h.fields(), body, timeout)

    async def pull(
        self,
        addr: str,
        topic: str,
        queue_id: int,
        offset: int,
        *,
        group: str = "test-consumer",
        max_nums: int = 32,
        suspend_ms: int = 0,
        subscription: str = "*",
    ) -> tuple[RemotingCommand, list[StoredMessage]]:
        h = PullMessageRequestHeader(
            group, topic, queue_id, offset, max_msg_nums=max_nums,
            suspend_timeout_millis=suspend_ms, subscription=subscription,
        )  # fmt: skip
        resp = await self.call(
            addr, RequestCode.PULL_MESSAGE, h.fields(), timeout=suspend_ms / 1000 + 10
        )
        return resp, decode_units(resp.body)

    async def close(self) -> None:
        await self.remoting.close()


def decode_units(body: bytes) -> list[StoredMessage]:
    """CommitLog units back to back (a pull or query body) -> messages, CRC-checked."""
    out, pos = [], 0
    while pos < len(body):
        size = codec.check_unit(body, pos, len(body))
        out.append(codec.decode(body, pos))
        pos += size
    return out
