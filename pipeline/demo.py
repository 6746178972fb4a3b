"""`mqaudit demo`: the product's main job, end to end on this machine.

Starts a cluster under OUT, runs the fault workload (every scenario) and, where RabbitMQ is
installed, RabbitMQ's fault scenarios on a node of its own (pipeline.demo_rabbit; audited by
the same DAGs into the same lake), then the DAGs through Airflow (what `airflow dags test`
runs, all in one process: pipeline.demo_dags; a SQLite database under OUT/airflow): mq_audit,
mq_retry_resend, mq_dlq_report, a dry run and a real mq_dlq_replay, then mq_audit again to
show what the remedies repaired (the summary's repair loop: found -> acted on -> found after);
prints a short summary (also OUT/summary.json) and where the reports are. It stops the
cluster and the RabbitMQ node while the last mq_audit runs, once its ingest has read them
(also on failure). The workload runs some scenarios on clusters of their own
(OUT/cluster/scenarios/<name>, each named after its scenario); mq_audit ingests and audits
them with the demo's cluster into the one lake (the Variable mqaudit_data_dirs), and the
summary counts per cluster.

    OUT/cluster  the cluster's data dir (brokers, name servers, ledgers)
    OUT/lake     Delta tables          OUT/reports  reports, Data Docs, run summaries
    OUT/airflow  AIRFLOW_HOME          OUT/logs     one log per step (the DAG worker's own:
                                                    airflow-dags.log)
    OUT/rabbitmq the RabbitMQ node's files   OUT/rabbit-truth.json  its workload's truth
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TextIO, TypeVar

from broker_runtime.workload.plan import MASTER_CRASH_ASYNC as LOSSY_CLUSTER
from pipeline.demo_dags import DagWorker
from pipeline.demo_lossy import LossyCluster
from pipeline.demo_rabbit import (
    RabbitFailed,
    RabbitSide,
    airflow_vars,
    rabbit_summary,
    unavailable_reason,
)
from pipeline.demo_summary import (
    build_summary,
    format_summary,
    latest,
    load_json,
    other_clusters,
    pick_replay_group,
)
from pipeline.spark_session import SMALL_DATA_SPARK

T = TypeVar("T")
REPLAY = "mq_dlq_replay"
DEFAULT_OUT = Path("demo-out")
DEFAULT_MESSAGES = 2000
OFFSET_HISTORY_MS = 1000
_SHOWN = re.compile(r"^(ingest|audit|gate|replay|resend|dead-letter report|audit report): ")
_TASK = re.compile(r"\[DAG TEST\] (starting|end) task(?:_id=| task_id=)(\w+)")


class DemoError(RuntimeError):
    """A step failed; the message says which and where its log is."""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = sub.add_parser(
        "demo",
        help="the main job: cluster, fault workload, audit DAGs, resend, DLQ report and replay",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    demo.add_argument("--out", type=Path, default=DEFAULT_OUT, help="default ./demo-out")
    demo.add_argument("--messages", type=int, default=DEFAULT_MESSAGES, help="workload size")
    demo.add_argument("--seed", type=int, default=7, help="workload seed")
    demo.add_argument(
        "--no-rabbitmq", action="store_true", help="no RabbitMQ node and workload (see above)"
    )
    demo.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    if args.messages <= 0:
        raise ValueError(f"--messages must be positive, got {args.messages}")
    try:
        summary = Demo(args.out, args.messages, args.seed, rabbitmq=not args.no_rabbitmq).run()
    except (DemoError, RabbitFailed) as e:
        print(f"mqaudit demo: FAILED: {e}", file=sys.stderr)
        return 1
    print(format_summary(summary))
    return 0


def _product(*args: str) -> list[str]:
    return [sys.executable, "-m", "broker_runtime.cli.main", *args]


class Demo:
    def __init__(
        self,
        out: Path,
        messages: int = DEFAULT_MESSAGES,
        seed: int = 7,
        console: TextIO | None = None,
        rabbitmq: bool = True,
    ) -> None:
        self.out = out.resolve()
        self.messages = messages
        self.seed = seed
        self.console = console or sys.stderr
        self.data_dir = self.out / "cluster"
        self.lake = self.out / "lake"
        self.reports = self.out / "reports"
        self.airflow_home = self.out / "airflow"
        self.logs = self.out / "logs"
        self.truth = self.out / "truth.json"
        self.rabbit_root = self.out / "rabbitmq"
        self.rabbit_truth = self.out / "rabbit-truth.json"
        self.rabbitmq = rabbitmq
        self.rabbit: RabbitSide | None = None
        self.timings: dict[str, float] = {}
        self.started = time.monotonic()
        self.after_task: dict[str, Callable[[], object]] = {}  # called once the task ends
        self._stopping: list[Future[None]] = []
        self.lossy = LossyCluster(self.data_dir)

    # -- output -----------------------------------------------------------------------------
    def say(self, line: str) -> None:
        print(f"[{time.monotonic() - self.started:6.1f}s] {line}", file=self.console, flush=True)

    def step(self, name: str, work: Callable[[], Any]) -> Any:
        self.say(f"== {name}")
        t0 = time.monotonic()
        try:
            result = work()
        except BaseException:
            self.timings[name] = round(time.monotonic() - t0, 1)
            self.say(f"   {name}: FAILED after {self.timings[name]} s")
            raise
        self.timings[name] = round(time.monotonic() - t0, 1)
        self.say(f"   {name}: {self.timings[name]} s")
        return result

    # -- the run ----------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Every step; the summary (also OUT/summary.json)."""
        self.prepare()
        why_not = unavailable_reason(skip=not self.rabbitmq)
        first_audit: dict[str, Any] | None = None
        # Every DAG run in one worker process (pipeline.demo_dags); it migrates Airflow's
        # database and parses the DAGs while the cluster and the workload run.
        dags = DagWorker(self.airflow_env(), self.logs / "airflow-dags.log")
        try:
            self.step("cluster up", self.cluster_up)
            self.start_rabbit(why_not)
            workload = self.step("workload", self.workload)
            self.step("airflow db", lambda: self.wait_dags(dags))
            if self.rabbit is not None:
                self.step("rabbitmq workload (waited for)", self.rabbit.wait)
                self.timings["rabbitmq node and workload (background)"] = self.rabbit.seconds
            self.step("mq_audit", lambda: self.dag_test(dags, "mq_audit"))
            self.lossy.start()
            self.step("mq_retry_resend", lambda: self.dag_test(dags, "mq_retry_resend"))
            self.step("mq_dlq_report", lambda: self.dag_test(dags, "mq_dlq_report"))
            group = pick_replay_group(self.reports, self.truth)
            if group is None:
                self.say("   no dead letters: nothing to replay")
            else:
                conf = {"group": group, "from_time": 0, "max_messages": 1000}
                conf["messages_per_second"] = 200
                dry, real = {**conf, "dry_run": True}, {**conf, "dry_run": False}
                self.step("mq_dlq_replay (dry run)", lambda: self.dag_test(dags, REPLAY, dry))
                self.step("mq_dlq_replay", lambda: self.dag_test(dags, REPLAY, real))
            self.step("loss repair", lambda: self.repair_losses(dags))
            # The audit the remedies acted on; the next one shows what they repaired. Once its
            # ingest has read the brokers and RabbitMQ, nothing else does: they stop meanwhile.
            first_audit = latest(self.reports, "mq_audit")
            after = "mq_audit (after the remedies)"
            self.after_task["ingest"] = self.stop_sources
            self.step(after, lambda: self.dag_test(dags, "mq_audit", label="mq_audit-after"))
        finally:  # each waits on its own processes: all at once
            with ThreadPoolExecutor(1) as pool:
                for stopped in [pool.submit(dags.stop), *self.stop_sources()]:
                    stopped.result()
            self.lossy.stop()
        self.timings["total"] = round(time.monotonic() - self.started, 1)
        rabbit = rabbit_summary(why_not, self.rabbit, load_json(self.rabbit_truth), self.lake)
        summary = build_summary(
            self.reports, self.truth, workload, self.timings, self.out, first_audit
        )
        summary["rabbitmq"] = rabbit  # printed by format_summary
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
        return summary

    def prepare(self) -> None:
        """A fresh run: an old cluster stopped, the demo's own folders emptied."""
        if (self.data_dir / "cluster.json").exists():
            self.cluster_down()
        old = (self.data_dir, self.lake, self.reports, self.airflow_home)
        for d in (*old, self.logs, self.rabbit_root):
            shutil.rmtree(d, ignore_errors=True)
        for f in (self.truth, self.rabbit_truth, self.out / "summary.json"):
            f.unlink(missing_ok=True)
        self.logs.mkdir(parents=True)
        self.airflow_home.mkdir(parents=True)
        self.say(f"demo in {self.out} ({self.messages} messages, seed {self.seed})")

    # -- the cluster ------------------------------------------------------------------------
    def cluster_up(self) -> None:
        # A consumer offset snapshot a second: the report's lag over time.
        argv = ["up", "--data-dir", str(self.data_dir), "--detach"]
        argv += ["--set", f"offset_history_interval_ms={OFFSET_HISTORY_MS}"]
        self.run_logged("cluster-up", _product("cluster", *argv))

    def stop_sources(self) -> list[Future[None]]:
        """Stop the cluster and the RabbitMQ node in the background (once): their stops."""
        if not self._stopping:
            pool = ThreadPoolExecutor(2, thread_name_prefix="stop")
            if (rabbit := self.rabbit) is not None:
                self._stopping.append(pool.submit(self.step, "rabbitmq down", rabbit.stop))
            self._stopping.append(pool.submit(self.step, "cluster down", self.cluster_down))
            pool.shutdown(wait=False)
        return self._stopping

    def cluster_down(self) -> None:
        if (self.data_dir / "cluster.json").exists():
            self.run_logged(
                "cluster-down", _product("cluster", "down", "--data-dir", str(self.data_dir))
            )

    def workload(self) -> dict[str, Any]:
        argv = _product(
            "workload", "--data-dir", str(self.data_dir), "--messages", str(self.messages),
            "--scenario", "all", "--truth", str(self.truth), "--seed", str(self.seed),
        )  # fmt: skip
        out = self.run_logged("workload", argv, show_all=True, stdout=True)
        return last_json(out)

    def start_rabbit(self, why_not: str | None) -> None:
        """The RabbitMQ node and workload in the background (pipeline.demo_rabbit)."""
        if why_not is not None:
            self.say(f"   RabbitMQ: {why_not}; the demo goes on without it")
            return
        self.say(
            f"   RabbitMQ: a node under {self.rabbit_root} and its workload, in the background"
        )
        self.rabbit = RabbitSide(self.rabbit_root, self.rabbit_workload)
        self.rabbit.start()

    def rabbit_workload(self, amqp_url: str) -> dict[str, Any]:
        argv = _product(
            "rabbit-workload", "--amqp", amqp_url, "--data-dir", str(self.data_dir),
            "--truth", str(self.rabbit_truth), "--seed", str(self.seed),
        )  # fmt: skip
        return last_json(self.run_logged("rabbit-workload", argv, stdout=True))

    def repair_losses(self, dags: DagWorker) -> None:
        """The lost_after_ack losses of the master-crash cluster (started again meanwhile:
        pipeline.demo_lossy), sent again from its producer ledger's kept bodies
        (mq_loss_repair with that `cluster`, on the lake's rows of it); it stops after. The
        next mq_audit verifies what came back."""
        if not self.lossy.exists():
            self.say(f"   no {LOSSY_CLUSTER} cluster: nothing to repair")
            return
        try:
            self.lossy.wait_ready()
            conf = {"cluster": LOSSY_CLUSTER, "dry_run": False, "max_messages": 10000}
            self.dag_test(dags, "mq_loss_repair", {**conf, "messages_per_second": 500})
        finally:
            self.lossy.stop()

    # -- Airflow ----------------------------------------------------------------------------
    def airflow_env(self) -> dict[str, str]:
        import dags

        env = dict(os.environ)
        env.update(
            AIRFLOW_HOME=str(self.airflow_home),
            AIRFLOW__CORE__DAGS_FOLDER=str(Path(dags.__file__).parent),
            AIRFLOW__CORE__LOAD_EXAMPLES="False",
            AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{self.airflow_home / 'airflow.db'}",
            AIRFLOW_VAR_MQAUDIT_DATA_DIR=str(self.data_dir),
            # The workload's own clusters, audited by mq_audit into the same lake.
            AIRFLOW_VAR_MQAUDIT_DATA_DIRS=os.pathsep.join(
                map(str, other_clusters(load_json(self.truth), self.data_dir))
            ),
            AIRFLOW_VAR_MQAUDIT_LAKE=str(self.lake),
            AIRFLOW_VAR_MQAUDIT_REPORTS=str(self.reports),
            AIRFLOW_VAR_MQAUDIT_SPARK_SUBMIT="false",
            AIRFLOW_VAR_MQAUDIT_SPARK_CONF=json.dumps(SMALL_DATA_SPARK),
            PYSPARK_PYTHON=sys.executable,
        )
        env.update(airflow_vars(self.rabbit))  # RabbitMQ's node, or none
        # The name servers come from OUT/cluster/cluster.json; an outer setting must not win.
        env.pop("AIRFLOW_VAR_MQAUDIT_NAMESRV", None)
        env.pop("AIRFLOW_VAR_MQAUDIT_LEDGER_URL", None)
        env.pop("AIRFLOW_CONN_MQAUDIT_BROKER", None)
        return env

    def wait_dags(self, dags: DagWorker) -> None:
        """Until the DAG worker has migrated Airflow's database and parsed the DAGs."""
        answer = self.follow("airflow db", dags.log, lambda: dags.answer(dags.ready))
        if answer.get("state") != "ready":
            raise DemoError(f"the DAG worker failed ({answer}); see {dags.log}:\n{tail(dags.log)}")

    def dag_test(
        self,
        dags: DagWorker,
        dag_id: str,
        conf: dict[str, Any] | None = None,
        label: str | None = None,
    ) -> None:
        """A DAG run as `airflow dags test` makes it, in the demo's DAG worker."""
        # Whole seconds, rounded up: the run's interval ends after everything sent so far.
        when = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1)).replace(microsecond=0)
        name = label or (dag_id if conf is None or not conf.get("dry_run") else f"{dag_id}-dry-run")
        log = self.logs / f"{name}.log"
        done = dags.submit(dag_id, when, conf, self.airflow_env(), log)
        answer = self.follow(name, log, lambda: dags.answer(done))
        if answer.get("state") != "success":
            raise DemoError(f"{name} failed ({answer}); log {log}:\n{tail(log)}")

    # -- processes --------------------------------------------------------------------------
    def run_logged(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str] | None = None,
        show_all: bool = False,
        stdout: bool = False,
    ) -> str:
        """Run `argv` with its output in OUT/logs/<name>.log, showing progress lines as they
        come (task starts and ends, the jobs' own lines; every line with `show_all`).
        With `stdout` its standard output goes to <name>.stdout and is returned."""
        log_path = self.logs / f"{name}.log"
        out_path = self.logs / f"{name}.stdout"
        with contextlib.ExitStack() as files:
            log = files.enter_context(open(log_path, "wb"))
            out = files.enter_context(open(out_path, "wb")) if stdout else log
            proc = subprocess.Popen(argv, stdout=out, stderr=log, env=env)
        code = self.follow(name, log_path, proc.poll, show_all)
        if code != 0:
            raise DemoError(f"{name} failed (exit {code}); log {log_path}:\n{tail(log_path)}")
        return out_path.read_text(errors="replace") if stdout else ""

    def follow(self, name: str, log: Path, ended: Callable[[], T | None], every: bool = False) -> T:
        """Show `log`'s progress lines (`every` line) until `ended()` gives a result: it."""
        seen, last_beat = 0, time.monotonic()
        while (result := ended()) is None:
            seen = self._show(log, seen, every)
            if time.monotonic() - last_beat >= 20:
                last_beat = time.monotonic()
                self.say(f"   {name}: still running")
            time.sleep(0.5)
        self._show(log, seen, every)
        return result

    def _show(self, path: Path, start: int, show_all: bool) -> int:
        """Print the new complete lines of `path` worth showing; the offset read up to."""
        with contextlib.suppress(FileNotFoundError), open(path, "rb") as f:
            f.seek(start)
            data = f.read()
            end = data.rfind(b"\n") + 1
            for raw in data[:end].decode(errors="replace").splitlines():
                line = raw.rstrip()
                task = _TASK.search(line)
                if task is not None:
                    state = "started" if task.group(1) == "starting" else "done"
                    self.say(f"   task {task.group(2)} {state}")
                    if state == "done" and (then := self.after_task.pop(task.group(2), None)):
                        then()
                elif show_all or _SHOWN.match(line):
                    self.say(f"   {line[:200]}")
            return start + end
        return start


def tail(path: Path, lines: int = 25) -> str:
    with contextlib.suppress(FileNotFoundError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) + "\n"
    return ""


def last_json(text: str) -> dict[str, Any]:
    """The last line of `text` that is a JSON object ({} if none)."""
    for line in reversed(text.strip().splitlines()):
        with contextlib.suppress(ValueError):
            value = json.loads(line)
            if isinstance(value, dict):
                return value
    return {}
