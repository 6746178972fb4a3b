"""The resend job: send again what the producer never had acknowledged.

Reads the audit's `resend_candidates` and `manual_handling`, checks each stub again in the
live producer ledger and the consumers' log (pipeline.remediation.resend_plan), and per stub
to send: bumps its send count and backs its next resend time off (before the send, so a crash
cannot hide an attempt), sends it through the producer client with its UNIQ_KEY and, once
acknowledged, confirms the stub at its new offset. Stubs at the max send count, and messages
whose body is nowhere, are voided and listed for a person (a CSV and JSON report). Every
action is a row of the Delta table `resend_log`. Runnable as `python -m pipeline.jobs.resend`.
A run acts on the cluster of its data dir (its ledger): the candidates of other clusters in
the lake are theirs.

RabbitMQ stubs (`system` rabbitmq) go the same way to a `RabbitTarget`: published again to
the stub's exchange and routing key with its headers, its `message_id` and a run-id header
(`MQAUDIT_RESEND_RUN`), mandatory, confirms on; confirmed, the stub is CONFIRMED (no offset:
a queue has none). A returned or nacked publish is a failure, backed off like any other.
"""

from __future__ import annotations

import csv
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from sqlalchemy import Engine, select

from broker_runtime.client.model import MQClientError
from broker_runtime.common.constants import DEFAULT_MAX_SEND_COUNT
from broker_runtime.common.progress import reporter
from broker_runtime.ledger.engine import chunks, open_ledger, run_tx
from broker_runtime.ledger.producer import (
    Confirmation,
    ProducerLedger,
    ResendBackoff,
    StubError,
)
from broker_runtime.ledger.schema import message_log, message_stub
from broker_runtime.remoting.connection import RemotingError
from pipeline.delta_io import DeltaIO, table_exists
from pipeline.lake import RESEND_LOG, table_path
from pipeline.readers.layout import cluster_of, ledger_sources
from pipeline.remediation.outcome_log import OutcomeLog
from pipeline.remediation.rabbit_sender import RabbitClient, RabbitTarget
from pipeline.remediation.reasons import failure_reason
from pipeline.remediation.resend_bodies import Body, find_bodies
from pipeline.remediation.resend_plan import (
    Action,
    Candidate,
    Decision,
    plan_resend,
    resend_message,
    resend_rabbit_message,
)
from pipeline.remediation.sender import BrokerClient, BrokerTarget, Stored
from pipeline.schemas import struct_of
from pipeline.spark_session import apply_sql_conf, build_spark

CANDIDATES = "resend_candidates"
CANDIDATE_COLUMNS = struct_of(
    "msg_id:str, topic:str, tags:str, keys:str, body_hash:str, send_count:int, system:str,"
    " cluster:str"
)
MANUAL = "manual_handling"


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _read(io: DeltaIO, lake: str, name: str, cluster: str) -> list[Candidate]:
    """The stub columns of an audit table's rows of `cluster` (it has more; the audit owns
    its schema)."""
    path = table_path(lake, name)
    if not table_exists(path):
        return []
    df = io.read(path, CANDIDATE_COLUMNS).filter(F.col("cluster") == cluster).drop("cluster")
    return [Candidate.of(r.asDict()) for r in df.collect()]


