"""A RabbitMQ node of its own, on 127.0.0.1 ephemeral ports, stopped by PID.

The Debian `rabbitmq-server` runs as the current user with everything of its own under one
directory: node name, AMQP, management, distribution and epmd ports (ERL_EPMD_PORT, so the
node's epmd is not the machine's), mnesia and log dirs, HOME (hence its Erlang cookie) and
an enabled-plugins file naming `rabbitmq_management`. It is ready once
`rabbitmqctl await_startup` returns and the management API answers; it is stopped by
signalling its process group (the beam and its helpers), and its epmd is told to quit.
The tests start theirs with it (tests/rabbitmq.py); so can a demo, given `root`.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


RABBIT_BIN = Path(os.environ.get("RABBITMQ_BIN", "/usr/lib/rabbitmq/bin"))
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0
USER, PASSWORD = "guest", "guest"  # the default user, allowed on loopback only


@dataclass(frozen=True)
class RabbitNode:
    """A running node: its AMQP and management ports and how to reach them."""

    node: str
    amqp_port: int
    mgmt_port: int
    env: dict[str, str]
    root: Path

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.mgmt_port}/api"

    def amqp_url(self, vhost: str = "/") -> str:
        quoted = urllib.parse.quote(vhost, safe="")
        return f"amqp://{USER}:{PASSWORD}@127.0.0.1:{self.amqp_port}/{quoted}"

    def api(self, method: str, path: str, body: Any = None) -> Any:
        """One management API call (`path` after /api, already quoted); JSON in and out."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.api_url}{path}", data=data, method=method)
        token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
        request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=30) as response:
            raw = response.read()
        return json.loads(raw) if raw else None

    def ctl(self, *args: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
        """`rabbitmqctl -n NODE ARGS` with the node's environment (cookie, epmd port)."""
        return subprocess.run(
            [str(RABBIT_BIN / "rabbitmqctl"), "-n", self.node, *args],
            env=self.env, capture_output=True, text=True, timeout=timeout_s,
        )  # fmt: skip

    def add_vhost(self, name: str) -> None:
        quoted = urllib.parse.quote(name, safe="")
        self.api("PUT", f"/vhosts/{quoted}")
        perms = {"configure": ".*", "write": ".*", "read": ".*"}
        self.api("PUT", f"/permissions/{quoted}/{USER}", perms)

    def delete_vhost(self, name: str) -> None:
        with suppress(urllib.error.HTTPError):
            self.api("DELETE", f"/vhosts/{urllib.parse.quote(name, safe='')}")


def rabbitmq_available() -> bool:
    return (RABBIT_BIN / "rabbitmq-server").exists() and shutil.which("erl") is not None


class RabbitUnavailable(RuntimeError):
    """The Debian rabbitmq-server (or Erlang) is not installed."""


@contextmanager
def rabbitmq_node(root: Path | None = None) -> Iterator[RabbitNode]:
    """Start a node (see module doc) with its files under `root` (a new temporary directory,
    removed afterwards, by default); yields it once it answers, stops it on exit."""
    if not rabbitmq_available():
        raise RabbitUnavailable(f"RabbitMQ is not installed ({RABBIT_BIN}/rabbitmq-server)")
    own = root is None
    root = Path(tempfile.mkdtemp(prefix="mqaudit-rabbit-")) if root is None else Path(root)
    root.mkdir(parents=True, exist_ok=True)
    amqp, mgmt, dist, epmd = free_port(), free_port(), free_port(), free_port()
    node = f"mqaudit{amqp}@localhost"
    (root / "home").mkdir(exist_ok=True)
    (root / "rabbitmq.conf").write_text(
        f"listeners.tcp.default = 127.0.0.1:{amqp}\n"
        f"management.tcp.port = {mgmt}\n"
        "management.tcp.ip = 127.0.0.1\n"
        "loopback_users.guest = true\n"
    )
    (root / "enabled_plugins").write_text("[rabbitmq_management].\n")
    env = {
        **os.environ, "HOME": str(root / "home"), "RABBITMQ_NODENAME": node,
        "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1", "RABBITMQ_NODE_PORT": str(amqp),
        "RABBITMQ_DIST_PORT": str(dist), "ERL_EPMD_PORT": str(epmd),
        "RABBITMQ_MNESIA_BASE": str(root / "mnesia"), "RABBITMQ_LOG_BASE": str(root / "log"),
        "RABBITMQ_CONFIG_FILE": str(root / "rabbitmq"), "RABBITMQ_PID_FILE": str(root / "pid"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(root / "enabled_plugins"),
        "RABBITMQ_PLUGINS_EXPAND_DIR": str(root / "plugins-expand"),
        "RABBITMQ_ALLOW_INPUT": "", "LC_ALL": "C.UTF-8",
    }  # fmt: skip
    log = root / "server.log"
    rabbit = RabbitNode(node, amqp, mgmt, env, root)
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(RABBIT_BIN / "rabbitmq-server")], env=env, stdout=out,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
    try:
        _await_ready(rabbit, proc, log)
        yield rabbit
    finally:
        _stop(proc, env, epmd)
        if own:
            shutil.rmtree(root, ignore_errors=True)


def _await_ready(rabbit: RabbitNode, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S

    def failed(why: str) -> RuntimeError:
        return RuntimeError(f"RabbitMQ {why}:\n{log.read_text(errors='replace')[-3000:]}")

    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise failed(f"exited with {proc.returncode}")
        left = max(1.0, deadline - time.monotonic())
        try:
            done = rabbit.ctl("await_startup", "--timeout", str(int(left)), timeout_s=left + 10)
        except subprocess.TimeoutExpired:
            break
        if done.returncode == 0:
            break
        time.sleep(0.2)  # the node's distribution is not up yet: ask again
    while time.monotonic() < deadline:  # the management listener starts last
        with suppress(OSError, urllib.error.URLError):
            if rabbit.api("GET", "/overview").get("node") == rabbit.node:
                return
        if proc.poll() is not None:
            raise failed(f"exited with {proc.returncode}")
        time.sleep(0.1)
    raise failed(f"not ready in {START_TIMEOUT_S} s")


def _stop(proc: subprocess.Popen[bytes], env: dict[str, str], epmd_port: int) -> None:
    """SIGTERM to the node's process group (a clean shutdown), SIGKILL after a while."""
    if proc.poll() is None:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    with suppress(ProcessLookupError):  # helpers (heart, inet_gethost) left in the group
        os.killpg(proc.pid, signal.SIGKILL)
    epmd = shutil.which("epmd") or "/usr/lib/erlang/bin/epmd"
    with suppress(OSError, subprocess.TimeoutExpired):
        subprocess.run([epmd, "-port", str(epmd_port), "-kill"], env=env,
                       capture_output=True, timeout=10)  # fmt: skip
