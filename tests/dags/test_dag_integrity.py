"""The DAG files import cleanly, define the six DAGs with their contracts, and refuse bad
replay and repair parameters before any task that reads or sends runs."""

from __future__ import annotations

import copy
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.dags.conftest import AIRFLOW_WARNINGS, DAGS

pytestmark = [pytest.mark.airflow, *AIRFLOW_WARNINGS]

DAG_IDS = {
    "mq_audit",
    "mq_retry_resend",
    "mq_dlq_report",
    "mq_dlq_replay",
    "mq_lake_maintenance",
    "mq_loss_repair",
}
MANUAL = {"mq_dlq_replay", "mq_loss_repair"}  # no schedule: triggered with params
REPLAY_PARAMS = {
    "group": "string",
    "topic": ["null", "string"],
    "from_time": ["null", "integer", "string"],
    "to_time": ["null", "integer", "string"],
    "msg_ids": "array",
    "max_messages": "integer",
    "messages_per_second": "number",
    "dry_run": "boolean",
    "force": "boolean",
    "system": "string",
    "cluster": ["null", "string"],
}


def test_no_import_errors_and_the_six_dags(dagbag: Any) -> None:
    assert dagbag.import_errors == {}
    assert set(dagbag.dags) == DAG_IDS
    loaded = {stat.file for stat in dagbag.dagbag_stats}
    assert loaded == {f"{d}.py" for d in DAG_IDS}  # helpers are .airflowignore'd


def test_schedules_and_safety_settings(dagbag: Any) -> None:
    for dag_id in DAG_IDS:
        dag = dagbag.dags[dag_id]
        assert dag.catchup is False
        assert dag.start_date.year == 2024  # static, never now()
        assert dag.max_active_runs == 1
        assert "mqaudit" in dag.tags
    assert {type(dagbag.dags[d].timetable).__name__ for d in MANUAL} == {"NullTimetable"}
    cron = {d: dagbag.dags[d].timetable.summary for d in DAG_IDS - MANUAL}
    assert cron == {
        "mq_audit": "0 * * * *",
        "mq_retry_resend": "*/15 * * * *",
        "mq_dlq_report": "0 6 * * *",
        "mq_lake_maintenance": "30 3 * * *",
    }
    assert [t.task_id for t in dagbag.dags["mq_audit"].topological_sort()] == [
        "ingest",
        "validate",
        "audit",
        "report",
    ]


def test_replay_params_are_typed_with_safe_defaults(dagbag: Any) -> None:
    params = dagbag.dags["mq_dlq_replay"].params
    assert {k: params.get_param(k).schema["type"] for k in params} == REPLAY_PARAMS
    assert params["dry_run"] is True and params["force"] is False
    assert params["max_messages"] == 100
    repair = dagbag.dags["mq_loss_repair"].params
    assert {k: repair.get_param(k).schema["type"] for k in repair} == {
        k: REPLAY_PARAMS[k]
        for k in ("msg_ids", "max_messages", "messages_per_second", "dry_run", "force", "cluster")
    }
    assert repair["dry_run"] is True and repair["force"] is False


@pytest.mark.parametrize(
    "conf",
    [
        {"group": "not a group!", "from_time": 0},
        {"group": "g", "max_messages": 0, "from_time": 0},
        {"group": "g", "dry_run": "yes", "from_time": 0},
    ],
)
def test_bad_param_values_fail_before_the_run(dagbag: Any, conf: dict[str, Any]) -> None:
    from airflow.sdk.exceptions import ParamValidationError

    params = copy.deepcopy(dagbag.dags["mq_dlq_replay"].params)
    with pytest.raises(ParamValidationError):  # on update: each value is checked as it is set
        params.update(conf)
        params.validate()


def test_airflow_cli_refuses_bad_params_without_running(airflow_db: Any) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "airflow", "dags", "test", "mq_dlq_replay", "-c", '{"group": 5}'],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert out.returncode == 1
    assert "ParamValidationError" in out.stderr + out.stdout
    assert "[DAG TEST] starting task_id" not in out.stderr + out.stdout


def test_spark_submit_mode_submits_the_spark_steps(
    airflow_db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.dag_processing.dagbag import DagBag

    from dags.settings import var_template

    monkeypatch.setenv("AIRFLOW_VAR_MQAUDIT_SPARK_SUBMIT", "true")
    bag = DagBag(dag_folder=str(DAGS))
    assert bag.import_errors == {}
    audit = bag.dags["mq_audit"]
    steps = audit.topological_sort()
    assert [type(t).__name__ for t in steps] == ["SparkSubmitOperator"] * 4
    assert all(t.application == str(DAGS / "spark_app.py") for t in steps)
    assert [t.application_args[0] for t in steps] == ["ingest", "validate", "audit", "report"]
    assert "data_interval_end" in " ".join(audit.get_task("audit").application_args)
    for step in ("validate", "audit"):  # the gate takes the bound the audit and resend take
        args = audit.get_task(step).application_args
        assert args[args.index("--max-send-count") + 1] == var_template("mqaudit_max_send_count")
    resend = bag.dags["mq_retry_resend"].get_task("resend")
    assert resend.application_args[0] == "resend"
    args = resend.application_args  # RabbitMQ's unconfirmed stubs are resent there too
    assert args[args.index("--rabbit-url") + 1] == var_template("mqaudit_rabbit_url")


def test_the_audit_interval_is_a_parse_time_variable(
    airflow_db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("AIRFLOW_VAR_MQAUDIT_AUDIT_EVERY_MINUTES", "15")
    dag = DagBag(dag_folder=str(DAGS / "mq_audit.py")).dags["mq_audit"]
    assert dag.timetable.summary == "*/15 * * * *"
    monkeypatch.setenv("AIRFLOW_VAR_MQAUDIT_AUDIT_EVERY_MINUTES", "7")
    bag = DagBag(dag_folder=str(DAGS / "mq_audit.py"))
    assert "mq_audit" not in bag.dags
    (error,) = bag.import_errors.values()
    assert "mqaudit_audit_every_minutes must divide 60, got '7'" in error


def test_a_remedy_acts_on_the_cluster_it_names(tmp_path: Path) -> None:
    """mq_loss_repair and mq_dlq_replay's `cluster`: that cluster's data dir and name servers
    (its cluster.json's), among the clusters mq_audit audits; another name is refused."""
    from broker_runtime.cluster.layout import ClusterLayout, NodeSpec
    from dags.settings import Settings

    def cluster(name: str, port: int) -> Path:
        root = tmp_path / name
        root.mkdir()
        node = NodeSpec("ns", "namesrv", "127.0.0.1", port, str(root), "ns.log", [])
        ClusterLayout(str(root), cluster_name=name, nodes=[node]).save()
        return root

    main, crash = cluster("main", 19876), cluster("crash", 29876)
    s = Settings(main, tmp_path / "lake", tmp_path / "r", "10.0.0.1:9876", None, "local[2]", 16)
    s = replace(s, more_data_dirs=(crash,))
    assert s.for_cluster(None) == s and s.for_cluster("main") == s  # the Variable's namesrv
    other = s.for_cluster("crash")
    assert (other.data_dir, other.namesrv) == (crash, "127.0.0.1:29876")
    assert (other.lake, other.more_data_dirs) == (s.lake, s.more_data_dirs)
    with pytest.raises(ValueError, match=r"no cluster 'elsewhere'.*known: \['crash', 'main'\]"):
        s.for_cluster("elsewhere")
