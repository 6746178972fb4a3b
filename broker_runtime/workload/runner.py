"""Run the planned scenarios one after another and write truth.json.

Scenarios that need the cluster configured otherwise (replication and flush modes, the
queue access lock) start their own cluster under DIR/scenarios/<name>/ and take it down
at the end (its files stay); the others run on the cluster in DIR. A scenario that fails
stops the run: truth.json then holds the scenarios that completed and the failure.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from broker_runtime.workload import plan as P
from broker_runtime.workload.harness import Harness, WorkloadError
from broker_runtime.workload.scenarios.common import Ctx
from broker_runtime.workload.scenarios.failures import consumer_failures, producer_resend
from broker_runtime.workload.scenarios.redelivery import ack_lost, consumer_crash_unacked
from broker_runtime.workload.truth import summary, validate

Runner = Callable[[Ctx], Awaitable[dict[str, Any]]]

ON_MAIN_CLUSTER: dict[str, Runner] = {
    P.CONSUMER_CRASH: consumer_crash_unacked,
    P.ACK_LOST: ack_lost,
    P.PRODUCER_RESEND: producer_resend,
    P.CONSUMER_FAILURES: consumer_failures,
}


def say(msg: str) -> None:
    print(f"[workload] {msg}", file=sys.stderr, flush=True)


def write_truth(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, path)


async def run(
    data_dir: Path,
    messages: int,
    scenario: str,
    truth_path: Path,
    seed: int,
    ledger_url: str | None = None,
) -> tuple[dict[str, Any], bool]:
    """Returns the summary and whether every scenario completed."""
    plans = P.plan_run(seed, messages, scenario)
    run_id = f"s{seed}-{time.strftime('%m%d%H%M%S')}"
    h = Harness(data_dir, run_id, ledger_url, say)
    layout = h.main_layout()
    doc: dict[str, Any] = {
        "seed": seed,
        "messages": messages,
        "run_id": run_id,
        "data_dir": str(h.data_dir),
        "started_at": time.time_ns() // 1_000_000,
        "scenarios": {},
    }
    say(f"run {run_id}: {len(plans)} scenario(s), {messages} messages, seed {seed}")
    ok = True
    try:
        for p in plans:
            started = time.monotonic()
            say(f"{p.name}: {p.messages} messages, {json.dumps(p.params)[:160]}")
            runner = ON_MAIN_CLUSTER.get(p.name)
            if runner is None:
                raise WorkloadError(f"scenario {p.name} is not available yet")
            entry = await runner(Ctx(h, p, h.data_dir, layout.namesrv_addr))
            doc["scenarios"][p.name] = entry
            found = {k: v for k, v in entry["expected"].items() if v}
            say(f"{p.name}: done in {time.monotonic() - started:.1f} s: {found}")
    except (WorkloadError, OSError, TimeoutError) as e:
        ok = False
        doc["failed"] = {"scenario": p.name, "error": str(e)}
        say(f"{p.name} FAILED: {e}")
    finally:
        h.cleanup()
        doc["finished_at"] = time.time_ns() // 1_000_000
        validate(doc)
        write_truth(truth_path, doc)
    say(f"truth written to {truth_path}")
    out = summary(doc)
    if not ok:
        out["failed"] = doc["failed"]
    return out, ok
