"""mq_audit (Airflow DAG, hourly): ingest -> validate -> audit -> report, per data interval.

The interval is an hour unless the Variable mqaudit_audit_every_minutes (read when the file
is parsed) sets a shorter one that divides the hour.

- ingest: broker files and ledgers into the lake's Delta tables (incremental, idempotent);
- validate: Great Expectations gates on the ingested tables; a failed gate fails the run
  with the expectation and sample rows in the message (no retry: the data must be fixed);
- audit: every audit table as of the interval's end (same interval, same lake: no change);
- report: the HTML audit report under REPORTS/mq_audit/<interval end>/, the audit tables'
  gates (thresholds: reported, not failing), and a summary.json.

The tasks are the steps of pipeline.steps, the ones `mqaudit pipeline run` runs, with the
inputs dags/settings.py gives them (Variables mqaudit_*). With mqaudit_spark_submit=true each
step is a SparkSubmitOperator task running the step's own command through dags/spark_app.py.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.sdk import chain, dag, get_current_context, task
from airflow.timetables.trigger import CronTriggerTimetable

from dags.settings import (
    START,
    audit_every_minutes,
    interval_key,
    load_settings,
    spark_session,
    spark_submit_enabled,
    step_inputs,
    step_templates,
    submitted,
    write_summary,
)
from pipeline.steps import AUDIT_STEPS, REPORT, STEPS

DAG_ID = "mq_audit"
EVERY = audit_every_minutes()


@task
def run_step(command: str) -> dict[str, Any]:
    """One step in this process; the report step also writes the run's summary.json."""
    from airflow.sdk.exceptions import AirflowFailException

    from expectations.results import GateFailed

    s, ctx = load_settings(), get_current_context()
    step = STEPS[command]
    try:
        result = step.run(step_inputs(s, DAG_ID, ctx), spark_session(s))
    except GateFailed as e:
        raise AirflowFailException(str(e)) from None
    if step is REPORT:
        key = interval_key(ctx)
        ingested, audited = (ctx["ti"].xcom_pull(task_ids=t) for t in ("ingest", "audit"))
        summary = {"interval_end": key, "ingest": ingested, "audit": audited, **result}
        path = write_summary(s, DAG_ID, key, summary)
        print(f"audit report: {result['report'].get('html')}; summary: {path}")
        return {"summary": str(path), "report": result["report"]}
    return result


def _no_retry(gate: bool) -> dict[str, Any]:
    return {"retries": 0} if gate else {}


@dag(
    dag_id=DAG_ID,
    schedule=CronTriggerTimetable(
        "0 * * * *" if EVERY == 60 else f"*/{EVERY} * * * *",
        timezone="UTC",
        interval=timedelta(minutes=EVERY),
    ),
    start_date=START,
    catchup=False,
    max_active_runs=1,  # runs share the lake's ingest checkpoint
    default_args={"retries": 1, "retry_delay": timedelta(minutes=2)},
    tags=["mqaudit"],
    doc_md=__doc__,
)
def mq_audit() -> None:
    if spark_submit_enabled():
        values = step_templates(DAG_ID)
        chain(*(submitted(step.name, step.argv(values)) for step in AUDIT_STEPS))
        return
    chain(
        *(
            run_step.override(task_id=step.name, **_no_retry(step.gate))(step.command)
            for step in AUDIT_STEPS
        )
    )


mq_audit()
