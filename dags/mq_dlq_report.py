"""mq_dlq_report (Airflow DAG, daily): the dead-letter report.

From the last audit's `audit_dead_letters`: every dead letter per group with its retry
chain, age and whether it was replayed, as HTML and CSV under REPORTS/mq_dlq_report/<day>/.
Replay them with the manual DAG mq_dlq_replay.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.sdk import dag, get_current_context, task
from airflow.timetables.trigger import CronTriggerTimetable

from dags.settings import (
    START,
    interval_key,
    load_settings,
    spark_submit_enabled,
    step_inputs,
    step_templates,
    submitted,
    write_summary,
)
from pipeline.steps import DLQ_REPORT

DAG_ID = "mq_dlq_report"


@dag(
    dag_id=DAG_ID,
    schedule=CronTriggerTimetable("0 6 * * *", timezone="UTC", interval=timedelta(days=1)),
    start_date=START,
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 1, "retry_delay": timedelta(minutes=5)},
    tags=["mqaudit", "dlq"],
    doc_md=__doc__,
)
def mq_dlq_report() -> None:
    if spark_submit_enabled():
        submitted(DLQ_REPORT.name, DLQ_REPORT.argv(step_templates(DAG_ID)))
        return

    @task
    def dlq_report() -> dict[str, Any]:
        s, ctx = load_settings(), get_current_context()
        key = interval_key(ctx)
        built = DLQ_REPORT.run(step_inputs(s, DAG_ID, ctx), None)  # no Spark: pyarrow reads
        path = write_summary(s, DAG_ID, key, {"interval_end": key, "report": built})
        print(f"dead-letter report: {built.get('html')} (CSV {built.get('csv')}); {path}")
        return {"summary": str(path), "report": built}

    dlq_report()


mq_dlq_report()
