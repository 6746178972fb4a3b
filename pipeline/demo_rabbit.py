"""RabbitMQ in `mqaudit demo`: a node of its own, its fault scenarios, its findings scored.

Where RabbitMQ is installed (`rabbitmq_available()`), the demo starts a node under
OUT/rabbitmq (stopped by PID at the end, also on failure), and in its virtual host `demo`
runs `mqaudit rabbit-workload` with the ledgers in the demo's cluster dir (the same SQLite
ledgers, rows of `system` rabbitmq) and the truth in OUT/rabbit-truth.json. Both run in a
thread beside the RocketMQ workload. The mq_audit DAG then ingests the virtual host's
topology (Variables mqaudit_rabbit_api, mqaudit_rabbit_vhosts) and the RabbitMQ ledger rows
into the same lake and audits them; `rabbit_summary` holds the lake's RabbitMQ findings
against the truth, message by message (broker_runtime.workload.truth_compare).

Without RabbitMQ (or with `--no-rabbitmq`) the demo says so in one line and goes on; under
CI=true a missing RabbitMQ is an error (`make system-deps` installs it).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from broker_runtime.common.findings import RABBITMQ
from broker_runtime.rabbit.node import RABBIT_BIN, RabbitNode, rabbitmq_available, rabbitmq_node
from broker_runtime.workload.truth_compare import scores
from pipeline.lake import system_rows

VHOST = "demo"
# The audit tables RabbitMQ's findings go to.
FINDING_TABLES = ("audit_duplicates", "audit_losses", "audit_dead_letters", "resend_candidates")
SCENARIO = "rabbitmq"  # the truth_compare key's scenario: one workload run


class RabbitFailed(RuntimeError):
    """RabbitMQ is missing under CI=true, or its node did not start, or its workload failed."""


def unavailable_reason(skip: bool) -> str | None:
    """Why the demo runs no RabbitMQ (None: it does); RabbitFailed under CI=true."""
    if skip:
        return "skipped (--no-rabbitmq)"
    if rabbitmq_available():
        return None
    why = f"not installed ({RABBIT_BIN}/rabbitmq-server; make system-deps installs it)"
    if os.environ.get("CI") == "true":
        raise RabbitFailed(f"RabbitMQ is {why}, and CI=true needs it")
    return why


class RabbitSide:
    """The node and the workload, in a thread: `start`, then `wait` (its workload summary,
    or the error it met), `stop` at the end whatever happened."""

    def __init__(self, root: Path, run_workload: Callable[[str], dict[str, Any]]) -> None:
        self.root = root
        self.run_workload = run_workload  # amqp URL -> the command's summary
        self.node: RabbitNode | None = None
        self.summary: dict[str, Any] = {}
        self.seconds = 0.0
        self.error: BaseException | None = None
        self._stack = ExitStack()
        self._thread = threading.Thread(target=self._work, name="rabbitmq", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _work(self) -> None:
        t0 = time.monotonic()
        try:
            self.node = self._stack.enter_context(rabbitmq_node(self.root))
            self.node.add_vhost(VHOST)
            self.summary = self.run_workload(self.node.amqp_url(VHOST))
        except BaseException as e:  # handed to the main thread by wait()
            self.error = e
        self.seconds = round(time.monotonic() - t0, 1)

    def wait(self) -> dict[str, Any]:
        self._thread.join()
        if self.error is not None:
            raise RabbitFailed(f"RabbitMQ: {self.error}") from self.error
        return self.summary

    def stop(self) -> None:
        """Stop the node by PID (after the thread: a node still starting is stopped too)."""
        if self._thread.ident is not None:
            self._thread.join()
        self._stack.close()


def airflow_vars(side: RabbitSide | None) -> dict[str, str]:
    """The Variables that send mq_audit (and the remedies) to the demo's node; empty ones
    without a node (an outer setting must not win)."""
    node = side.node if side is not None else None
    return {
        "AIRFLOW_VAR_MQAUDIT_RABBIT_API": node.api_url if node else "",
        "AIRFLOW_VAR_MQAUDIT_RABBIT_VHOSTS": VHOST if node else "",
        "AIRFLOW_VAR_MQAUDIT_RABBIT_URL": node.amqp_url(VHOST) if node else "",
    }


def lake_rows(lake: Path) -> list[dict[str, Any]]:
    """The lake's RabbitMQ findings (FINDING_TABLES), read with pyarrow."""
    return system_rows(lake, FINDING_TABLES, RABBITMQ, ["kind", "cause", "group", "msg_id"])


def _key(f: dict[str, Any]) -> tuple[str, str, str, str | None, str | None]:
    return (SCENARIO, f["kind"], f["msg_id"], f["group"], f["cause"])


def truth_check(truth: list[dict[str, Any]], found: list[dict[str, Any]]) -> dict[str, Any]:
    """Per kind, the truth's findings against the audit's (kind, cause, queue and message):
    counts, overlap, precision, recall, and whether they are the same."""
    check = scores(map(_key, truth), map(_key, found), lambda k: k[1])
    for row in check.values():
        row["match"] = row["truth"] == row["found"] == row["both"]
    return check


def rabbit_summary(
    why_not: str | None, side: RabbitSide | None, truth: dict[str, Any], lake: Path
) -> dict[str, Any]:
    """The summary's `rabbitmq` block: what ran, and its truth check against the lake."""
    if why_not is not None or side is None or side.node is None:
        return {"ran": False, "why": why_not or "the node did not start"}
    return {
        "ran": True,
        "node": side.node.node,
        "vhost": VHOST,
        "api": side.node.api_url,
        "workload": side.summary,
        "truth_check": truth_check(truth.get("findings", []), lake_rows(lake))
        if truth
        else "no rabbit-truth.json (the workload did not finish)",
    }


def rabbit_lines(r: dict[str, Any]) -> list[str]:
    """The block as a person reads it."""
    if not r.get("ran"):
        return [f"rabbitmq:       not run: {r.get('why')}"]
    lines = [
        f"rabbitmq:       vhost {r['vhost']} on node {r['node']}, audited by mq_audit into the "
        "same lake; found / injected per kind (message, queue and cause):"
    ]
    check = r["truth_check"]
    if not isinstance(check, dict):
        return [*lines, f"  {check}"]
    for kind, s in check.items():
        lines.append(
            f"  {kind:22}{s['found']:>4}/{s['truth']:<4} precision {s['precision']:.3f} "
            f"recall {s['recall']:.3f}" + ("" if s["match"] else "  MISMATCH")
        )
    return lines
