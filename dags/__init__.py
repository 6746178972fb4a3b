"""Airflow DAG package marker: DAG files live here (later issues)."""
