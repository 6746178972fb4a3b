"""mq_retry_resend (Airflow DAG, every 15 minutes): resend what was never acknowledged.

Takes the last audit's `resend_candidates`, checks each stub again in the
live ledgers, resends the due ones through the producer client with their UNIQ_KEY, and
updates each stub (send count + 1, next resend time backed off, the new offset once
acknowledged). Stubs at the max send count (Variable mqaudit_max_send_count), or whose body
is nowhere, are voided and listed for a person in REPORTS/mq_retry_resend/<run>/
manual_handling.csv. Every action is a row of LAKE/resend_log; a re-run sends nothing twice.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.sdk import dag, get_current_context, task
from airflow.timetables.trigger import CronTriggerTimetable

from dags.settings import (
    AS_OF_TEMPLATE,
    INTERVAL_TEMPLATE,
    START,
    as_of_ms,
    interval_key,
    load_settings,
    spark_session,
    spark_submit_enabled,
    submitted,
    var_template,
    write_summary,
)

DAG_ID = "mq_retry_resend"


@dag(
    dag_id=DAG_ID,
    schedule=CronTriggerTimetable("*/15 * * * *", timezone="UTC", interval=timedelta(minutes=15)),
    start_date=START,
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 1, "retry_delay": timedelta(minutes=1)},
    tags=["mqaudit", "resend"],
    doc_md=__doc__,
)
def mq_retry_resend() -> None:
    if spark_submit_enabled():
        reports, run_id = var_template("mqaudit_reports"), f"{DAG_ID}-{INTERVAL_TEMPLATE}"
        args = ["resend", "--as-of", AS_OF_TEMPLATE, "--run-id", run_id]
        args += ["--report-dir", f"{reports}/{DAG_ID}/{INTERVAL_TEMPLATE}"]
        for option, name in [
            ("--lake", "mqaudit_lake"),
            ("--data-dir", "mqaudit_data_dir"),
            ("--namesrv", "mqaudit_namesrv"),
            ("--ledger-url", "mqaudit_ledger_url"),
            ("--max-send-count", "mqaudit_max_send_count"),
            ("--rabbit-url", "mqaudit_rabbit_url"),  # empty: no RabbitMQ stubs resent
        ]:
            args += [option, var_template(name)]
        submitted("resend", args)
        return

    @task
    def resend() -> dict[str, Any]:
        from pipeline.jobs.resend import run_resend

        s, ctx = load_settings(), get_current_context()
        key = interval_key(ctx)
        return run_resend(
            str(s.lake),
            s.data_dir,
            s.target() if s.namesrv else None,
            as_of_ms=as_of_ms(ctx),
            run_id=f"{DAG_ID}-{key}",
            ledger_url=s.ledger_url,
            max_send_count=s.max_send_count,
            report_dir=s.reports / DAG_ID / key,
            rabbit=s.rabbit_target(),
            spark=spark_session(s),
        )

    @task
    def report(done: dict[str, Any]) -> dict[str, Any]:
        s = load_settings()
        key = interval_key(get_current_context())
        path = write_summary(s, DAG_ID, key, done)
        for item in done.get("manual", []):
            print(f"MANUAL HANDLING: {item['msg_id']} ({item['topic']}): {item['reason']}")
        print(f"resend {key}: {done.get('counts')}; summary: {path}")
        return {"summary": str(path), "counts": done.get("counts", {})}

    report(resend())


mq_retry_resend()
