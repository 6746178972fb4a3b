"""A node process's lifecycle: log to a file, serve until SIGTERM/SIGINT, stop cleanly.

A node that cannot bind its port exits with EXIT_PORT_IN_USE, so that a supervisor which
picked that port (and lost the race for it) knows to pick another and try again.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

from broker_runtime.common import aio

EXIT_PORT_IN_USE = 3
EXIT_FAILED = 1

log = logging.getLogger(__name__)


def setup_logging(log_file: Path | None, node: str) -> None:
    handler: logging.Handler = (
        logging.FileHandler(log_file) if log_file else logging.StreamHandler(sys.stderr)
    )
    if log_file:
        log_file.parent.mkdir(parents=True, exist_ok=True)
    handler.setFormatter(
        logging.Formatter(f"%(asctime)s %(levelname)s {node} %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)


def run_node(start: Callable[[], Awaitable[None]], stop: Callable[[], Awaitable[None]]) -> int:
    """Run `start`, wait for SIGTERM or SIGINT, run `stop`; returns the exit code."""

    async def main() -> int:
        loop = asyncio.get_running_loop()
        done = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, done.set)
        try:
            await start()
        except BaseException as e:
            await stop()  # whatever did start (the store) stops cleanly
            if isinstance(e, OSError) and e.errno == errno.EADDRINUSE:
                log.error("port in use: %s", e)
                return EXIT_PORT_IN_USE
            raise
        log.info("started")
        await done.wait()
        log.info("stopping on signal")
        await stop()
        log.info("stopped cleanly")
        return 0

    try:
        return aio.run(main())
    except Exception:
        log.exception("node failed")
        return EXIT_FAILED
