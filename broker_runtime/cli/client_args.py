"""What the client commands (produce, consume, admin) share: where the cluster is, ACL keys,
and tables."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from broker_runtime.client.config import ClientConfig
from broker_runtime.cluster.layout import namesrv_of_data_dir


def add_target(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--data-dir", type=Path, help="a cluster's data dir (its cluster.json)")
    where.add_argument("--namesrv", help="name servers, host:port;host:port")
    parser.add_argument("--access-key", default=None, help="ACL access key (with --secret-key)")
    parser.add_argument("--secret-key", default=None)


def client_config(args: argparse.Namespace) -> ClientConfig:
    namesrv = args.namesrv if args.namesrv else namesrv_of_data_dir(args.data_dir)
    return ClientConfig(namesrv, access_key=args.access_key, secret_key=args.secret_key)


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    cells = [[str(c) for c in r] for r in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    for r in [list(headers), *cells]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
