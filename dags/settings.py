"""Where the mqaudit DAGs find the cluster, the lake and Spark.

Each setting is an Airflow Variable (also settable as env AIRFLOW_VAR_<NAME>) with an
embedded default. The broker's name servers and ACL keys may instead come from the Airflow
Connection `mqaudit_broker` (host:port of a name server, or extra {"namesrv": "h:p;h:p"};
login/password = access/secret key); without either, the data dir's cluster.json says.

| Variable               | default            | meaning                                     |
|------------------------|--------------------|---------------------------------------------|
| mqaudit_data_dir       | ~/mqaudit/data     | the cluster's data dir (broker files, ledger)|
| mqaudit_data_dirs      | (none)             | more clusters' data dirs, ':'-separated:    |
|                        |                    | mq_audit ingests them into the same lake    |
| mqaudit_lake           | ~/mqaudit/lake     | Delta tables at LAKE/<table>                |
| mqaudit_reports        | ~/mqaudit/reports  | reports, Data Docs and run summaries        |
| mqaudit_namesrv        | (cluster.json)     | name servers, host:port;host:port           |
| mqaudit_ledger_url     | (SQLite in DIR)    | PostgreSQL URL of both ledgers              |
| mqaudit_rabbit_api     | (none)             | RabbitMQ management API: topology ingested  |
| mqaudit_rabbit_vhosts  | /                  | its virtual hosts, comma-separated          |
| mqaudit_rabbit_url     | (none)             | amqp://user:pass@host:port/vhost: where the |
|                        |                    | resend and a rabbitmq replay publish        |
| mqaudit_spark_master   | local[2]           | Spark master of in-process jobs             |
| mqaudit_spark_conf     | {}                 | JSON: more Spark settings (e.g. partitions) |
| mqaudit_spark_submit   | false              | true: Spark steps run by SparkSubmitOperator|
| mqaudit_max_send_count | 16                 | sends after which a stub needs a person     |
| mqaudit_half_stuck_ms  | 66000              | a half message undecided this long is stuck |
| mqaudit_audit_every_minutes | 60            | mq_audit's interval: divides 60 (parse time)|
| mqaudit_vacuum_retention_hours | 168        | VACUUM keeps files younger than this        |

`mqaudit_spark_submit` is read when the DAG files are parsed (it changes the tasks); the
submitted jobs use the Connection `mqaudit_spark` (a spark:// master, see the provider).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pendulum

from broker_runtime.common.constants import HALF_STUCK_AFTER_MS

BROKER_CONN = "mqaudit_broker"
SPARK_CONN = "mqaudit_spark"
START = pendulum.datetime(2024, 1, 1, tz="UTC")  # static: runs are never backfilled
DOCS = "data-docs"  # Data Docs under REPORTS
DEFAULTS: dict[str, str] = {
    "mqaudit_data_dir": "~/mqaudit/data",
    "mqaudit_data_dirs": "",
    "mqaudit_lake": "~/mqaudit/lake",
    "mqaudit_reports": "~/mqaudit/reports",
    "mqaudit_namesrv": "",
    "mqaudit_ledger_url": "",
    "mqaudit_rabbit_api": "",
    "mqaudit_rabbit_vhosts": "/",
    "mqaudit_rabbit_url": "",
    "mqaudit_spark_master": "local[2]",
    "mqaudit_spark_conf": "{}",
    "mqaudit_spark_submit": "false",
    "mqaudit_max_send_count": "16",
    "mqaudit_half_stuck_ms": "66000",
    "mqaudit_audit_every_minutes": "60",
    "mqaudit_vacuum_retention_hours": "168",
}


def variable(name: str) -> str:
    """The Variable's value, else its embedded default (env AIRFLOW_VAR_* counts as set)."""
    from airflow.sdk import Variable

    value = Variable.get(name, default=None)
    return DEFAULTS[name] if value is None or str(value).strip() == "" else str(value).strip()


