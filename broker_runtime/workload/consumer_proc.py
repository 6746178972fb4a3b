"""A workload consumer process: `python -m broker_runtime.workload.consumer_proc SPEC.json`.

One push consumer of one topic with the consumer ledger on, behaving as its spec says:
hanging forever on some messages (never acked), failing some always or a number of times,
taking `delay_ms` per message, losing the acks of one queue past an offset, or handing
queues over on rebalance. Every delivery goes to its journal (`journal.py`). SIGTERM stops
it cleanly (offsets committed, group left), and so does the end of the workload that forked
it; SIGKILL is the crash the workload injects.
With `wait_signal` it loads, writes `ready` and starts consuming on SIGUSR1.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import multiprocessing
import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker_runtime.client.config import ClientConfig
from broker_runtime.client.consume_service import ConsumeContext
from broker_runtime.client.consumer_options import ConsumerOptions
from broker_runtime.client.handover import HandoverPushConsumer
from broker_runtime.client.ledger_hooks import ConsumerLedgerHooks
from broker_runtime.client.model import ConsumeFromWhere, ConsumeStatus, ReceivedMessage
from broker_runtime.client.push_consumer import PushConsumer
from broker_runtime.client.rebalance import MessageQueue
from broker_runtime.common import aio
from broker_runtime.common.constants import MAX_RECONSUME_TIMES
from broker_runtime.ledger.consumer import ConsumerLedger
from broker_runtime.workload.faults import LossyAckConsumer
from broker_runtime.workload.journal import JournalWriter

log = logging.getLogger(__name__)


@dataclass
class ConsumerSpec:
    namesrv: str
    group: str
    topic: str
    journal: str
    instance: str
    ledger_dir: str | None = None
    ledger_url: str | None = None
    handover: bool = False
    threads: int = 8
    hang: list[int] = field(default_factory=list)
    fail_always: list[int] = field(default_factory=list)
    fail_times: dict[str, int] = field(default_factory=dict)  # index -> failing deliveries
    delay_ms: float = 0.0
    retry_delay_level: int = 0
    max_reconsume: int = MAX_RECONSUME_TIMES
    lose_acks: list[Any] | None = None  # [topic, broker, queue id, offset]: acks past it lost
    wait_signal: bool = False
    poll_namesrv_s: float = 30.0
    persist_interval_s: float = 0.5
    rebalance_interval_s: float = 20.0
    pull_threshold_for_queue: int = 1000
    suspend_ms: int = 15_000  # how long a pull waits at the broker for new messages
    expression: str = "*"  # the subscription: tags, or SQL92 with expression_type "SQL92"
    expression_type: str = "TAG"

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(dataclasses.asdict(self)))

    @classmethod
    def load(cls, path: Path) -> ConsumerSpec:
        return cls(**json.loads(path.read_text()))


def message_index(body: bytes) -> int:
    """The workload's index of a message: its body is `run:scenario:index:padding`."""
    try:
        return int(body.split(b":", 3)[2])
    except (IndexError, ValueError):
        return -1


