"""What the scenarios share: the run's directories, clusters through the CLI, topics,
producing with the ledger on, consumer processes and waiting on their journals."""

from __future__ import annotations

import asyncio
import functools
import multiprocessing
import os
import shutil
import signal
import time
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.context import ForkServerContext
from pathlib import Path
from typing import Any

from broker_runtime.client.admin import MQAdmin
from broker_runtime.client.config import ClientConfig
from broker_runtime.client.ledger_hooks import ProducerLedgerHooks
from broker_runtime.client.model import new_message
from broker_runtime.client.msg_id import set_uniq_id
from broker_runtime.client.producer import Producer
from broker_runtime.cluster import supervisor
from broker_runtime.cluster.layout import CLUSTER_FILE, ClusterLayout
from broker_runtime.cluster.probe import broker_info
from broker_runtime.common.message import UNIQ_KEY
from broker_runtime.ledger.producer import ProducerLedger, ResendBackoff
from broker_runtime.workload import consumer_proc
from broker_runtime.workload.consumer_proc import ConsumerSpec
from broker_runtime.workload.faults import LostResponses
from broker_runtime.workload.journal import JournalReader, JournalState

Position = tuple[str, str, int, int]  # topic, broker, queue id, queue offset
BODY_PAD = 96
# An unanswered send's stub is due for a resend a second later: the first audit after the
# workload must see it (the default first wait, 60 s, can outlast the demo's first audit).
RESEND_AFTER = ResendBackoff(first_ms=1_000)
# Broker settings of the clusters scenarios start: fast registration and HA, small files.
SCENARIO_BROKER_SETTINGS: dict[str, str] = {
    "register_interval_ms": "1000",
    "client_scan_interval_ms": "1000",
    "offset_persist_interval_ms": "1000",
    "offset_history_interval_ms": "1000",  # the audit's lag over time
    "slave_sync_interval_ms": "1000",
    "ha_heartbeat_interval_ms": "1000",
    "ha_housekeeping_ms": "5000",
    "ha_reconnect_ms": "200",
    "store.cq_entries_per_file": "16384",
    "store.index_hash_slots": "16384",
    "store.index_max_entries": "65536",
}


class WorkloadError(RuntimeError):
    """A scenario could not be carried out; the message says which step and why."""


@dataclass
class Sent:
    """One message the workload sent, and every place it knows the message was stored."""

    index: int
    msg_id: str
    status: str | None = None  # SEND_OK, SLAVE_NOT_AVAILABLE, ...; None: the send failed
    error: str | None = None
    position: Position | None = None  # where the answered attempt stored it
    offset_msg_id: str | None = None
    copies: list[Position] = field(default_factory=list)  # positions known to hold it

    @property
    def acked(self) -> bool:
        return self.status == "SEND_OK"


@functools.cache
def _forks() -> ForkServerContext:
    """Where consumer processes come from: multiprocessing's fork server, one process that
    has imported the consumer's modules and forks a child per consumer. A new interpreter
    for each imported them again (0.6 CPU s; a workload starts about twenty consumers)."""
    forks = multiprocessing.get_context("forkserver")
    forks.set_forkserver_preload([consumer_proc.__name__])
    return forks