def spark_submit_enabled() -> bool:
    """Parse time: whether Spark steps are submitted (env first: no metadata DB needed)."""
    raw = _parse_time_setting("mqaudit_spark_submit")
    return raw.lower() in ("1", "true", "yes", "on")


def _parse_time_setting(name: str) -> str:
    """A Variable read when the DAG files are parsed: env first (no metadata DB needed)."""
    raw = os.environ.get("AIRFLOW_VAR_" + name.upper())
    if raw is None:
        try:
            raw = variable(name)
        except Exception:  # no Variable backend while parsing (a bare DagBag): the default
            raw = DEFAULTS[name]
    return raw.strip()


def audit_every_minutes() -> int:
    """Parse time: mq_audit's interval in minutes, a divisor of 60 (60: hourly)."""
    raw = _parse_time_setting("mqaudit_audit_every_minutes")
    if not raw.isdigit() or int(raw) == 0 or 60 % int(raw) != 0:
        raise ValueError(f"mqaudit_audit_every_minutes must divide 60, got {raw!r}")
    return int(raw)


def _broker_connection() -> Any | None:
    from airflow.sdk import BaseHook

    try:
        return BaseHook.get_connection(BROKER_CONN)
    except Exception:  # AirflowNotFoundException: the Connection is optional
        return None


@dataclass(frozen=True)
class Settings:
    data_dir: Path
    lake: Path
    reports: Path
    namesrv: str | None
    ledger_url: str | None
    spark_master: str
    max_send_count: int
    half_stuck_ms: int = HALF_STUCK_AFTER_MS
    rabbit_api: str | None = None
    rabbit_vhosts: str = "/"
    rabbit_url: str | None = None
    spark_conf: dict[str, str] = field(default_factory=dict)
    access_key: str | None = None
    secret_key: str | None = None
    more_data_dirs: tuple[Path, ...] = ()  # other clusters audited in the same lake

    def target(self) -> Any:
        """The BrokerTarget of the remediation jobs; ValueError if no name server is known."""
        from pipeline.remediation.sender import BrokerTarget

        if not self.namesrv:
            raise ValueError(
                f"no name server: set the Variable mqaudit_namesrv, the Connection {BROKER_CONN},"
                f" or start a cluster in {self.data_dir} (its cluster.json)"
            )
        return BrokerTarget(self.namesrv, self.access_key, self.secret_key)

    def for_cluster(self, cluster: str | None) -> Settings:
        """These settings with `cluster`'s data dir as the data dir: a remedy acts on one of
        the clusters mq_audit audits (mqaudit_data_dir's, None for it, or one of
        mqaudit_data_dirs'; each dir's cluster.json names it). Another dir's name servers
        are its cluster.json's (mqaudit_namesrv and the Connection are mqaudit_data_dir's).
        ValueError naming the known clusters if none is `cluster`."""
        from pipeline.readers.layout import cluster_of

        known = {cluster_of(d): d for d in reversed((self.data_dir, *self.more_data_dirs))}
        if not cluster or known.get(cluster) == self.data_dir:
            return self
        if cluster not in known:
            raise ValueError(
                f"no cluster {cluster!r} in mqaudit_data_dir(s); known: {sorted(known)}"
            )
        data_dir = known[cluster]
        return replace(self, data_dir=data_dir, namesrv=_namesrv_of(data_dir))

    def rabbit_target(self) -> Any:
        """The RabbitTarget of the remediation jobs (None without mqaudit_rabbit_url)."""
        from pipeline.remediation.rabbit_sender import RabbitTarget

        if not self.rabbit_url:
            return None
        return RabbitTarget(self.rabbit_url, str(self.data_dir), self.ledger_url)

    def as_dict(self) -> dict[str, Any]:
        return {
            "data_dir": str(self.data_dir),
            "more_data_dirs": [str(d) for d in self.more_data_dirs],
            "lake": str(self.lake),
            "reports": str(self.reports),
            "namesrv": self.namesrv,
            "ledger_url": "(set)" if self.ledger_url else None,
            "spark_master": self.spark_master,
            "max_send_count": self.max_send_count,
            "half_stuck_ms": self.half_stuck_ms,
            "rabbit_api": "(set)" if self.rabbit_api else None,
            "rabbit_url": "(set)" if self.rabbit_url else None,
            "acl": self.access_key is not None,
        }