def live_stubs(engine: Engine, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    def work(conn: Any) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for chunk in chunks(sorted(set(ids))):
            for row in conn.execute(select(message_stub).where(message_stub.c.msg_id.in_(chunk))):
                out[row.msg_id] = dict(row._mapping)
        return out

    return run_tx(engine, work) if ids else {}


def _consumed(url: str | None, ids: Sequence[str]) -> set[str]:
    if url is None or not ids:
        return set()
    engine = open_ledger(None, "consumer", url)
    try:

        def work(conn: Any) -> set[str]:
            out: set[str] = set()
            for chunk in chunks(sorted(set(ids))):
                query = select(message_log.c.msg_id).where(message_log.c.msg_id.in_(chunk))
                out.update(conn.execute(query.distinct()).scalars())
            return out

        return run_tx(engine, work)
    finally:
        engine.dispose()


class _Run:
    """One resend run: the ledger, the log and the counts it keeps."""

    def __init__(
        self,
        ledger: ProducerLedger,
        log: OutcomeLog,
        run_id: str,
        max_send_count: int,
        cluster: str,
    ) -> None:
        self.cluster = cluster
        self.ledger = ledger
        self.log = log
        self.run_id = run_id
        self.max_send_count = max_send_count
        self.counts = {a.value: 0 for a in Action}
        self.manual: list[dict[str, Any]] = []

    def record(
        self, c: Candidate, action: Action, reason: str, where: Stored | None = None
    ) -> None:
        stub = self.ledger.get(c.msg_id) or {}
        broker, queue_id, offset = where if where is not None else (None, None, None)
        self.log.add(
            {
                "run_id": self.run_id,
                "msg_id": c.msg_id,
                "topic": c.topic,
                "action": action.value,
                "reason": reason,
                "send_count": stub.get("send_count"),
                "next_resend_at": stub.get("next_resend_at"),
                "broker": broker,
                "queue_id": queue_id,
                "new_offset": offset,
                "ts": _now_ms(),
                "system": c.system or "rocketmq",
                "cluster": self.cluster,
            }
        )
        self.counts[action.value] += 1
        if action is Action.MANUAL:
            self.manual.append(
                {**_public(c), "send_count": stub.get("send_count"), "reason": reason}
            )

    def hand_over(self, decisions: Sequence[Decision]) -> None:
        """Void the stubs (never resent again) and list them for a person."""
        ids = [d.candidate.msg_id for d in decisions]
        if ids:
            self.ledger.void(ids)
        for d in decisions:
            self.record(d.candidate, Action.MANUAL, d.reason)

    def resend(
        self,
        c: Candidate,
        body: Body,
        client: BrokerClient | RabbitClient,
        stub: dict[str, Any] | None = None,
    ) -> None:
        """Send `c` once more (`stub`: its live row, for a RabbitMQ stub's key and headers)."""
        try:
            count = self.ledger.mark_resent([c.msg_id])[c.msg_id]
        except StubError as e:  # voided or removed since the check a moment ago
            self.record(c, Action.SKIPPED, str(e))
            return
        try:
            if isinstance(client, RabbitClient):
                msg: Any = resend_rabbit_message(c, stub or {}, body.data, self.run_id)
            else:
                msg = resend_message(c, body.data, body.properties)
            _, where = client.deliver(msg)
        except (MQClientError, RemotingError) as e:
            reason = f"{failure_reason(e)} (body from {body.source})"
            if count >= self.max_send_count:
                self.hand_over(
                    [Decision(c, Action.MANUAL, f"send {count} failed, at max: {reason}")]
                )
            else:
                self.record(c, Action.FAILED, reason)
            return
        self.ledger.confirm([Confirmation(c.msg_id, *where)])
        self.record(c, Action.SENT, f"send {count} acknowledged (body from {body.source})", where)


def _public(c: Candidate) -> dict[str, Any]:
    return {
        "msg_id": c.msg_id,
        "topic": c.topic,
        "tags": c.tags,
        "keys": c.keys,
        "body_hash": c.body_hash,
    }


def write_manual_report(rows: list[dict[str, Any]], out_dir: Path) -> dict[str, str]:
    """manual_handling.csv and .json under `out_dir` (written even when empty)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    fields = ["msg_id", "topic", "tags", "keys", "body_hash", "send_count", "reason"]
    with open(out_dir / "manual_handling.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    (out_dir / "manual_handling.json").write_text(json.dumps(rows, indent=2))
    return {
        "csv": str(out_dir / "manual_handling.csv"),
        "json": str(out_dir / "manual_handling.json"),
    }


def run_resend(
    lake: str,
    data_dir: Path,
    target: BrokerTarget | None,
    *,
    as_of_ms: int,
    run_id: str,
    ledger_url: str | None = None,
    max_send_count: int = DEFAULT_MAX_SEND_COUNT,
    backoff: ResendBackoff | None = None,
    report_dir: Path | None = None,
    rabbit: RabbitTarget | None = None,
    spark: SparkSession | None = None,
    master: str | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Resend the due candidates of the last audit as of `as_of_ms`; returns a summary.
    `target` sends RocketMQ stubs, `rabbit` RabbitMQ ones."""
    if max_send_count < 1:
        raise ValueError(f"max_send_count must be >= 1, got {max_send_count}")
    spark = spark or build_spark("mqaudit-resend", master)
    apply_sql_conf(spark)
    io = DeltaIO(spark)
    cluster = cluster_of(data_dir)  # its ledger's stubs are what this run may send
    candidates, manual = _read(io, lake, CANDIDATES, cluster), _read(io, lake, MANUAL, cluster)
    sources = ledger_sources(data_dir, ledger_url)
    summary: dict[str, Any] = {
        "run_id": run_id,
        "as_of_ms": as_of_ms,
        "cluster": cluster,
        "candidates": len(candidates),
        "manual_candidates": len(manual),
    }
    if sources.message_stub is None:
        reporter("resend", progress)(f"no producer ledger in {data_dir}: nothing to resend")
        return {**summary, "counts": {}, "note": "no producer ledger"}
    ledger = ProducerLedger(open_ledger(None, "producer", sources.message_stub), backoff=backoff)
    try:
        ids = [c.msg_id for c in [*candidates, *manual]]
        stubs = live_stubs(ledger.engine, ids)
        plan = plan_resend(
            candidates, manual, stubs,
            _consumed(sources.message_log, ids), max_send_count, as_of_ms,
        )  # fmt: skip
        bodies = find_bodies(plan.to_send, ledger, io, lake) if plan.to_send else {}
        reporter("resend", progress)(
            f"{len(candidates)} candidate(s), {len(manual)} at max: {len(plan.to_send)} to send "
            f"({len(bodies)} with a body), {len(plan.decided)} decided without sending"
        )
        path = RESEND_LOG.path(lake)
        io.ensure_table(path, RESEND_LOG.schema)
        with OutcomeLog(spark, io, path, RESEND_LOG.schema) as log:
            run = _Run(ledger, log, run_id, max_send_count, cluster)
            for d in plan.decided:
                if d.action is Action.SKIPPED:
                    run.record(d.candidate, Action.SKIPPED, d.reason)
            nobody = [
                Decision(
                    c, Action.MANUAL, "no copy of the body anywhere (producer ledger or brokers)"
                )
                for c in plan.to_send
                if c.msg_id not in bodies
            ]
            run.hand_over([*plan.manual, *nobody])
            sendable = [c for c in plan.to_send if c.msg_id in bodies]
            rabbit_due = [c for c in sendable if c.rabbitmq]
            rocket_due = [c for c in sendable if not c.rabbitmq]
            if rocket_due and target is None:
                raise ValueError("resend candidates are due but no name server is known")
            if rabbit_due and rabbit is None:
                raise ValueError("RabbitMQ resend candidates are due but no RabbitMQ URL is known")
            if rocket_due and target is not None:
                with BrokerClient(target, group="mqaudit-resend") as client:
                    for c in rocket_due:
                        run.resend(c, bodies[c.msg_id], client, stubs[c.msg_id])
            if rabbit_due and rabbit is not None:
                with RabbitClient(rabbit.url) as rabbit_client:
                    for c in rabbit_due:
                        run.resend(c, bodies[c.msg_id], rabbit_client, stubs[c.msg_id])
    finally:
        ledger.close()
    summary["counts"] = run.counts
    summary["manual"] = run.manual
    if report_dir is not None:
        summary["manual_report"] = write_manual_report(run.manual, report_dir)
    reporter("resend", progress)(f"done: {run.counts}")
    return summary


if __name__ == "__main__":  # `python -m pipeline.jobs.resend ...`, the command's options
    from pipeline.cli import main

    sys.exit(main(["resend", *sys.argv[1:]]))
