"""The loss repair job: send again, from the producer's kept bodies, what a broker
acknowledged and then lost (the last audit's `lost_after_ack` findings in `audit_losses`).

It follows the DLQ replay's rules (planning: pipeline.remediation.replay_plan.plan_sends;
sending: pipeline.remediation.sends): a dry run (the default) logs the plan and sends
nothing; a message some repair sent is never sent again unless forced; a repair id seen
before resumes that repair, and any run first settles the unknown outcomes of runs killed
midway on the broker; sends are paced. Every event is a row of LAKE/repair_log.

A loss is repairable when its stub is still CONFIRMED in the live producer ledger and a body
whose sha256 is the stub's is kept (`message_body`, pipeline.remediation.resend_bodies);
otherwise it is logged skipped, "not repairable: ...". The repaired message carries the
stub's UNIQ_KEY, topic, TAGS and KEYS plus MQAUDIT_REPAIR_ID; once acknowledged, its stub is
confirmed at the new position. The next ingest reads the copy, and the next audit no longer
reports the loss (lost_after_ack is "no copy with its UNIQ_KEY in any commitlog"); the
repair log keeps what was lost and when it was repaired.
Runnable as `python -m pipeline.jobs.repair ...` with the CLI's options.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from broker_runtime.common.findings import LOST_AFTER_ACK
from broker_runtime.common.message import Message
from broker_runtime.common.progress import reporter
from broker_runtime.ledger.engine import open_ledger
from broker_runtime.ledger.producer import Confirmation, ProducerLedger
from broker_runtime.ledger.schema import StubStatus
from pipeline.delta_io import DeltaIO, table_exists
from pipeline.jobs.resend import live_stubs
from pipeline.lake import REPAIR_LOG, TABLES
from pipeline.readers.layout import cluster_of, ledger_sources
from pipeline.remediation.outcome_log import OutcomeLog
from pipeline.remediation.replay_plan import (
    LogEntry,
    Status,
    in_doubt,
    pending,
    plan_sends,
    where_they_stand,
)
from pipeline.remediation.replay_request import RepairRequest
from pipeline.remediation.resend_bodies import Body, find_bodies
from pipeline.remediation.resend_plan import Candidate, resend_message
from pipeline.remediation.sender import BrokerClient, BrokerTarget, Stored
from pipeline.remediation.sends import Row, reconcile, send_all
from pipeline.spark_session import apply_sql_conf, build_spark

REPAIR_ID_PROPERTY = "MQAUDIT_REPAIR_ID"
LOSSES = TABLES["audit_losses"]


@dataclass(frozen=True)
class Loss:
    """A lost_after_ack finding to repair (a `plan_sends` item; a loss has no group)."""

    msg_id: str
    topic: str | None
    group: str | None = None


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _session(spark: SparkSession | None, master: str | None) -> SparkSession:
    spark = spark or build_spark("mqaudit-repair", master)
    apply_sql_conf(spark)
    return spark


def read_losses(io: DeltaIO, lake: str, request: RepairRequest, cluster: str) -> list[Loss]:
    """The last audit's lost_after_ack losses of `cluster` the request names, oldest first."""
    path = LOSSES.path(lake)
    if not table_exists(path):
        return []
    df = io.read(path, LOSSES.schema)
    df = df.filter((F.col("kind") == LOST_AFTER_ACK) & (F.col("cluster") == cluster))
    if request.msg_ids:
        df = df.filter(F.col("msg_id").isin(list(request.msg_ids)))
    rows = df.select("msg_id", "topic", "last_ts").distinct().collect()
    rows.sort(key=lambda r: (r["last_ts"] or 0, r["msg_id"]))
    return [Loss(r["msg_id"], r["topic"]) for r in rows]


def read_log(io: DeltaIO, lake: str, cluster: str | None = None) -> list[LogEntry]:
    """The repair log's entries (of `cluster` only, if given)."""
    df = io.read(REPAIR_LOG.path(lake), REPAIR_LOG.schema)
    if cluster is not None:
        df = df.filter(F.col("cluster") == cluster)
    return [
        LogEntry(
            r["repair_id"], r["msg_id"], None, r["topic"], Status(r["status"]), r["reason"],
            r["new_offset"], int(r["ts"]),
        )
        for r in df.collect()
    ]  # fmt: skip