def _namesrv(data_dir: Path, conn: Any | None) -> str | None:
    """The Variable mqaudit_namesrv, else the Connection's, else DIR/cluster.json's."""
    explicit = variable("mqaudit_namesrv")
    if explicit:
        return explicit
    if conn is not None:
        extra = json.loads(conn.extra or "{}") if isinstance(conn.extra, str) else {}
        if extra.get("namesrv"):
            return str(extra["namesrv"])
        if conn.host:
            return f"{conn.host}:{conn.port or 9876}"
    return _namesrv_of(data_dir)


def _namesrv_of(data_dir: Path) -> str | None:
    from broker_runtime.cluster.layout import namesrv_of_data_dir

    try:
        return namesrv_of_data_dir(data_dir)
    except ValueError:
        return None


def load_settings() -> Settings:
    """Inside a task: every setting resolved (Variables, Connection, defaults). The steps'
    progress lines go to the task log, at INFO (`log_progress`)."""
    from broker_runtime.common.progress import log_progress
    from pipeline.steps import split_dirs

    log_progress()
    data_dir = Path(variable("mqaudit_data_dir")).expanduser().resolve()
    conn = _broker_connection()
    try:
        max_send = int(variable("mqaudit_max_send_count"))
    except ValueError as e:
        raise ValueError(f"Variable mqaudit_max_send_count must be an integer: {e}") from None
    try:
        half_stuck_ms = int(variable("mqaudit_half_stuck_ms"))
    except ValueError as e:
        raise ValueError(f"Variable mqaudit_half_stuck_ms must be an integer: {e}") from None
    try:
        spark_conf = json.loads(variable("mqaudit_spark_conf"))
        if not isinstance(spark_conf, dict):
            raise ValueError("not a JSON object")
    except ValueError as e:
        raise ValueError(f"Variable mqaudit_spark_conf must be a JSON object: {e}") from None
    return Settings(
        data_dir=data_dir,
        lake=Path(variable("mqaudit_lake")).expanduser().resolve(),
        reports=Path(variable("mqaudit_reports")).expanduser().resolve(),
        namesrv=_namesrv(data_dir, conn),
        ledger_url=variable("mqaudit_ledger_url") or None,
        spark_master=variable("mqaudit_spark_master"),
        max_send_count=max_send,
        half_stuck_ms=half_stuck_ms,
        rabbit_api=variable("mqaudit_rabbit_api") or None,
        rabbit_vhosts=variable("mqaudit_rabbit_vhosts"),
        rabbit_url=variable("mqaudit_rabbit_url") or None,
        spark_conf={str(k): str(v) for k, v in spark_conf.items()},
        access_key=(conn.login or None) if conn is not None else None,
        secret_key=(conn.password or None) if conn is not None else None,
        more_data_dirs=tuple(
            d.expanduser().resolve() for d in split_dirs([variable("mqaudit_data_dirs")])
        ),
    )


def spark_session(settings: Settings) -> Any:
    """The task's Spark session (one per task process; tasks of `dags test` share it)."""
    from pipeline.spark_session import build_spark

    return build_spark("mqaudit-airflow", settings.spark_master, settings.spark_conf)


