"""What the client commands (produce, consume, admin) share: where the cluster is, ACL keys,
progress lines on stderr, and tables."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from broker_runtime.client.config import ClientConfig
from broker_runtime.cluster.layout import CLUSTER_FILE, ClusterLayout


def add_target(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--data-dir", type=Path, help="a cluster's data dir (its cluster.json)")
    where.add_argument("--namesrv", help="name servers, host:port;host:port")
    parser.add_argument("--access-key", default=None, help="ACL access key (with --secret-key)")
    parser.add_argument("--secret-key", default=None)


def namesrv_of_data_dir(data_dir: Path) -> str:
    """`host:port;...` of the name servers DIR/cluster.json lists."""
    if not (data_dir / CLUSTER_FILE).exists():
        raise ValueError(f"{data_dir / CLUSTER_FILE} not found: is a cluster running there?")
    addr = ClusterLayout.load(data_dir).namesrv_addr
    if not addr:
        raise ValueError(f"{data_dir / CLUSTER_FILE} lists no name server")
    return addr


def client_config(args: argparse.Namespace) -> ClientConfig:
    namesrv = args.namesrv if args.namesrv else namesrv_of_data_dir(args.data_dir)
    return ClientConfig(namesrv, access_key=args.access_key, secret_key=args.secret_key)


class Progress:
    """A status line on stderr at most every `every_s`: rewritten in place on a terminal,
    one line each time otherwise (logs)."""

    def __init__(self, out: TextIO | None = None, every_s: float | None = None) -> None:
        self.out = out or sys.stderr
        self.tty = self.out.isatty()
        self.every_s = every_s if every_s is not None else (0.5 if self.tty else 5.0)
        self.start = time.monotonic()
        self._last = 0.0

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def update(self, text: str, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < self.every_s:
            return
        self._last = now
        line = f"[{self.elapsed():6.1f}s] {text}"
        self.out.write(f"\r{line}\x1b[K" if self.tty else line + "\n")
        self.out.flush()

    def done(self, text: str) -> None:
        self.update(text, force=True)
        if self.tty:
            self.out.write("\n")
            self.out.flush()


def format_ms(ms: int | None) -> str:
    """Epoch ms as `YYYY-MM-DD HH:MM:SS,mmm` UTC (mqadmin's style); `-` for none."""
    if ms is None or ms <= 0:
        return "-"
    t = dt.datetime.fromtimestamp(ms / 1000, dt.UTC)
    return t.strftime("%Y-%m-%d %H:%M:%S,") + f"{ms % 1000:03d}"


def parse_time_ms(text: str) -> int:
    """Epoch ms, `now`, or an ISO 8601 time (UTC unless it says otherwise)."""
    if text == "now":
        return time.time_ns() // 1_000_000
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        t = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"time {text!r} is not epoch ms, 'now' or ISO 8601") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    return int(t.timestamp() * 1000)


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    cells = [[str(c) for c in r] for r in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    for r in [list(headers), *cells]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
