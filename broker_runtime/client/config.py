"""Client settings shared by producers and consumers (RocketMQ's ClientConfig)."""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass

from broker_runtime.remoting.client import split_addr

DEFAULT_INSTANCE = "DEFAULT"


def local_ip() -> str:
    """This host's outward IPv4 address (no packet is sent), else 127.0.0.1."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))
            ip: str = s.getsockname()[0]
            return ip
    except OSError:
        return "127.0.0.1"


def parse_namesrv(text: str) -> list[str]:
    """`host:port;host:port` -> addresses; ValueError naming the bad part."""
    addrs = [a.strip() for a in text.replace(",", ";").split(";") if a.strip()]
    if not addrs:
        raise ValueError("no name server address given (expected host:port;host:port)")
    for a in addrs:
        split_addr(a)
    return addrs


@dataclass
class ClientConfig:
    namesrv: str
    client_ip: str = ""  # "" = local_ip()
    instance_name: str = DEFAULT_INSTANCE
    request_timeout_s: float = 3.0
    poll_name_server_interval_s: float = 30.0
    heartbeat_interval_s: float = 30.0
    persist_offset_interval_s: float = 5.0
    access_key: str | None = None
    secret_key: str | None = None

    def __post_init__(self) -> None:
        self.name_servers = parse_namesrv(self.namesrv)
        if not self.client_ip:
            self.client_ip = local_ip()
        if (self.access_key is None) != (self.secret_key is None):
            raise ValueError("give both access_key and secret_key, or neither")

    def client_id(self, unique: bool = True) -> str:
        """`ip@instance`; with the default instance name and `unique`, `ip@pid#nanos`.

        As MQClientInstance: producers and clustering consumers get a per-object instance
        name so that two of them in one process are two group members; a broadcasting
        consumer keeps `DEFAULT` so that its local offset file survives a restart.
        """
        name = self.instance_name
        if name == DEFAULT_INSTANCE and unique:
            name = f"{os.getpid()}#{time.monotonic_ns()}"
        return f"{self.client_ip}@{name}"
