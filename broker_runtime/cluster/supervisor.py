"""Start a cluster's nodes as processes, wait until they answer, report on them, stop them.

Each node is `python -m broker_runtime.cli.main namesrv|broker ...` in its own session,
logging to DIR/logs/<node>.log. Ports are picked free (bind to port 0) just before a node
starts; a node that loses the race for its port exits with EXIT_PORT_IN_USE and is started
again on new ports. Nodes are stopped by PID: SIGTERM (a clean stop flushes the store and
removes its abort file), then SIGKILL after a grace period.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from broker_runtime.acl.accounts import admin_account, load_accounts
from broker_runtime.cluster.layout import HA_SECRET, ClusterLayout, NodeSpec, make_ha_secret
from broker_runtime.cluster.node import EXIT_PORT_IN_USE
from broker_runtime.cluster.probe import Credentials, broker_info, namesrv_info
from broker_runtime.common.constants import DEFAULT_CLUSTER
from broker_runtime.common.progress import reporter
from broker_runtime.common.topics import validate_group

PORT_TRIES = 5


class ClusterError(RuntimeError):
    """The cluster could not be brought up (or a node restarted); the message says which node."""


@dataclass(frozen=True)
class ClusterSettings:
    data_dir: Path
    name_servers: int = 2
    groups: tuple[str, ...] = ("broker-a", "broker-b")
    slaves: bool = True
    flush: str = "async"  # sync | async
    replication: str = "async"  # sync | async
    segment_size: int | None = None
    broker_settings: dict[str, str] = field(default_factory=dict)  # KEY=VALUE, "store.x" too
    namesrv_scan_ms: int | None = None
    namesrv_expiry_ms: int | None = None
    acl_file: Path | None = None
    host: str = "127.0.0.1"
    timeout_s: float = 60.0
    cluster_name: str = DEFAULT_CLUSTER  # brokerClusterName of every broker

    def __post_init__(self) -> None:
        if self.name_servers < 1:
            raise ValueError("a cluster needs at least one name server")
        if not self.groups:
            raise ValueError("a cluster needs at least one broker group")
        if self.replication == "sync" and not self.slaves:
            raise ValueError("--replication sync needs slaves: every send would fail")


say = reporter("cluster")


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def credentials(layout: ClusterLayout) -> Credentials | None:
    """The admin account to sign probes with, when the brokers check ACL."""
    acl = layout.settings.get("acl_file")
    if not acl:
        return None
    account = admin_account(load_accounts(Path(acl)))
    if account is None:
        raise ClusterError(f"ACL file {acl} has no admin account to check the brokers with")
    return account.access_key, account.secret_key


# -- building the layout -------------------------------------------------------------------------


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "broker_runtime.cli.main", *args]


def _namesrv_argv(s: ClusterSettings, node: NodeSpec) -> list[str]:
    argv = _cli("namesrv", "--host", node.host, "--port", str(node.port))
    argv += ["--data-dir", node.store_dir, "--log-file", node.log]
    if s.namesrv_scan_ms is not None:
        argv += ["--scan-interval-ms", str(s.namesrv_scan_ms)]
    if s.namesrv_expiry_ms is not None:
        argv += ["--broker-expiry-ms", str(s.namesrv_expiry_ms)]
    return argv


def _broker_config(s: ClusterSettings, layout: ClusterLayout, node: NodeSpec) -> dict[str, Any]:
    role = "SLAVE" if node.role == "slave" else f"{s.replication.upper()}_MASTER"
    data: dict[str, Any] = {
        "cluster_name": layout.cluster_name,
        "broker_name": node.group,
        "broker_id": node.broker_id,
        "role": role,
        "host": node.host,
        "port": node.port,
        "ha_port": node.ha_port or 0,
        "namesrv_addrs": layout.namesrv_addr,
    }
    store: dict[str, Any] = {"store_dir": node.store_dir, "flush": s.flush}
    if s.segment_size is not None:
        store["segment_size"] = s.segment_size
    if s.acl_file is not None:
        data["acl_enable"] = True
        data["acl_file"] = str(s.acl_file)
    else:  # no ACL secret to authenticate slaves with: one made for this cluster
        data["ha_secret_file"] = str(Path(layout.data_dir) / HA_SECRET)
    for key, value in s.broker_settings.items():
        if key.startswith("store."):
            store[key[len("store.") :]] = value
        else:
            data[key] = value
    data["store"] = store
    return data


def plan(s: ClusterSettings) -> ClusterLayout:
    """Every node of the cluster, ports still unassigned (0)."""
    root = s.data_dir.resolve()
    layout = ClusterLayout(data_dir=str(root), cluster_name=validate_group(s.cluster_name))
    layout.settings = {
        "name_servers": s.name_servers,
        "groups": list(s.groups),
        "slaves": s.slaves,
        "flush": s.flush,
        "replication": s.replication,
        "segment_size": s.segment_size,
        "acl_file": str(s.acl_file.resolve()) if s.acl_file else None,
    }
    logs = root / "logs"
    for i in range(s.name_servers):
        name = f"namesrv-{i}"
        layout.nodes.append(
            NodeSpec(name, "namesrv", s.host, 0, str(root / name), str(logs / f"{name}.log"), [])
        )
    for group in s.groups:
        for role, broker_id in (("master", 0), ("slave", 1)) if s.slaves else (("master", 0),):
            name = f"{group}-{role}"
            layout.nodes.append(NodeSpec(
                name, role, s.host, 0, str(root / "brokers" / group / role),
                str(logs / f"{name}.log"), [], group=group, broker_id=broker_id,
                ha_port=0 if role == "master" else None, config=str(root / "conf" / f"{name}.json"),
            ))  # fmt: skip
    return layout


def _assign_ports(s: ClusterSettings, layout: ClusterLayout, node: NodeSpec) -> None:
    node.port = free_port(node.host)
    if node.role == "master":
        node.ha_port = free_port(node.host)
    if node.role == "namesrv":
        node.argv = _namesrv_argv(s, node)
    else:
        assert node.config is not None
        Path(node.config).parent.mkdir(parents=True, exist_ok=True)
        Path(node.config).write_text(json.dumps(_broker_config(s, layout, node), indent=2))
        node.argv = _cli("broker", "--config", node.config, "--log-file", node.log)


# -- processes -------------------------------------------------------------------------------


def _listens(pid: int, ports: set[int]) -> bool:
    """Whether process `pid` listens on every one of `ports`."""
    try:
        conns = psutil.Process(pid).net_connections("tcp")
    except psutil.Error:
        return False
    return ports <= {c.laddr.port for c in conns if c.status == psutil.CONN_LISTEN}


def _answering(layout: ClusterLayout, node: NodeSpec, creds: Credentials | None) -> bool:
    """The node answers on its port, and it is this node's process that listens there and on
    its HA port: a port handed out twice (to a node of this cluster or another) is answered by
    the node that bound it first, and the second exits with EXIT_PORT_IN_USE."""
    assert node.pid is not None
    if not _listens(node.pid, {p for p in (node.port, node.ha_port) if p}):
        return False
    if node.role == "namesrv":
        return namesrv_info(node.addr, 1.0) is not None
    return broker_info(node.addr, 1.0, creds) is not None


def _log_tail(node: NodeSpec, lines: int = 15) -> str:
    try:
        return "\n".join(Path(node.log).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


_save_lock = threading.Lock()
_children: list[subprocess.Popen[bytes]] = []  # referenced until exit: no ResourceWarning


def launch(layout: ClusterLayout, node: NodeSpec, timeout_s: float) -> int:
    """Start one node and wait until it answers; returns its exit code if it died (else 0)."""
    Path(node.log).parent.mkdir(parents=True, exist_ok=True)
    Path(node.store_dir).mkdir(parents=True, exist_ok=True)
    with open(node.log, "ab") as out:
        proc = subprocess.Popen(
            node.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, cwd=layout.data_dir,
        )  # fmt: skip
    _children.append(proc)
    node.pid = proc.pid
    node.started_at = int(psutil.Process(proc.pid).create_time() * 1000)
    creds = credentials(layout)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        code = proc.poll()
        if code is not None:
            node.pid = None
            return code
        if _answering(layout, node, creds):
            return 0
        time.sleep(0.1)
    raise ClusterError(f"{node.name} did not answer within {timeout_s:g} s:\n{_log_tail(node)}")


def start_node(
    layout: ClusterLayout, node: NodeSpec, settings: ClusterSettings | None, timeout_s: float
) -> None:
    """Start `node`; with `settings`, on fresh ports (retried if another process took one)."""
    for attempt in range(PORT_TRIES):
        if settings is not None:
            _assign_ports(settings, layout, node)
        code = launch(layout, node, timeout_s)
        if code == 0:
            say(f"{node.name} answering on {node.addr} (pid {node.pid})")
            with _save_lock:
                layout.save()
            return
        if code != EXIT_PORT_IN_USE or settings is None:
            raise ClusterError(f"{node.name} exited with {code}:\n{_log_tail(node)}")
        say(f"{node.name}: port taken, trying new ports ({attempt + 1}/{PORT_TRIES})")
    raise ClusterError(f"{node.name}: no free port after {PORT_TRIES} tries")


def wait_ready(layout: ClusterLayout, timeout_s: float) -> None:
    """Every name server lists every broker, and every master has its slave connected."""
    creds = credentials(layout)
    brokers = layout.brokers()
    deadline = time.monotonic() + timeout_s
    missing: list[str] = []
    while time.monotonic() < deadline:
        missing = []
        for ns in (n for n in layout.nodes if n.role == "namesrv"):
            info = namesrv_info(ns.addr) or {}
            table = info.get("brokerAddrTable", {})
            listed = {
                a for d in (table.values() if isinstance(table, dict) else [])
                for a in d.get("brokerAddrs", {}).values()
            }  # fmt: skip
            missing += [f"{b.name} not on {ns.name}" for b in brokers if b.addr not in listed]
        for m in (b for b in brokers if b.role == "master" and layout.settings.get("slaves")):
            rt = broker_info(m.addr, 1.0, creds) or {}
            if int(rt.get("haConnections", "0")) < 1:
                missing.append(f"{m.name} has no slave connected")
        if not missing:
            return
        time.sleep(0.2)
    raise ClusterError(f"cluster not ready within {timeout_s:g} s: {missing}")


def up(settings: ClusterSettings) -> ClusterLayout:
    """Start a whole cluster in `settings.data_dir` and wait until it is ready."""
    if (settings.data_dir / "cluster.json").exists():
        old = ClusterLayout.load(settings.data_dir)
        alive = [n.name for n in old.nodes if process_alive(n)]
        if alive:
            raise ClusterError(
                f"{settings.data_dir} has a running cluster ({alive}): down it first"
            )
    layout = plan(settings)
    Path(layout.data_dir).mkdir(parents=True, exist_ok=True)
    if settings.acl_file is None:  # before the nodes start side by side
        make_ha_secret(Path(layout.data_dir))
    layout.save()
    start_all(layout, settings, settings.timeout_s)
    return layout


def start_all(layout: ClusterLayout, settings: ClusterSettings | None, timeout_s: float) -> None:
    """Start every node of `layout`, each role's nodes side by side (name servers first), and
    wait until the cluster is ready; on failure, stop what started. With `settings`, on fresh
    ports; without, a stopped cluster starts again on its own."""
    try:
        for role in ("namesrv", "master", "slave"):
            nodes = [n for n in layout.nodes if n.role == role]
            with ThreadPoolExecutor(len(nodes) or 1) as pool:
                futures = [pool.submit(start_node, layout, n, settings, timeout_s) for n in nodes]
                for f in futures:
                    f.result()
        wait_ready(layout, timeout_s)
    except BaseException:
        down(layout)
        raise


# -- status and stop -----------------------------------------------------------------------------


def _process(node: NodeSpec) -> psutil.Process | None:
    """The node's process if it is still the one we started (pids get recycled)."""
    if node.pid is None:
        return None
    try:
        proc = psutil.Process(node.pid)
        if _exited(proc):
            return None
        if node.started_at is not None and abs(proc.create_time() * 1000 - node.started_at) > 1000:
            return None
        return proc
    except psutil.Error:
        return None


