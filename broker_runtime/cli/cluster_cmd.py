"""`mqaudit cluster up | status | down | start-node | stop-node`: a cluster of processes."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path

from broker_runtime.cluster import supervisor as sv
from broker_runtime.cluster.layout import ClusterLayout
from broker_runtime.cluster.status import status as cluster_status
from broker_runtime.common.constants import DEFAULT_CLUSTER


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cluster = sub.add_parser("cluster", help="run a name server + broker cluster as processes")
    cmds = cluster.add_subparsers(dest="cluster_cmd", required=True)

    up = cmds.add_parser("up", help="start every node, wait until the cluster answers")
    up.add_argument("--data-dir", type=Path, required=True)
    up.add_argument("--name-servers", type=int, default=2)
    up.add_argument("--groups", default="broker-a,broker-b", help="comma-separated group names")
    up.add_argument("--slaves", action=argparse.BooleanOptionalAction, default=True)
    up.add_argument("--flush", choices=["sync", "async"], default="async")
    up.add_argument("--replication", choices=["sync", "async"], default="async")
    up.add_argument("--segment-size", type=int, default=None, help="CommitLog segment bytes")
    up.add_argument("--acl", type=Path, default=None, help="an ACL accounts file: turns ACL on")
    up.add_argument(
        "--cluster-name",
        default=DEFAULT_CLUSTER,
        help="brokerClusterName of every broker (one lake audits several clusters by name)",
    )
    up.add_argument("--namesrv-scan-ms", type=int, default=None)
    up.add_argument("--namesrv-expiry-ms", type=int, default=None)
    up.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="a broker config key for every broker (store.KEY for the store)",
    )  # fmt: skip
    up.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for each step")
    up.add_argument(
        "--detach", action="store_true", help="return once up (default: stay, down on Ctrl-C)"
    )
    up.set_defaults(func=cmd_up)

    st = cmds.add_parser("status", help="JSON: each node alive/answering, ports, pids, offsets")
    st.add_argument("--data-dir", type=Path, required=True)
    st.set_defaults(func=cmd_status)

    dn = cmds.add_parser("down", help="SIGTERM every node, SIGKILL after the grace period")
    dn.add_argument("--data-dir", type=Path, required=True)
    dn.add_argument("--grace", type=float, default=20.0, help="seconds before SIGKILL")
    dn.set_defaults(func=cmd_down)

    start = cmds.add_parser("start-node", help="start a stopped node again, on its old ports")
    start.add_argument("--data-dir", type=Path, required=True)
    start.add_argument("node", help="a node name from cluster.json, e.g. broker-a-master")
    start.add_argument("--timeout", type=float, default=60.0)
    start.set_defaults(func=cmd_start_node)

    stop = cmds.add_parser("stop-node", help="stop one node (SIGTERM, or SIGKILL with --kill)")
    stop.add_argument("--data-dir", type=Path, required=True)
    stop.add_argument("node")
    stop.add_argument("--kill", action="store_true", help="SIGKILL at once (a crash)")
    stop.add_argument("--grace", type=float, default=20.0)
    stop.set_defaults(func=cmd_stop_node)


def _settings(args: argparse.Namespace) -> sv.ClusterSettings:
    broker_settings = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--set {item!r} is not KEY=VALUE")
        broker_settings[key] = value
    groups = tuple(g.strip() for g in args.groups.split(",") if g.strip())
    return sv.ClusterSettings(
        data_dir=args.data_dir,
        name_servers=args.name_servers,
        groups=groups,
        slaves=args.slaves,
        flush=args.flush,
        replication=args.replication,
        segment_size=args.segment_size,
        broker_settings=broker_settings,
        namesrv_scan_ms=args.namesrv_scan_ms,
        namesrv_expiry_ms=args.namesrv_expiry_ms,
        acl_file=args.acl,
        timeout_s=args.timeout,
        cluster_name=args.cluster_name,
    )


def cmd_up(args: argparse.Namespace) -> int:
    settings = _settings(args)
    stop = threading.Event()
    if not args.detach:  # from here on, Ctrl-C or SIGTERM takes the cluster down
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    try:
        layout = sv.up(settings)
    except sv.ClusterError as e:
        print(f"mqaudit: {e}", file=sys.stderr)
        return 1
    print(json.dumps(layout.to_json()), flush=True)
    sv.say(f"cluster up in {layout.data_dir}; name servers {layout.namesrv_addr}")
    if args.detach:
        return 0
    sv.say("running; Ctrl-C takes it down")
    while not stop.wait(1.0):
        pass
    sv.say("taking the cluster down")
    print(json.dumps(sv.down(ClusterLayout.load(settings.data_dir))), flush=True)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    report = cluster_status(ClusterLayout.load(args.data_dir))
    print(json.dumps(report, indent=2))
    return 0 if report["ok"] else 1


def cmd_down(args: argparse.Namespace) -> int:
    print(json.dumps(sv.down(ClusterLayout.load(args.data_dir), args.grace)))
    return 0


def cmd_start_node(args: argparse.Namespace) -> int:
    layout = ClusterLayout.load(args.data_dir)
    node = layout.node(args.node)
    if sv.process_alive(node):
        print(f"mqaudit: {node.name} is already running (pid {node.pid})", file=sys.stderr)
        return 1
    try:
        sv.start_node(layout, node, None, args.timeout)
    except sv.ClusterError as e:
        print(f"mqaudit: {e}", file=sys.stderr)
        return 1
    print(json.dumps({"node": node.name, "pid": node.pid, "addr": node.addr}))
    return 0


def cmd_stop_node(args: argparse.Namespace) -> int:
    layout = ClusterLayout.load(args.data_dir)
    node = layout.node(args.node)
    if args.kill:
        killed = sv.signal_node(node, signal.SIGKILL)
        node.pid = None
        layout.save()
        print(json.dumps({node.name: "killed" if killed else "not running"}))
        return 0
    print(json.dumps(sv.stop_nodes(layout, [node], args.grace)))
    return 0
