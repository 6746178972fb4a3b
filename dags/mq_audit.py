"""mq_audit (Airflow DAG, hourly): ingest -> validate -> audit -> report, per data interval.

- ingest: broker files and ledgers into the lake's Delta tables (incremental, idempotent);
- validate: Great Expectations gates on the ingested tables; a failed gate fails the run
  with the expectation and sample rows in the message (no retry: the data must be fixed);
- audit: every audit table as of the interval's end (same interval, same lake: no change);
- report: the HTML audit report under REPORTS/mq_audit/<interval end>/, the audit tables'
  gates (thresholds: reported, not failing), and a summary.json.

Settings: dags/settings.py (Variables mqaudit_*). With mqaudit_spark_submit=true the
Spark steps are SparkSubmitOperator tasks running dags/spark_app.py.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.sdk import chain, dag, get_current_context, task
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

DAG_ID = "mq_audit"


def _submitted_steps() -> None:
    """The Spark steps as spark-submit runs of dags/spark_app.py, in order."""
    lake, reports = var_template("mqaudit_lake"), var_template("mqaudit_reports")
    docs, run_name = f"{reports}/data-docs", f"{DAG_ID}-{INTERVAL_TEMPLATE}"
    data_dir, out = var_template("mqaudit_data_dir"), f"{reports}/{DAG_ID}/{INTERVAL_TEMPLATE}"
    max_send = ["--max-send-count", var_template("mqaudit_max_send_count")]
    chain(
        submitted("ingest", ["ingest", "--data-dir", data_dir, "--lake", lake]),
        submitted("validate", ["validate", "--lake", lake, "--docs", docs, "--run-name", run_name]),
        submitted("audit", ["audit", "--lake", lake, "--as-of", AS_OF_TEMPLATE, *max_send]),
        submitted("report", ["report", "--lake", lake, "--out", out, "--docs", docs]),
    )  # fmt: skip


@dag(
    dag_id=DAG_ID,
    schedule=CronTriggerTimetable("0 * * * *", timezone="UTC", interval=timedelta(hours=1)),
    start_date=START,
    catchup=False,
    max_active_runs=1,  # runs share the lake's ingest checkpoint
    default_args={"retries": 1, "retry_delay": timedelta(minutes=2)},
    tags=["mqaudit"],
    doc_md=__doc__,
)
def mq_audit() -> None:
    if spark_submit_enabled():
        _submitted_steps()
        return

    @task
    def ingest() -> dict[str, Any]:
        from pipeline.jobs.ingest import run_ingest

        s = load_settings()
        return run_ingest(s.data_dir, s.lake, spark_session(s), ledger_url=s.ledger_url)

    @task(retries=0)
    def validate(ingested: dict[str, Any]) -> dict[str, Any]:
        from airflow.sdk.exceptions import AirflowFailException

        from dags.spark_app import validate_ingested
        from expectations.checkpoints import GateFailed

        s, ctx = load_settings(), get_current_context()
        run_name = f"{DAG_ID}-{interval_key(ctx)}"
        try:
            return validate_ingested(spark_session(s), s.lake, s.reports / "data-docs", run_name)
        except GateFailed as e:
            raise AirflowFailException(str(e)) from None

    @task
    def audit(validated: dict[str, Any]) -> dict[str, Any]:
        from pipeline.jobs.audit import AuditThresholds, run_audit

        s = load_settings()
        limits = AuditThresholds(max_send_count=s.max_send_count)  # as mq_retry_resend's
        return run_audit(s.lake, spark_session(s), as_of_ms(get_current_context()), limits)

    @task
    def report(ingested: dict[str, Any], audited: dict[str, Any]) -> dict[str, Any]:
        from dags.spark_app import gate_audits
        from pipeline.reports.audit_report import build_report

        s, ctx = load_settings(), get_current_context()
        key = interval_key(ctx)
        docs = s.reports / "data-docs"
        spark = spark_session(s)
        gates = gate_audits(spark, s.lake, docs, f"{DAG_ID}-{key}-audits")
        built = build_report(s.lake, s.reports / DAG_ID / key, spark=spark, docs_dir=docs)
        summary = {
            "interval_end": key,
            "ingest": ingested,
            "audit": audited,
            "audit_gates": gates,
            "report": built,
        }
        path = write_summary(s, DAG_ID, key, summary)
        print(f"audit report: {built.get('html')}; summary: {path}")
        return {"summary": str(path), "report": built}

    ingested = ingest()
    report(ingested, audit(validate(ingested)))


mq_audit()
