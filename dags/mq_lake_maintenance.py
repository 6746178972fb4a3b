"""mq_lake_maintenance (Airflow DAG, daily): OPTIMIZE and VACUUM every table of the lake.

OPTIMIZE bin-packs small files (Z-ordered where a table is looked up by key); VACUUM deletes
files no version younger than the Variable mqaudit_vacuum_retention_hours (default 168)
needs. It holds the lake's writer lock, which ingest holds while it writes, so it never
runs beside an ingest (it waits for one to finish, up to an hour, else fails and retries).
What it did per table: REPORTS/mq_lake_maintenance/<day>/summary.json.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.sdk import dag, get_current_context, task
from airflow.timetables.trigger import CronTriggerTimetable

from dags.settings import START, interval_key, load_settings, spark_session, variable, write_summary

DAG_ID = "mq_lake_maintenance"


@dag(
    dag_id=DAG_ID,
    schedule=CronTriggerTimetable("30 3 * * *", timezone="UTC", interval=timedelta(days=1)),
    start_date=START,
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": timedelta(minutes=15)},
    tags=["mqaudit", "maintenance"],
    doc_md=__doc__,
)
def mq_lake_maintenance() -> None:
    @task
    def maintain() -> dict[str, Any]:
        from pipeline.jobs.maintenance import maintain_lake

        s = load_settings()
        raw = variable("mqaudit_vacuum_retention_hours")
        try:
            hours = float(raw)
        except ValueError:
            raise ValueError(
                f"Variable mqaudit_vacuum_retention_hours must be a number, got {raw!r}"
            ) from None
        key = interval_key(get_current_context())
        report = maintain_lake(s.lake, spark_session(s), hours)
        path = write_summary(s, DAG_ID, key, report)
        for name, t in report["tables"].items():
            print(
                f"{name}: {t['files_before']} -> {t['files_after']} files"
                f" (OPTIMIZE +{t['optimize_added']} -{t['optimize_removed']},"
                f" VACUUM deleted {t['vacuum_deleted']})"
            )
        print(f"lake maintenance: {path}")
        return {"summary": str(path), "tables": len(report["tables"])}

    maintain()


mq_lake_maintenance()
