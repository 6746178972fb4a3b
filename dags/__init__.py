"""The mqaudit Airflow DAGs (mq_audit, mq_retry_resend, mq_dlq_report, mq_dlq_replay) and
their settings; the DAG files wire tasks to pipeline steps and jobs."""