def _row_of(cluster: str) -> Row:
    """The log row of a repair event in `cluster`."""

    def row(e: LogEntry, status: Status, reason: str, stored: Stored | None) -> dict[str, Any]:
        broker, queue_id, offset = stored if stored is not None else (None, None, None)
        return {
            "repair_id": e.replay_id, "msg_id": e.msg_id, "topic": e.topic,
            "status": status.value, "reason": reason, "broker": broker, "queue_id": queue_id,
            "new_offset": offset, "ts": _now_ms(), "cluster": cluster,
        }  # fmt: skip

    return row


def _outcome_log(spark: SparkSession, io: DeltaIO, lake: str) -> OutcomeLog:
    io.ensure_table(REPAIR_LOG.path(lake), REPAIR_LOG.schema)
    return OutcomeLog(spark, io, REPAIR_LOG.path(lake), REPAIR_LOG.schema)


class _Ledger:
    """The producer ledger of the cluster: the stubs and kept bodies of the losses."""

    def __init__(self, data_dir: Path, ledger_url: str | None) -> None:
        url = ledger_sources(data_dir, ledger_url).message_stub
        if url is None:
            raise ValueError(f"no producer ledger in {data_dir}: nothing to repair from")
        self.ledger = ProducerLedger(open_ledger(None, "producer", url))

    def __enter__(self) -> _Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.ledger.close()

    def sources(
        self, losses: Sequence[Loss], io: DeltaIO, lake: str
    ) -> tuple[dict[str, Candidate], dict[str, Body], dict[str, str]]:
        """Per loss: its live stub, its verified body, or why it cannot be repaired."""
        stubs = live_stubs(self.ledger.engine, [loss.msg_id for loss in losses])
        candidates = {
            m: Candidate.of(s) for m, s in stubs.items() if s["status"] == StubStatus.CONFIRMED
        }
        bodies = find_bodies(list(candidates.values()), self.ledger, io, lake) if candidates else {}
        why: dict[str, str] = {}
        for loss in losses:
            stub = stubs.get(loss.msg_id)
            if stub is None:
                why[loss.msg_id] = "not repairable: stub no longer in the producer ledger"
            elif loss.msg_id not in candidates:
                why[loss.msg_id] = f"not repairable: stub is {stub['status']} now"
            elif loss.msg_id not in bodies:
                why[loss.msg_id] = (
                    "not repairable: no body kept in the producer ledger (nor a stored copy) "
                    "whose sha256 is the stub's"
                )
        return candidates, bodies, why


