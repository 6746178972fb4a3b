"""mq_loss_repair (Airflow DAG, manual): send lost_after_ack losses again, safely.

Takes the last audit's `lost_after_ack` losses of one cluster (`cluster`: one of those mq_audit
audits, by name; default: mqaudit_data_dir's), or the `msg_ids` given, and sends each again from
that cluster's producer ledger's kept body to its name servers, with its UNIQ_KEY, TAGS, KEYS, at
`messages_per_second`. A dry run (the default) logs the plan and sends nothing. A loss is
never repaired twice unless `force`; a failed run resumes where it stopped (run it again, or
clear its tasks); a loss with no kept body is logged "not repairable" with the reason. Every
outcome is a row of LAKE/repair_log; the next mq_audit no longer lists a repaired loss.
Bad parameters fail the first task, before anything is read or sent.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from airflow.sdk import Param, dag, get_current_context, task

from dags.settings import START, load_settings, send_params, spark_session, write_summary

DAG_ID = "mq_loss_repair"


@dag(
    dag_id=DAG_ID,
    schedule=None,
    start_date=START,
    catchup=False,
    max_active_runs=1,  # two repairs at once could both send a message
    tags=["mqaudit", "repair"],
    doc_md=__doc__,
    params={
        **send_params("repaired"),
        "cluster": Param(
            None, type=["null", "string"], description="whose losses (default: mqaudit_data_dir's)"
        ),
    },
)
def mq_loss_repair() -> None:
    @task
    def check_params() -> dict[str, Any]:
        """The request, checked; the repair id is stable across retries of this run."""
        from airflow.sdk.exceptions import AirflowFailException

        from pipeline.readers.layout import cluster_of
        from pipeline.remediation.replay_plan import replay_id_for
        from pipeline.remediation.replay_request import parse_repair_request

        ctx = get_current_context()
        try:
            request = parse_repair_request(dict(ctx["params"]))
            s = load_settings().for_cluster(request.cluster)
            if request.cluster is None:  # the cluster the DAG's name servers serve
                request = replace(request, cluster=cluster_of(s.data_dir))
            if not request.dry_run:
                s.target()  # a real repair needs the cluster's name servers: say so now
        except ValueError as e:
            raise AirflowFailException(str(e)) from None
        repair_id = replay_id_for(ctx["dag"].dag_id, ctx["run_id"], kind="repair")
        print(f"{repair_id}: {request.describe()} in {request.cluster} ({s.data_dir})")
        return {"repair_id": repair_id, "request": request.to_dict()}

    @task
    def plan(checked: dict[str, Any]) -> dict[str, Any]:
        from pipeline.jobs.repair import plan_step
        from pipeline.remediation.replay_request import RepairRequest

        request = RepairRequest.from_dict(checked["request"])
        s = load_settings().for_cluster(request.cluster)
        return plan_step(
            str(s.lake), s.data_dir, request, checked["repair_id"],
            target=None if request.dry_run else s.target(), ledger_url=s.ledger_url,
            spark=spark_session(s),
        )  # fmt: skip

    @task
    def send(checked: dict[str, Any], planned: dict[str, Any]) -> dict[str, Any]:
        from pipeline.jobs.repair import send_step
        from pipeline.remediation.replay_request import RepairRequest

        request = RepairRequest.from_dict(checked["request"])
        s = load_settings().for_cluster(request.cluster)
        if request.dry_run:
            return {"dry_run": True, "sent": 0}
        # A retry, or a run whose plan was already logged: settle unlogged sends first.
        resume = get_current_context()["ti"].try_number > 1 or not planned["new_plan"]
        return send_step(
            str(s.lake), s.data_dir, request, checked["repair_id"], s.target(), resume=resume,
            ledger_url=s.ledger_url, spark=spark_session(s),
        )  # fmt: skip

    @task
    def summarize(checked: dict[str, Any], sent: dict[str, Any]) -> dict[str, Any]:
        from pipeline.jobs.repair import repair_summary
        from pipeline.remediation.replay_request import RepairRequest

        request = RepairRequest.from_dict(checked["request"])
        s = load_settings().for_cluster(request.cluster)
        summary = repair_summary(str(s.lake), request, checked["repair_id"], spark=spark_session(s))
        summary["send"] = sent
        summary["cluster"] = request.cluster
        path = write_summary(s, DAG_ID, checked["repair_id"], summary)
        print(f"repair {checked['repair_id']}: {summary['by_status']} -> {path}")
        return summary

    checked = check_params()
    summarize(checked, send(checked, plan(checked)))


mq_loss_repair()
