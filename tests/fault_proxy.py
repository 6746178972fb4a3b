"""A Toxiproxy server for tests (on 127.0.0.1, an ephemeral port, stopped by PID), driven by
toxiproxy-python: a TCP proxy that delays, drops and cuts a link on request.

The server is Shopify's Go program (`make system-deps` builds it from the Go module proxy
into .venv/bin when `go` is installed). Without it the tests that need it skip, except under
CI=true, where they fail.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from toxiproxy import Toxiproxy
from toxiproxy.api import APIConsumer

from tests.db_servers import _unavailable, free_port, stop_process, wait_until

SERVER = "toxiproxy-server"


def server_binary() -> str | None:
    local = Path(sys.prefix) / "bin" / SERVER
    return str(local) if local.exists() else shutil.which(SERVER)


@contextmanager
def toxiproxy_server() -> Iterator[Toxiproxy]:
    """A running Toxiproxy; toxiproxy-python's client pointed at it."""
    binary = server_binary()
    if binary is None:
        _unavailable(f"Toxiproxy ({SERVER})")
        return
    root = Path(tempfile.mkdtemp(prefix="mqaudit-toxiproxy-"))
    log = root / "server.log"
    port = free_port()
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [binary, "-host", "127.0.0.1", "-port", str(port)], stdout=out, stderr=out
        )
    APIConsumer.host, APIConsumer.port = "127.0.0.1", port
    server = Toxiproxy()
    try:
        wait_until(server.running, proc, log, "toxiproxy")
        yield server
    finally:
        stop_process(proc)
        shutil.rmtree(root, ignore_errors=True)
