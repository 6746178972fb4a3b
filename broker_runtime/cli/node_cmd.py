"""`mqaudit namesrv` and `mqaudit broker`: run one node in the foreground until SIGTERM."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from broker_runtime.broker.config_file import broker_config, namesrv_config, read_json
from broker_runtime.cluster.node import run_node, setup_logging


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ns = sub.add_parser("namesrv", help="run a name server")
    ns.add_argument("--port", type=int, default=9876, help="0: any free port")
    ns.add_argument("--host", default="127.0.0.1")
    ns.add_argument("--data-dir", type=Path, required=True)
    ns.add_argument("--scan-interval-ms", type=int, default=None)
    ns.add_argument("--broker-expiry-ms", type=int, default=None)
    ns.add_argument("--log-file", type=Path, default=None, help="default: stderr")
    ns.set_defaults(func=cmd_namesrv)

    br = sub.add_parser(
        "broker", help="run a broker (a JSON --config file, flags override its keys)"
    )
    br.add_argument("--config", type=Path, default=None)
    br.add_argument("--store-dir", type=Path, default=None)
    br.add_argument("--cluster-name", default=None)
    br.add_argument("--broker-name", default=None)
    br.add_argument("--broker-id", type=int, default=None)
    br.add_argument("--role", choices=["ASYNC_MASTER", "SYNC_MASTER", "SLAVE"], default=None)
    br.add_argument("--flush", choices=["sync", "async"], default=None)
    br.add_argument("--host", default=None)
    br.add_argument("--port", type=int, default=None)
    br.add_argument("--ha-port", type=int, default=None)
    br.add_argument("--namesrv", default=None, help="host:port;host:port")
    br.add_argument("--log-file", type=Path, default=None, help="default: stderr")
    br.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="any other config key"
    )
    br.set_defaults(func=cmd_broker)


def cmd_namesrv(args: argparse.Namespace) -> int:
    from broker_runtime.namesrv.server import NameServer

    data: dict[str, Any] = {"data_dir": args.data_dir, "host": args.host, "port": args.port}
    if args.scan_interval_ms is not None:
        data["scan_interval_ms"] = args.scan_interval_ms
    if args.broker_expiry_ms is not None:
        data["broker_expiry_ms"] = args.broker_expiry_ms
    config = namesrv_config(data)
    config.data_dir.mkdir(parents=True, exist_ok=True)
    setup_logging(args.log_file, f"namesrv:{args.port}")
    server = NameServer(config)

    async def start() -> None:
        await server.start()

    return run_node(start, server.stop)


def broker_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The config file's dict with the flags applied over it."""
    data: dict[str, Any] = read_json(args.config) if args.config else {}
    store = dict(data.get("store", {}) or {})
    for flag, key in (
        ("cluster_name", "cluster_name"),
        ("broker_name", "broker_name"),
        ("broker_id", "broker_id"),
        ("role", "role"),
        ("host", "host"),
        ("port", "port"),
        ("ha_port", "ha_port"),
        ("namesrv", "namesrv_addrs"),
    ):
        value = getattr(args, flag)
        if value is not None:
            data[key] = value
    if args.store_dir is not None:
        store["store_dir"] = args.store_dir
    if args.flush is not None:
        store["flush"] = args.flush
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--set {item!r} is not KEY=VALUE")
        if key.startswith("store."):
            store[key[len("store.") :]] = value
        else:
            data[key] = value
    data["store"] = store
    return data


def cmd_broker(args: argparse.Namespace) -> int:
    from broker_runtime.broker.controller import BrokerController

    config = broker_config(broker_settings(args))
    setup_logging(args.log_file, f"{config.broker_name}/{config.broker_id}")
    ctl = BrokerController(config)
    return run_node(ctl.start, ctl.stop)