def build(spec: ConsumerSpec, journal: JournalWriter) -> PushConsumer:
    hang, fail_always = set(spec.hang), set(spec.fail_always)
    fail_times = {int(k): v for k, v in spec.fail_times.items()}
    seq = iter(range(1 << 62))

    async def listener(msgs: list[ReceivedMessage], ctx: ConsumeContext) -> ConsumeStatus:
        status = ConsumeStatus.CONSUME_SUCCESS
        ids = []
        for m in msgs:
            i, d = message_index(m.body), next(seq)
            ids.append(d)
            journal.write(
                "recv", d=d, i=i, id=m.msg_id, t=ctx.mq.topic, b=ctx.mq.broker,
                q=ctx.mq.queue_id, o=m.queue_offset, r=m.reconsume_times,
            )  # fmt: skip
            if i in hang:
                await asyncio.Event().wait()  # never acked: the process gets killed here
            if spec.delay_ms:
                await asyncio.sleep(spec.delay_ms / 1000)
            if i in fail_always or m.reconsume_times < fail_times.get(i, 0):
                status = ConsumeStatus.RECONSUME_LATER
        if status is not ConsumeStatus.CONSUME_SUCCESS:
            ctx.delay_level_when_next_consume = spec.retry_delay_level
        outcome = "CONSUMED" if status is ConsumeStatus.CONSUME_SUCCESS else "RECONSUME_LATER"
        for d in ids:
            journal.write("done", d=d, out=outcome)
        return status

    config = ClientConfig(
        spec.namesrv,
        instance_name=spec.instance,
        persist_offset_interval_s=spec.persist_interval_s,
        poll_name_server_interval_s=spec.poll_namesrv_s,
    )
    options = ConsumerOptions(
        consume_from=ConsumeFromWhere.FIRST_OFFSET,
        rebalance_interval_s=spec.rebalance_interval_s,
        suspend_ms=spec.suspend_ms,
    )
    common: dict[str, Any] = {
        "threads": spec.threads,
        "max_reconsume_times": spec.max_reconsume,
        "pull_threshold_for_queue": spec.pull_threshold_for_queue,
    }
    consumer: PushConsumer
    if spec.handover:
        consumer = HandoverPushConsumer(config, spec.group, listener, options, **common)
    elif spec.lose_acks:
        topic, broker, qid, offset = spec.lose_acks
        lossy = MessageQueue(str(topic), str(broker), int(qid))
        consumer = LossyAckConsumer(config, spec.group, listener, options, **common)
        consumer.lose_acks(lossy, int(offset), lambda o: journal.write("ack_lost", q=list(
            (lossy.topic, lossy.broker, lossy.queue_id)), o=o))  # fmt: skip
    else:
        consumer = PushConsumer(config, spec.group, listener, options, **common)
    consumer.subscribe(spec.topic, spec.expression, spec.expression_type)
    return consumer


def _stop_when_parent_ends(loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> None:
    """A consumer forked by the workload stops cleanly when the workload ends, however it
    ends: killed (SIGKILL), it left its consumers running, holding their queues. The
    workload's end closes the pipe multiprocessing gives the child as its parent's sentinel,
    which then reads as end of file. A consumer started on its own has no such parent."""
    parent = multiprocessing.parent_process()
    if parent is None or parent.sentinel is None:
        return
    sentinel = parent.sentinel

    def parent_ended() -> None:
        loop.remove_reader(sentinel)  # readable from now on: once is enough
        log.warning("the workload that started this consumer has ended: stopping")
        stop.set()

    loop.add_reader(sentinel, parent_ended)


async def run(spec: ConsumerSpec) -> None:
    journal = JournalWriter(Path(spec.journal))
    consumer = build(spec, journal)
    ledger = ConsumerLedger.open(
        Path(spec.ledger_dir) if spec.ledger_dir else None, spec.ledger_url
    )
    hooks = ConsumerLedgerHooks(ledger, spec.group, consumer.client_id).attach(consumer)
    loop = asyncio.get_running_loop()
    stop, go = asyncio.Event(), asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, go.set)
    _stop_when_parent_ends(loop, stop)
    if spec.wait_signal:
        journal.write("ready")
        waiter = loop.create_task(go.wait())
        await asyncio.wait([waiter, loop.create_task(stop.wait())], return_when="FIRST_COMPLETED")
        if stop.is_set():
            journal.write("stop")
            return
    journal.write("start", client=consumer.client_id)
    await consumer.start()
    owned: set[MessageQueue] = set()
    while not stop.is_set():
        now = {mq for mq in consumer.pq_table if mq.topic == spec.topic}
        if now != owned:
            owned = now
            journal.write("owns", q=[[mq.topic, mq.broker, mq.queue_id] for mq in sorted(now)])
        try:
            await asyncio.wait_for(stop.wait(), 0.05)
        except TimeoutError:
            pass
    await consumer.shutdown(grace_s=5.0)
    hooks.close()
    journal.write("stop")
    journal.close()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m broker_runtime.workload.consumer_proc SPEC.json", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    aio.run(run(ConsumerSpec.load(Path(args[0]))))
    return 0


def forked(spec_path: str, log_path: str) -> None:
    """A consumer forked by the workload (its harness's fork server): output to `log_path`
    (appended), then `main`; the process's exit code is main's."""
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for fd in (1, 2):
        os.dup2(log, fd)
    os.close(log)
    sys.exit(main([spec_path]))


if __name__ == "__main__":
    sys.exit(main())