def write_summary(settings: Settings, dag_id: str, run_key: str, summary: dict[str, Any]) -> Path:
    """REPORTS/<dag_id>/<run_key>/summary.json (the demo and people read it)."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in run_key)
    out = settings.reports / dag_id / safe / "summary.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2, default=str))
    latest = settings.reports / dag_id / "latest.json"
    latest.write_text(json.dumps({"run": safe, "summary": str(out)}, indent=2))
    return out


def var_template(name: str) -> str:
    """A Jinja reference to the Variable with its default (for templated operator fields)."""
    return "{{ var.value.get('" + name + "', '" + DEFAULTS[name] + "') }}"


AS_OF_TEMPLATE = "{{ (data_interval_end.timestamp() * 1000) | int }}"
INTERVAL_TEMPLATE = "{{ data_interval_end.strftime('%Y%m%dT%H%M%SZ') }}"


def submitted(task_id: str, args: list[str]) -> Any:
    """A SparkSubmitOperator running `spark_app.py <args>` on the Connection mqaudit_spark."""
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    from pipeline.spark_session import launch_conf

    # spark-submit resolves the Delta packages before the application's session exists.
    return SparkSubmitOperator(
        task_id=task_id,
        application=str(Path(__file__).with_name("spark_app.py")),
        application_args=args,
        conn_id=SPARK_CONN,
        name=f"mqaudit-{task_id}",
        conf={**launch_conf(), "spark.sql.session.timeZone": "UTC"},
    )


def send_params(done: str) -> dict[str, Any]:
    """The Params of a manual DAG that sends messages again (mq_dlq_replay, mq_loss_repair):
    which ones, how many, how fast, dry run and force (`done`: "replayed", "repaired")."""
    from airflow.sdk import Param

    return {
        "msg_ids": Param([], type="array", items={"type": "string"}, description="UNIQ_KEYs"),
        "max_messages": Param(100, type="integer", minimum=1, maximum=100_000),
        "messages_per_second": Param(50, type="number", exclusiveMinimum=0, maximum=10_000),
        "dry_run": Param(True, type="boolean", description="log the plan, send nothing"),
        "force": Param(False, type="boolean", description=f"send even if {done} before"),
    }


def step_inputs(settings: Settings, dag_id: str, ctx: Any) -> Any:
    """The RunInputs of a DAG's pipeline steps run in-process (see step_templates)."""
    from pipeline.steps import RunInputs

    key = interval_key(ctx)
    return RunInputs(
        lake=settings.lake,
        data_dirs=(settings.data_dir, *settings.more_data_dirs),
        out=settings.reports / dag_id / key,
        docs=settings.reports / DOCS,
        run_name=f"{dag_id}-{key}",
        as_of_ms=as_of_ms(ctx),
        max_send_count=settings.max_send_count,
        half_stuck_ms=settings.half_stuck_ms,
        ledger_url=settings.ledger_url,
        rabbit_api=settings.rabbit_api,
        rabbit_vhosts=settings.rabbit_vhosts,
        spark_master=settings.spark_master,
    )


def step_templates(dag_id: str) -> dict[str, str]:
    """The same inputs as templates, for the command lines of submitted steps."""
    reports = var_template("mqaudit_reports")
    return {
        "lake": var_template("mqaudit_lake"),
        "data_dirs": var_template("mqaudit_data_dir")
        + os.pathsep
        + var_template("mqaudit_data_dirs"),
        "out": f"{reports}/{dag_id}/{INTERVAL_TEMPLATE}",
        "docs": f"{reports}/{DOCS}",
        "run_name": f"{dag_id}-{INTERVAL_TEMPLATE}",
        "as_of_ms": AS_OF_TEMPLATE,
        "max_send_count": var_template("mqaudit_max_send_count"),
        "half_stuck_ms": var_template("mqaudit_half_stuck_ms"),
        "ledger_url": var_template("mqaudit_ledger_url"),
        "rabbit_api": var_template("mqaudit_rabbit_api"),
        "rabbit_vhosts": var_template("mqaudit_rabbit_vhosts"),
    }


def interval_key(ctx: Any) -> str:
    """The run's data interval end as a folder name (reports are per interval)."""
    end = ctx["data_interval_end"] or ctx["logical_date"]
    return str(end.strftime("%Y%m%dT%H%M%SZ"))


def as_of_ms(ctx: Any) -> int:
    """The run's time: its data interval end (never the wall clock)."""
    end = ctx["data_interval_end"] or ctx["logical_date"]
    return int(end.timestamp() * 1000)
