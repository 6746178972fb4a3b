#!/usr/bin/env bash
# Runs once, on an empty data directory (postgres image's /docker-entrypoint-initdb.d):
# one role and one database for Airflow's metadata, one for the producer/consumer ledgers.
# Passwords come from the environment and reach SQL only as psql variables (quoted by psql).
set -euo pipefail

: "${AIRFLOW_DB_PASSWORD:?AIRFLOW_DB_PASSWORD is not set}"
: "${LEDGER_DB_PASSWORD:?LEDGER_DB_PASSWORD is not set}"

psql -v ON_ERROR_STOP=1 --username "${POSTGRES_USER:-postgres}" --dbname "${POSTGRES_DB:-postgres}" \
    -v airflow_password="$AIRFLOW_DB_PASSWORD" \
    -v ledger_password="$LEDGER_DB_PASSWORD" <<'SQL'
CREATE ROLE airflow LOGIN PASSWORD :'airflow_password';
CREATE DATABASE airflow OWNER airflow ENCODING 'UTF8';
CREATE ROLE ledger LOGIN PASSWORD :'ledger_password';
CREATE DATABASE mqaudit_ledger OWNER ledger ENCODING 'UTF8';
SQL
