"""mq_dlq_replay (Airflow DAG, manual): replay dead letters to their original topics, safely.

Trigger with the Params below. A dry run (the default) logs the plan and sends nothing.
A message is never replayed twice unless `force`; a failed run resumes where it stopped
(run it again, or clear its tasks); every outcome is a row of LAKE/dlq_replay_log.
Bad parameters fail the first task, before anything is read or sent.

`system` rabbitmq replays RabbitMQ dead letters (from their `x-death`) to the exchange and
routing keys they died with: `group` is the queue they died in, `topic` the exchange; the
Variable mqaudit_rabbit_url says where to publish, the producer ledger holds the bodies.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from airflow.sdk import Param, dag, get_current_context, task

from dags.settings import START, load_settings, send_params, spark_session, write_summary

TIME = ["null", "integer", "string"]
# A RocketMQ group, or a RabbitMQ queue of the usual characters (the CLI takes any name);
# check_params holds a RocketMQ group to the broker's own rule.
GROUP = r"^[%|a-zA-Z0-9_.:-]{1,255}$"


def _target(s: Any, request: Any) -> Any:
    """Where the replay sends; ValueError when the settings do not say."""
    if request.system != "rabbitmq":
        return s.for_cluster(request.cluster).target()
    target = s.rabbit_target()
    if target is None:
        raise ValueError("a RabbitMQ replay needs the Variable mqaudit_rabbit_url")
    return target


@dag(
    dag_id="mq_dlq_replay",
    schedule=None,
    start_date=START,
    catchup=False,
    max_active_runs=1,  # two replays at once could both send a message
    tags=["mqaudit", "dlq"],
    doc_md=__doc__,
    params={
        "group": Param(
            type="string", pattern=GROUP, description="consumer group of the DLQ (RabbitMQ: queue)"
        ),
        "topic": Param(
            None, type=["null", "string"], description="only this original topic (or exchange)"
        ),
        "from_time": Param(None, type=TIME, description="dead-lettered at/after: ms or ISO"),
        "to_time": Param(None, type=TIME, description="dead-lettered at/before: ms or ISO"),
        **send_params("replayed"),
        "system": Param(
            "rocketmq", type="string", enum=["rocketmq", "rabbitmq"], description="whose DLQ"
        ),
        "cluster": Param(
            None, type=["null", "string"], description="whose DLQ (default: mqaudit_data_dir's)"
        ),
    },
)
def mq_dlq_replay() -> None:
    @task
    def check_params() -> dict[str, Any]:
        """The request, checked; the replay id is stable across retries of this run."""
        from airflow.sdk.exceptions import AirflowFailException

        from pipeline.readers.layout import cluster_of
        from pipeline.remediation.replay_plan import replay_id_for
        from pipeline.remediation.replay_request import parse_request

        ctx = get_current_context()
        try:
            request = parse_request(dict(ctx["params"]))
            settings = load_settings()
            if request.cluster is None:  # the cluster the DAG's name servers serve
                request = replace(request, cluster=cluster_of(settings.data_dir))
            if not request.dry_run:  # a real replay needs the broker: say so now
                _target(settings, request)
        except ValueError as e:
            raise AirflowFailException(str(e)) from None
        replay_id = replay_id_for(ctx["dag"].dag_id, ctx["run_id"])
        print(f"{replay_id}: {request.describe()}")
        return {"replay_id": replay_id, "request": request.to_dict()}

    @task
    def plan(checked: dict[str, Any]) -> dict[str, Any]:
        from pipeline.jobs.replay import plan_step
        from pipeline.remediation.replay_request import ReplayRequest

        s = load_settings()
        request = ReplayRequest.from_dict(checked["request"])
        target = None if request.dry_run else _target(s, request)
        return plan_step(
            str(s.lake), request, checked["replay_id"], target=target, spark=spark_session(s)
        )

    @task
    def send(checked: dict[str, Any], planned: dict[str, Any]) -> dict[str, Any]:
        from pipeline.jobs.replay import send_step
        from pipeline.remediation.replay_request import ReplayRequest

        s = load_settings()
        request = ReplayRequest.from_dict(checked["request"])
        if request.dry_run:
            return {"dry_run": True, "sent": 0}
        # A retry, or a run whose plan was already logged: settle unlogged sends first.
        resume = get_current_context()["ti"].try_number > 1 or not planned["new_plan"]
        return send_step(
            str(s.lake),
            request,
            checked["replay_id"],
            _target(s, request),
            resume=resume,
            spark=spark_session(s),
        )

    @task
    def summarize(checked: dict[str, Any], sent: dict[str, Any]) -> dict[str, Any]:
        from pipeline.jobs.replay import replay_summary
        from pipeline.remediation.replay_request import ReplayRequest

        s = load_settings()
        request = ReplayRequest.from_dict(checked["request"])
        summary = replay_summary(str(s.lake), request, checked["replay_id"], spark=spark_session(s))
        summary["send"] = sent
        path = write_summary(s, "mq_dlq_replay", checked["replay_id"], summary)
        print(f"replay {checked['replay_id']}: {summary['by_status']} -> {path}")
        return summary

    checked = check_params()
    summarize(checked, send(checked, plan(checked)))


mq_dlq_replay()