def process_alive(node: NodeSpec) -> bool:
    return _process(node) is not None


def signal_node(node: NodeSpec, sig: int) -> bool:
    """Send `sig` to the node's process if it is still ours; False if it is not running."""
    proc = _process(node)
    if proc is None:
        return False
    os.kill(proc.pid, sig)
    return True


def stop_nodes(
    layout: ClusterLayout, nodes: list[NodeSpec], grace_s: float = 20.0
) -> dict[str, str]:
    """SIGTERM, wait up to `grace_s`, SIGKILL what is left; returns what happened per node."""
    result: dict[str, str] = {}
    procs: dict[str, psutil.Process] = {}
    for n in nodes:
        proc = _process(n)
        if proc is None:
            result[n.name] = "not running"
            n.pid = None
            continue
        proc.send_signal(signal.SIGTERM)
        procs[n.name] = proc
    alive = _wait_exited(list(procs.values()), grace_s)
    for name, proc in procs.items():
        if proc in alive:
            proc.kill()
            result[name] = "killed after grace period"
        else:
            result[name] = "stopped"
        layout.node(name).pid = None
    _wait_exited(alive, 5.0)
    layout.save()
    return result


def _exited(proc: psutil.Process) -> bool:
    """Gone, or a zombie: a node started by an earlier command is init's child, and an init
    that reaps late (this machine's: 1-2.5 s) must not make it look alive."""
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def _wait_exited(procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Wait until each process has exited (ours are reaped); those left after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        for child in _children:
            child.poll()  # reap
        procs = [p for p in procs if not _exited(p)]
        if not procs or time.monotonic() >= deadline:
            return procs
        time.sleep(0.05)


def down(layout: ClusterLayout, grace_s: float = 20.0) -> dict[str, str]:
    """Stop the brokers, then the name servers."""
    result = stop_nodes(layout, layout.brokers(), grace_s)
    result.update(stop_nodes(layout, [n for n in layout.nodes if n.role == "namesrv"], grace_s))
    return result