class ConsumerProc:
    """A consumer process of the workload (`consumer_proc.main` with its spec, its output
    in its log) and its journal."""

    def __init__(
        self, scenario: str, name: str, spec: ConsumerSpec, spec_path: Path, log_path: Path
    ) -> None:
        self.scenario = scenario
        self.name = name
        self.spec = spec
        spec.save(spec_path)
        self.proc = _forks().Process(
            target=consumer_proc.forked, args=(str(spec_path), str(log_path)), name=name
        )
        self.proc.start()
        self.journal = JournalReader(Path(spec.journal))

    @property
    def state(self) -> JournalState:
        return self.journal.poll()

    @property
    def exitcode(self) -> int | None:
        """None while it runs; -N after signal N."""
        return self.proc.exitcode

    def alive(self) -> bool:
        return self.proc.is_alive()

    def signal_start(self) -> None:
        assert self.proc.pid is not None
        os.kill(self.proc.pid, signal.SIGUSR1)

    def kill_now(self) -> None:
        """SIGKILL and wait (on this thread)."""
        if self.alive():
            self.proc.kill()
        self.proc.join()

    async def kill(self) -> None:
        """SIGKILL: the crash."""
        if self.alive():
            self.proc.kill()
        await self.wait()

    async def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM and wait for a clean stop (offsets committed); SIGKILL if it hangs."""
        if self.alive():
            self.proc.terminate()
            await asyncio.to_thread(self.proc.join, timeout_s)
            if self.alive():
                self.proc.kill()
        await self.wait()

    async def wait(self) -> None:
        """Until the process has exited (off the event loop: other scenarios go on)."""
        await asyncio.to_thread(self.proc.join)
        self.journal.poll()


class Harness:
    def __init__(
        self,
        data_dir: Path,
        run_id: str,
        ledger_url: str | None,
        say: Callable[[str], None],
    ) -> None:
        self.data_dir = data_dir.resolve()
        self.run_id = run_id
        self.ledger_url = ledger_url
        self.say = say
        self.work_dir = self.data_dir / "workload" / run_id  # journals, specs, consumer logs
        self.procs: list[ConsumerProc] = []

    # -- clusters -------------------------------------------------------------------------------
    def main_layout(self) -> ClusterLayout:
        if not (self.data_dir / CLUSTER_FILE).exists():
            raise WorkloadError(f"{self.data_dir} has no {CLUSTER_FILE}: start a cluster first")
        layout = ClusterLayout.load(self.data_dir)
        down = [n.name for n in layout.nodes if not supervisor.process_alive(n)]
        if down:
            raise WorkloadError(f"the cluster in {self.data_dir} has nodes down: {down}")
        self.work_dir.mkdir(parents=True, exist_ok=True)
        return layout

    @staticmethod
    def layout_of(root: Path) -> ClusterLayout:
        return ClusterLayout.load(root)

    def ledger_dir(self, cluster_dir: Path) -> Path | None:
        """Ledgers of a cluster's clients go under its data dir (unless a URL is given)."""
        return None if self.ledger_url else cluster_dir

    def cluster_up(self, name: str, **settings: Any) -> ClusterLayout:
        """A fresh cluster of its own, named `name` (its brokers' brokerClusterName, so that
        one lake audits it beside the main cluster), for scenario `name` in
        DIR/scenarios/<name>/, as
        `mqaudit cluster up` starts it (`settings`: ClusterSettings fields; broker settings
        over SCENARIO_BROKER_SETTINGS). Its nodes are this process's children, so that
        `cluster_down` reaps them (a `cluster down` in another process would wait out its
        grace on every node restarted here: an exited child stays until its parent reaps it)."""
        root = self.data_dir / "scenarios" / name
        if (root / CLUSTER_FILE).exists():  # a run before this one left it
            supervisor.down(ClusterLayout.load(root), 5.0)
        shutil.rmtree(root, ignore_errors=True)
        broker = {**SCENARIO_BROKER_SETTINGS, **settings.pop("broker_settings", {})}
        self.say(f"{name}: starting its own cluster in {root}")
        try:
            return supervisor.up(
                supervisor.ClusterSettings(
                    data_dir=root, broker_settings=broker, cluster_name=name, **settings
                )
            )
        except supervisor.ClusterError as e:
            raise WorkloadError(f"{name}: its cluster did not come up: {e}") from e

    def cluster_down(self, root: Path) -> None:
        supervisor.down(ClusterLayout.load(root), 10.0)

    def start_nodes(self, root: Path, *names: str) -> None:
        """Start stopped nodes of the cluster in `root` again, side by side, on their ports
        (as `mqaudit cluster start-node`); waits until they answer. One layout object for
        all: each start saves it, with every pid known so far."""
        layout = ClusterLayout.load(root)
        with ThreadPoolExecutor(len(names)) as pool:
            futures = [
                pool.submit(supervisor.start_node, layout, layout.node(n), None, 60.0)
                for n in names
            ]
            try:
                for f in futures:
                    f.result()
            except supervisor.ClusterError as e:
                raise WorkloadError(str(e)) from e

    def stop_node(self, root: Path, name: str, kill: bool = False) -> None:
        """SIGTERM and wait (a clean stop), or SIGKILL at once: `mqaudit cluster stop-node`."""
        layout = ClusterLayout.load(root)
        node = layout.node(name)
        if kill:
            supervisor.signal_node(node, signal.SIGKILL)
            node.pid = None
            layout.save()
        else:
            supervisor.stop_nodes(layout, [node], 20.0)

    @staticmethod
    async def runtime(addr: str) -> dict[str, str]:
        """GET_BROKER_RUNTIME_INFO of a broker node."""
        info = await asyncio.to_thread(broker_info, addr, 3.0)
        if info is None:
            raise WorkloadError(f"broker {addr} does not answer")
        return info

    # -- topics and producing -------------------------------------------------------------------
    async def create_topic(
        self, namesrv: str, topic: str, queues: int = 4, brokers: list[str] | None = None
    ) -> None:
        """Create `topic` and wait until every name server routes it to those brokers."""
        async with MQAdmin(namesrv) as admin:
            chosen = await admin.topic_create(topic, queues, brokers)
        for ns in namesrv.split(";"):
            await self.wait_route(ns, topic, set(chosen))

    async def wait_route(self, ns: str, topic: str, brokers: set[str], timeout: float = 30) -> None:
        async with MQAdmin(ClientConfig(ns)) as admin:
            deadline = time.monotonic() + timeout
            while True:
                route = await admin.api.get_route(topic)
                routed = {q.broker_name for q in route.queue_datas} if route else set()
                if brokers <= routed:
                    return
                if time.monotonic() > deadline:
                    raise WorkloadError(f"{topic} not routed to {sorted(brokers)} by {ns}")
                await asyncio.sleep(0.1)

    def body(self, scenario: str, index: int) -> bytes:
        head = f"{self.run_id}:{scenario}:{index}:".encode()
        return head + b"." * max(0, BODY_PAD - len(head))

    async def produce(
        self,
        namesrv: str,
        topic: str,
        scenario: str,
        indexes: Sequence[int],
        ledger_dir: Path | None,
        *,
        lose_response_of: Collection[int] = (),
        unreachable: Collection[int] = (),
        concurrency: int = 32,
    ) -> list[Sent]:
        """Send one message per index, the producer ledger on; failed sends are recorded.

        The answers to the first attempt of `lose_response_of` are dropped, and no request
        for `unreachable` ones reaches the broker (faults.py).
        """
        msgs = {}
        for i in indexes:
            msg = new_message(topic, self.body(scenario, i), keys=f"{scenario}-{i}")
            set_uniq_id(msg)
            msgs[i] = msg
        lost = LostResponses(
            {msgs[i].properties[UNIQ_KEY] for i in lose_response_of},
            {msgs[i].properties[UNIQ_KEY] for i in unreachable},
        )
        producer = Producer(ClientConfig(namesrv), f"wl-{scenario}")
        ledger = ProducerLedger.open(ledger_dir, self.ledger_url, backoff=RESEND_AFTER)
        hooks = ProducerLedgerHooks(ledger, keep_bodies=True)  # what a repair sends again
        hooks.attach(producer)
        await producer.start()
        lost.install(producer)
        sem = asyncio.Semaphore(concurrency)
        out: list[Sent] = []

        async def one(i: int) -> None:
            msg = msgs[i]
            async with sem:
                try:
                    r = await producer.send(msg)
                except Exception as e:
                    out.append(Sent(i, msg.properties[UNIQ_KEY], error=str(e)))
                    return
            pos = (r.mq.topic, r.mq.broker, r.mq.queue_id, r.queue_offset)
            out.append(Sent(i, r.msg_id, r.status.value, None, pos, r.offset_msg_id, [pos]))

        try:
            await asyncio.gather(*(one(i) for i in indexes))
        finally:
            await producer.shutdown()
            hooks.close()
        by_id = {s.msg_id: s for s in out}
        for msg_id, r in lost.dropped.items():  # stored by an attempt whose answer was lost
            by_id[msg_id].copies.insert(0, (r.mq.topic, r.mq.broker, r.mq.queue_id, r.queue_offset))
        return sorted(out, key=lambda s: s.index)

    # -- consumers ------------------------------------------------------------------------------
    def consumer(self, scenario: str, name: str, **spec: Any) -> ConsumerProc:
        base = self.work_dir / scenario
        base.mkdir(parents=True, exist_ok=True)
        full = ConsumerSpec(journal=str(base / f"{name}.jsonl"), **spec)
        proc = ConsumerProc(scenario, name, full, base / f"{name}.spec.json", base / f"{name}.log")
        self.procs.append(proc)
        return proc

    def cleanup(self, scenario: str | None = None) -> None:
        """Kill consumer processes still running (of a scenario that failed half-way)."""
        for p in self.procs:
            if p.alive() and scenario in (None, p.scenario):
                p.kill_now()

    async def release(self, proc: ConsumerProc, timeout: float = 30) -> None:
        """Start a consumer spawned with `wait_signal` once it has loaded (spawned ahead, its
        process start overlaps the steps before it joins)."""
        await self.until(lambda: proc.state.ready, timeout, f"{proc.name} to load", [proc])
        proc.signal_start()

    async def until(
        self,
        cond: Callable[[], bool],
        timeout: float,
        what: str,
        procs: Sequence[ConsumerProc] = (),
    ) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            for p in procs:
                if not p.alive():
                    raise WorkloadError(f"{p.name} exited ({p.exitcode}) before {what}")
            if time.monotonic() > deadline:
                raise WorkloadError(f"timed out after {timeout:g} s waiting for {what}")
            await asyncio.sleep(0.05)