def plan_step(
    lake: str,
    data_dir: Path,
    request: RepairRequest,
    repair_id: str,
    *,
    target: BrokerTarget | None = None,
    ledger_url: str | None = None,
    spark: SparkSession | None = None,
    master: str | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Log the plan of `repair_id` (once) and return its summary. Unknown outcomes of earlier
    real runs are settled on the broker first (not in a dry run: those stay skipped)."""
    say = reporter("repair", progress)
    if not Path(lake).is_dir():
        raise ValueError(f"lake {lake} does not exist (ingest and audit the cluster first)")
    with _Ledger(data_dir, ledger_url) as ledger:  # a wrong data dir fails before Spark starts
        cluster = cluster_of(data_dir, request.cluster)
        _row = _row_of(cluster)
        spark = _session(spark, master)
        io = DeltaIO(spark)
        say(f"{repair_id}: {request.describe()} in {cluster}")
        losses = read_losses(io, lake, request, cluster)
        _, _, unrepairable = ledger.sources(losses, io, lake)
    say(f"{len(losses)} lost_after_ack loss(es), {len(unrepairable)} not repairable")
    with _outcome_log(spark, io, lake) as log:
        entries = read_log(io, lake, cluster)
        keys = {loss.msg_id for loss in losses}
        doubt = [e for e in in_doubt(entries, exclude_replay=repair_id) if e.msg_id in keys]
        settled: dict[str, int] = {}
        if doubt and not request.dry_run and target is not None:
            say(f"settling {len(doubt)} unknown outcome(s) of earlier runs on the broker")
            with BrokerClient(target) as client:
                settled = reconcile(doubt, client, log, _row, REPAIR_ID_PROPERTY)
            entries = read_log(io, lake, cluster)
        plan = plan_sends(
            repair_id, losses, entries, _now_ms(), dry_run=request.dry_run, force=request.force,
            max_messages=request.max_messages, unsendable=unrepairable, done="already repaired",
        )  # fmt: skip
        log.extend([_row(e, e.status, e.reason or "", None) for e in plan.rows])
    summary = {**plan.summary(), "losses": len(losses), "settled": settled}
    summary["repair_id"] = summary.pop("replay_id")
    say(
        f"plan: {summary['planned']} to send, {summary['skipped']} skipped "
        f"{summary['skipped_by_reason']}, {summary['left_over']} over max_messages"
    )
    return summary


def send_step(
    lake: str,
    data_dir: Path,
    request: RepairRequest,
    repair_id: str,
    target: BrokerTarget,
    *,
    resume: bool = False,
    ledger_url: str | None = None,
    spark: SparkSession | None = None,
    master: str | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Send the plan's pending repairs and confirm their stubs at the new positions.
    `resume`: an earlier attempt may have sent some without logging it; looked up first."""
    say = reporter("repair", progress)
    if request.dry_run:
        say(f"{repair_id}: dry run, nothing sent")
        return {"repair_id": repair_id, "dry_run": True, "sent": 0, "failed": 0}
    spark = _session(spark, master)
    io = DeltaIO(spark)
    confirmations: list[Confirmation] = []
    cluster = cluster_of(data_dir, request.cluster)
    logged = _row_of(cluster)

    def row(e: LogEntry, status: Status, reason: str, stored: Stored | None) -> dict[str, Any]:
        if status is Status.SENT and stored is not None:
            confirmations.append(Confirmation(e.msg_id, *stored))
        return logged(e, status, reason, stored)

    counts = {"sent": 0, "failed": 0, "refused": 0}
    with (
        _Ledger(data_dir, ledger_url) as ledger,
        _outcome_log(spark, io, lake) as log,
        BrokerClient(target, retry_times=0) as client,
    ):
        try:
            entries = [e for e in read_log(io, lake, cluster) if e.replay_id == repair_id]
            own = in_doubt(entries) if resume else []
            if own:
                say(f"resuming: settling {len(own)} unknown outcome(s) on the broker")
                reconcile(own, client, log, row, REPAIR_ID_PROPERTY)
                entries = [e for e in read_log(io, lake, cluster) if e.replay_id == repair_id]
            todo = pending(repair_id, entries)
            say(f"{repair_id}: {len(todo)} message(s) to send at {request.messages_per_second:g}/s")
            losses = [Loss(e.msg_id, e.topic) for e in todo]
            candidates, bodies, _ = ledger.sources(losses, io, lake)
            messages = {
                m: repair_message(candidates[m], body, repair_id) for m, body in bodies.items()
            }
            counts = send_all(
                todo, messages, client, log, row, rate=request.messages_per_second,
                missing="no longer repairable (stub or kept body gone)", step="repair",
                progress=progress,
            )  # fmt: skip
        finally:
            ledger.ledger.confirm(confirmations)
    return {"repair_id": repair_id, "dry_run": False, **counts}


def repair_message(c: Candidate, body: Body, repair_id: str) -> Message:
    """The stub's message again: UNIQ_KEY, topic, TAGS, KEYS, the verified body, the run id."""
    return resend_message(c, body.data, {**(body.properties or {}), REPAIR_ID_PROPERTY: repair_id})


def repair_summary(
    lake: str, request: RepairRequest, repair_id: str, *, spark: SparkSession | None = None
) -> dict[str, Any]:
    """Where every loss of the repair stands (its latest log row), with a few examples."""
    io = DeltaIO(_session(spark, None))
    mine = (e for e in read_log(io, lake) if e.replay_id == repair_id)
    return {"repair_id": repair_id, "request": request.to_dict(), **where_they_stand(mine)}


def run_repair(
    lake: str,
    data_dir: Path,
    request: RepairRequest,
    repair_id: str,
    target: BrokerTarget | None,
    *,
    ledger_url: str | None = None,
    spark: SparkSession | None = None,
    master: str | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Plan, send (unless a dry run) and sum up one repair; a repair id seen before resumes."""
    if target is None and not request.dry_run:
        raise ValueError("a real repair needs the cluster's name servers")
    plan = plan_step(
        lake, data_dir, request, repair_id, target=target, ledger_url=ledger_url, spark=spark,
        master=master, progress=progress,
    )  # fmt: skip
    spark = _session(spark, master)  # the plan's session (getOrCreate)
    sent: dict[str, Any] = {"dry_run": True}
    if not request.dry_run and target is not None:
        sent = send_step(
            lake, data_dir, request, repair_id, target, resume=not plan["new_plan"],
            ledger_url=ledger_url, spark=spark, progress=progress,
        )  # fmt: skip
    return {"plan": plan, "send": sent, **repair_summary(lake, request, repair_id, spark=spark)}


if __name__ == "__main__":  # `python -m pipeline.jobs.repair ...`, the command's options
    from pipeline.cli import main

    sys.exit(main(["repair", *sys.argv[1:]]))
