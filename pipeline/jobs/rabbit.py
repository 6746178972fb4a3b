"""RabbitMQ in the lake: topology snapshots in, and the queues each publish had to reach.

`ingest_topology` reads each virtual host's topology from the management API and appends
it to `rabbit_topology` with its time (a snapshot already there is not written again).
`required_routes` gives, for every confirmed and not returned RabbitMQ stub, the queues the
routing of its time required: the topology of the newest snapshot of its virtual host taken
at or before the publish (the next one when that one lacks the exchange), through
`broker_runtime.rabbit.routing.route`. It runs on the driver over the collected stubs (the
matcher is Python; stubs are one row per publish, small next to the message tables).
"""

from __future__ import annotations

import bisect
import json
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from broker_runtime.common.progress import reporter
from broker_runtime.rabbit.routing import route
from broker_runtime.rabbit.topology import Snapshot, fetch_snapshot
from pipeline.delta_io import DeltaIO
from pipeline.lake import TABLES, table_path
from pipeline.readers.rabbit_topology import snapshot_rows, snapshots_from_rows
from pipeline.schemas import struct_of
from pipeline.transforms.rabbit import of_rabbitmq

TOPOLOGY = TABLES["rabbit_topology"]
ROUTES = struct_of(
    "msg_id:str, queue:str, snapshot_ts:long, message_ttl:long, max_length:long, overflow:str,"
    " dead_letter_exchange:str"
)


def api_credentials(api: str) -> tuple[str, str, str]:
    """(URL without credentials, user, password) of a management API URL."""
    parts = urllib.parse.urlsplit(api)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"a RabbitMQ management API must be an http(s) URL, got {api!r}")
    host = parts.hostname + (f":{parts.port}" if parts.port else "")
    bare = urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))
    user = urllib.parse.unquote(parts.username or "guest")
    return bare, user, urllib.parse.unquote(parts.password or "guest")


def ingest_topology(
    spark: SparkSession,
    lake: str | Path,
    api_url: str,
    vhosts: Sequence[str],
    *,
    user: str = "guest",
    password: str = "guest",
    progress: bool = True,
) -> int:
    """Snapshot each of `vhosts` now; returns the rows appended."""
    say = reporter("ingest", progress)
    snaps = [fetch_snapshot(api_url, v, user, password) for v in vhosts]
    n = append_snapshots(spark, lake, snaps)
    for s in snaps:
        say(
            f"rabbit_topology: vhost {s.vhost!r} at {s.taken_at_ms}: "
            f"{len(s.topology.exchanges)} exchanges, {len(s.queues)} queues, "
            f"{len(s.topology.bindings)} bindings"
        )
    return n


def append_snapshots(spark: SparkSession, lake: str | Path, snaps: Sequence[Snapshot]) -> int:
    io = DeltaIO(spark)
    path = table_path(lake, TOPOLOGY.name)
    io.ensure_table(path, TOPOLOGY.schema)
    have = {
        (r["vhost"], r["snapshot_ts"])
        for r in io.read_small(path, TOPOLOGY.schema).select(["vhost", "snapshot_ts"]).to_pylist()
    }
    rows = [r for s in snaps if (s.vhost, s.taken_at_ms) not in have for r in snapshot_rows(s)]
    return io.append_rows(rows, path, TOPOLOGY.schema) if rows else 0


def required_routes(spark: SparkSession, stubs: DataFrame, topology: DataFrame) -> DataFrame:
    """msg_id, queue and that queue's settings, for each queue a stub's routing required."""
    snaps = snapshots_from_rows(r.asDict() for r in topology.collect())
    if not snaps:
        return spark.createDataFrame([], ROUTES)
    times: dict[str, list[int]] = {}
    for vhost, ts in sorted(snaps):
        times.setdefault(vhost, []).append(ts)
    wanted = (
        of_rabbitmq(stubs)
        .filter((F.col("status") == "CONFIRMED") & F.col("return_reason").isNull())
        .select("msg_id", "topic", "routing_key", "headers", "broker", "created_at")
    )
    out: list[dict[str, Any]] = []
    for s in wanted.toLocalIterator():
        ts_list = times.get(s["broker"])
        if not ts_list:
            continue  # no topology of its virtual host: nothing to hold it to
        i = bisect.bisect_right(ts_list, s["created_at"])
        # The newest snapshot at or before the publish, else the next one: the broker
        # confirmed the publish, so the exchange existed; a snapshot without it is too old.
        order = [*ts_list[max(i - 1, 0) : i], *ts_list[i : i + 1]]
        found = [snaps[(s["broker"], t)] for t in order]
        found = [f for f in found if s["topic"] in f.topology.exchanges or s["topic"] == ""]
        if not found:
            continue  # no snapshot of its time knows the exchange: nothing to hold it to
        snap = found[0]
        headers = json.loads(s["headers"]) if s["headers"] else {}
        queues = route(snap.topology, s["topic"], s["routing_key"] or "", headers)
        for q in queues:
            qs = snap.queues[q]
            out.append(
                {"msg_id": s["msg_id"], "queue": q, "snapshot_ts": snap.taken_at_ms,
                 "message_ttl": qs.message_ttl, "max_length": qs.max_length,
                 "overflow": qs.overflow, "dead_letter_exchange": qs.dead_letter_exchange}
            )  # fmt: skip
    return spark.createDataFrame(out, ROUTES)
