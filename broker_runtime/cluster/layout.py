"""`DIR/cluster.json`: what `mqaudit cluster up` started, for status, down and the clients.

{"version": 1, "data_dir": DIR, "cluster_name": "DefaultCluster",
 "namesrv_addr": "127.0.0.1:p1;127.0.0.1:p2", "settings": {...},
 "nodes": [{"name": "namesrv-0", "role": "namesrv", "group": null, "broker_id": null,
            "host": "127.0.0.1", "port": p1, "ha_port": null, "pid": 123,
            "started_at": ms, "store_dir": "DIR/namesrv-0", "log": "DIR/logs/namesrv-0.log",
            "config": null, "argv": [...]},
           {"name": "broker-a-master", "role": "master", "group": "broker-a", "broker_id": 0,
            "port": ..., "ha_port": ..., "store_dir": "DIR/brokers/broker-a/master",
            "config": "DIR/conf/broker-a-master.json", ...}, ...]}
`pid` is null for a node that was stopped; `started_at` (the process's start time, ms)
guards against signalling a recycled pid.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker_runtime.common.constants import DEFAULT_CLUSTER
from broker_runtime.offsets.json_file import read_with_backup, write_atomic

CLUSTER_FILE = "cluster.json"
ROLES = ("namesrv", "master", "slave")


HA_SECRET = Path("conf") / "ha-secret"  # the replication secret of a cluster without ACL


def make_ha_secret(root: Path) -> Path:
    """DIR/conf/ha-secret, made once (random, readable by its owner only)."""
    path = root / HA_SECRET
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    return path


@dataclass
class NodeSpec:
    name: str
    role: str  # namesrv | master | slave
    host: str
    port: int
    store_dir: str
    log: str
    argv: list[str]
    group: str | None = None
    broker_id: int | None = None
    ha_port: int | None = None
    config: str | None = None
    pid: int | None = None
    started_at: int | None = None

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def is_broker(self) -> bool:
        return self.role != "namesrv"


@dataclass
class ClusterLayout:
    data_dir: str
    cluster_name: str = DEFAULT_CLUSTER
    settings: dict[str, Any] = field(default_factory=dict)
    nodes: list[NodeSpec] = field(default_factory=list)
    version: int = 1

    @property
    def namesrv_addr(self) -> str:
        return ";".join(n.addr for n in self.nodes if n.role == "namesrv")

    def node(self, name: str) -> NodeSpec:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(
            f"no node {name!r} in {self.data_dir}; nodes: {[n.name for n in self.nodes]}"
        )

    def brokers(self) -> list[NodeSpec]:
        return [n for n in self.nodes if n.is_broker]

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["namesrv_addr"] = self.namesrv_addr
        return out

    def save(self) -> None:
        write_atomic(Path(self.data_dir) / CLUSTER_FILE, self.to_json())

    @classmethod
    def load(cls, data_dir: Path) -> ClusterLayout:
        data = read_with_backup(Path(data_dir) / CLUSTER_FILE)
        if data is None:
            raise FileNotFoundError(
                f"{data_dir} has no {CLUSTER_FILE}: no cluster was started there"
            )
        try:
            nodes = [NodeSpec(**n) for n in data["nodes"]]
            return cls(
                data_dir=data["data_dir"],
                cluster_name=data.get("cluster_name", DEFAULT_CLUSTER),
                settings=data.get("settings", {}),
                nodes=nodes,
                version=data.get("version", 1),
            )
        except (KeyError, TypeError) as e:
            raise ValueError(f"{data_dir}/{CLUSTER_FILE} has a bad shape: {e!r}") from None


def namesrv_of_data_dir(data_dir: Path) -> str:
    """`host:port;...` of the name servers DIR/cluster.json lists."""
    if not (data_dir / CLUSTER_FILE).exists():
        raise ValueError(f"{data_dir / CLUSTER_FILE} not found: is a cluster running there?")
    addr = ClusterLayout.load(data_dir).namesrv_addr
    if not addr:
        raise ValueError(f"{data_dir / CLUSTER_FILE} lists no name server")
    return addr
