"""Transactional messages (seed 003, 事务消息) and how they go wrong, on a cluster of its own
whose check-back runs every second (timeout 3 s, CHECK_MAX checks).

A transaction producer sends every message as a transaction, each ending by its role
(plan.TX_ROLES; the others commit at once): rolled back; UNKNOW, then decided by the
check-back (commit or rollback); UNKNOW with a checker that answers UNKNOW every time (after
CHECK_MAX checks the broker moves it to TRANS_CHECK_MAX_TIME_TOPIC: `check_gave_up`); rolled
back, then sent again outside the transaction with the same UNIQ_KEY (`rolled_back_but_
delivered`); committed with END_TRANSACTION arriving twice (`committed_twice`, and so stored
and delivered twice). A consumer group takes the topic; once it has everything, its consumer
stops for good and more transactions commit (`committed_never_consumed`). Meanwhile (from
the start) a producer of another group dies between its half message and END_TRANSACTION,
and none of its group comes back: as RocketMQ's, the check-back still counts a check with
no producer to ask, so after CHECK_MAX of them the broker gives it up too (`check_gave_up`).
A half message is `half_stuck` only while its checks still run past the audit's bound
(RocketMQ's defaults: 15 checks a minute apart), which this scenario's fast check-back never
leaves it; the audit's unit tests cover that kind on a store written for it.

Beside them, on a topic of their own, SQL92 filter consumers get messages with properties,
two groups of them with a second instance deployed with a stale tag subscription
(`filtered_wrongly`; scenarios/sql_filters.py, and their truth workload/filters.py).

A check-back that races an END_TRANSACTION commit (its answer commits the re-appended half
too) is counted from the listener's answers: the truth then has that transaction committed
twice, as the store does.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

from broker_runtime.client.admin import MQAdmin
from broker_runtime.client.config import ClientConfig
from broker_runtime.client.model import ReceivedMessage, SendStatus, new_message
from broker_runtime.client.msg_id import set_uniq_id
from broker_runtime.client.producer import Producer
from broker_runtime.client.transaction_producer import LocalTransactionState as S
from broker_runtime.client.transaction_producer import TransactionProducer
from broker_runtime.common import findings as K
from broker_runtime.common.message import UNIQ_KEY, Message
from broker_runtime.common.topics import TRANS_CHECK_MAX_TIME_TOPIC
from broker_runtime.workload import filters
from broker_runtime.workload.consumer_proc import message_index
from broker_runtime.workload.harness import ConsumerProc, WorkloadError
from broker_runtime.workload.scenarios import sql_filters
from broker_runtime.workload.scenarios.common import Ctx, delivery_stats, group_findings
from broker_runtime.workload.truth import Finding, finding, stored_twice_findings

CHECK_MAX = 3
BROKER_SETTINGS = {
    "transaction_timeout_ms": "3000",
    "transaction_check_interval_ms": "1000",
    "transaction_check_max": str(CHECK_MAX),
    "enable_property_filter": "true",  # the SQL92 filter consumers
}
# role -> (what the local transaction returns, what the check-back is answered)
ANSWERS: dict[str, tuple[S, S]] = {
    "commit": (S.COMMIT_MESSAGE, S.COMMIT_MESSAGE),
    "committed_twice": (S.COMMIT_MESSAGE, S.COMMIT_MESSAGE),
    "late": (S.COMMIT_MESSAGE, S.COMMIT_MESSAGE),
    "rollback": (S.ROLLBACK_MESSAGE, S.ROLLBACK_MESSAGE),
    "rolled_back_delivered": (S.ROLLBACK_MESSAGE, S.ROLLBACK_MESSAGE),
    "check_commit": (S.UNKNOW, S.COMMIT_MESSAGE),
    "check_rollback": (S.UNKNOW, S.ROLLBACK_MESSAGE),
    "gave_up": (S.UNKNOW, S.UNKNOW),
}


class Listener:
    """Answers by role; counts the check-backs answered COMMIT (each commits a half unit)."""

    def __init__(self, roles: dict[int, str]) -> None:
        self.roles = roles
        self.checks: Counter[int] = Counter()
        self.check_commits: Counter[int] = Counter()

    def role(self, i: int) -> str:
        return self.roles.get(i, "commit")

    def base_commits(self, i: int) -> int:
        """Committed units END_TRANSACTION writes (the check-back's commits come on top)."""
        return {"commit": 1, "late": 1, "committed_twice": 2}.get(self.role(i), 0)

    def commits(self, i: int) -> int:
        return self.base_commits(i) + self.check_commits[i]

    def deliveries_due(self, i: int) -> int:
        """Copies of message i the consumer gets: each committed unit, or the copy sent
        outside the transaction; one at least where the check-back is to commit it."""
        if self.role(i) == "rolled_back_delivered":
            return 1
        return max(self.commits(i), int(self.role(i) == "check_commit"))

    def execute(self, msg: Message, arg: object) -> S:
        return ANSWERS[self.role(message_index(msg.body))][0]

    def check(self, msg: ReceivedMessage) -> S:
        i = message_index(msg.msg.body)
        self.checks[i] += 1
        answer = ANSWERS[self.role(i)][1]
        if answer is S.COMMIT_MESSAGE:
            self.check_commits[i] += 1
        return answer


class Abandoned:
    """A local transaction that never returns: its producer dies before END_TRANSACTION."""

    def __init__(self) -> None:
        self.stored = asyncio.Event()
        self.msg_id = ""

    async def execute(self, msg: Message, arg: object) -> S:
        self.msg_id = msg.properties[UNIQ_KEY]
        self.stored.set()
        await asyncio.Event().wait()  # cancelled with the producer
        return S.UNKNOW

    def check(self, msg: ReceivedMessage) -> S:
        return S.UNKNOW


def _message(c: Ctx, i: int) -> Message:
    msg = new_message(c.topic, c.h.body(c.name, i), keys=f"{c.name}-{i}")
    set_uniq_id(msg)
    return msg


async def _in_topic(c: Ctx, topic: str, msg_ids: list[str], what: str) -> None:
    """Until every message is found in `topic` by its UNIQ_KEY (the broker's index)."""
    deadline = time.monotonic() + c.patience(60)
    left = set(msg_ids)
    async with MQAdmin(c.namesrv) as admin:
        while left:
            for mid in sorted(left):
                try:
                    if await admin.query_by_key(topic, mid):
                        left.discard(mid)
                except Exception:
                    pass  # not routed yet
            if left and time.monotonic() > deadline:
                raise WorkloadError(f"{c.name}: {len(left)} {what} not in {topic}")
            await asyncio.sleep(0.3)


async def transactions(c: Ctx) -> dict[str, Any]:
    h, m, p = c.h, c.plan.messages, c.plan.params
    roles = {int(i): role for role, idx in p.items() for i in idx}
    listener = Listener(roles)
    group = c.group()
    await h.create_topic(c.namesrv, c.topic)
    # Given up only after the broker's timeout and its checks: under way from the start.
    abandoning = asyncio.create_task(_abandon(c, p["abandoned"]))
    fr = await sql_filters.start(c)
    filtering = asyncio.create_task(sql_filters.run(c, fr))
    a = c.consumer("a", group)
    tp = TransactionProducer(ClientConfig(c.namesrv), c.group("-tx"), listener)
    plain = Producer(ClientConfig(c.namesrv), c.group("-plain"))
    await tp.start()
    await plain.start()
    ids: dict[int, str] = {}

    async def one(i: int) -> None:
        r = await tp.send_in_transaction(_message(c, i))
        if r.send.status is not SendStatus.SEND_OK:
            raise WorkloadError(f"{c.name}: half message {i}: {r.send.status.value}")
        ids[i] = r.send.msg_id
        if listener.role(i) == "committed_twice":
            await tp.end(r.send, S.COMMIT_MESSAGE)  # the same END_TRANSACTION once more
        elif listener.role(i) == "rolled_back_delivered":
            again = new_message(c.topic, c.h.body(c.name, i), keys=f"{c.name}-{i}")
            again.properties[UNIQ_KEY] = r.send.msg_id
            await plain.send(again)

    try:
        try:
            now = [i for i in range(m) if listener.role(i) not in ("late", "abandoned")]
            await asyncio.gather(*(one(i) for i in now))

            def all_delivered() -> bool:
                got = Counter(d.index for d in a.state.deliveries)
                return all(got[i] >= listener.deliveries_due(i) for i in now)

            await h.until(all_delivered, c.patience(90), "every committed copy to be consumed", [a])
            gave_up = [ids[i] for i in p["gave_up"]]
            await _in_topic(c, TRANS_CHECK_MAX_TIME_TOPIC, gave_up, "given-up transactions")
            await h.until(
                lambda: all(listener.checks[i] for i in p["check_rollback"]), c.patience(60),
                "the check-back of the transactions it rolls back",
            )  # fmt: skip
            await a.stop()
            h.say(f"{c.name}: consumer stopped; {len(p['late'])} more transactions commit")
            await asyncio.gather(*(one(i) for i in p["late"]))
            await _in_topic(c, c.topic, [ids[i] for i in p["late"]], "late commits")
        finally:
            await tp.shutdown()
            await plain.shutdown()
        abandoned = await abandoning
        await _in_topic(c, TRANS_CHECK_MAX_TIME_TOPIC, abandoned, "abandoned transactions given up")
        await filtering
    finally:
        for task in (abandoning, filtering):  # a failure above: they stop with the scenario
            task.cancel()
        await asyncio.gather(abandoning, filtering, return_exceptions=True)
    return _result(c, group, a, listener, ids, abandoned, fr)


async def _abandon(c: Ctx, indexes: list[int]) -> list[str]:
    """Half messages whose producer is shut down before END_TRANSACTION; their UNIQ_KEYs."""
    out = []
    for i in indexes:
        local = Abandoned()
        tp = TransactionProducer(ClientConfig(c.namesrv), c.group("-gone"), local)
        await tp.start()
        task = asyncio.create_task(tp.send_in_transaction(_message(c, i)))
        try:
            await asyncio.wait_for(local.stored.wait(), c.patience(30))
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await tp.shutdown()
        out.append(local.msg_id)
    return out


def _result(
    c: Ctx,
    group: str,
    a: ConsumerProc,
    listener: Listener,
    ids: dict[int, str],
    abandoned: list[str],
    fr: sql_filters.FilterRun,
) -> dict[str, Any]:
    p, topic = c.plan.params, c.topic
    found: list[Finding] = [
        finding(K.CHECK_GAVE_UP, mid, None, CHECK_MAX, topic, K.TRANSACTION_CHECK_MAX)
        for mid in [*(ids[i] for i in p["gave_up"]), *abandoned]
    ]
    for i, mid in sorted(ids.items()):
        n = listener.commits(i)
        if n >= 2:
            repeated = n == listener.base_commits(i)
            cause = K.END_TRANSACTION_REPEATED if repeated else K.COMMIT_OF_RECHECKED_HALF
            found.append(finding(K.COMMITTED_TWICE, mid, None, n, topic, cause))
    got = Counter(d.msg_id for d in a.state.deliveries)
    found += [
        finding(K.ROLLED_BACK_BUT_DELIVERED, ids[i], group, got[ids[i]], topic,
                K.SENT_OUTSIDE_TRANSACTION)
        for i in p["rolled_back_delivered"]
    ]  # fmt: skip
    found += [
        finding(K.COMMITTED_NEVER_CONSUMED, ids[i], group, 1, topic, K.OFFSET_NOT_REACHED)
        for i in p["late"]
    ]
    positions: dict[str, list[tuple[str, str, int, int]]] = {}
    for d in a.state.deliveries:
        positions.setdefault(d.msg_id, []).append(d.position)
    found += stored_twice_findings(positions, topic) + group_findings(group, topic, [a])
    found += sql_filters.findings(fr)
    injected = {
        "fault": "transactions ended every way a producer and a network can end them",
        "roles": {role: list(idx) for role, idx in p.items()},
        "check_max": CHECK_MAX,
        "checks": {str(i): n for i, n in sorted(listener.checks.items())},
        "sql_filters": filters.described(fr.groups(), fr.sent),
    }
    stats = delivery_stats([a], found)
    stats["transactions"] = len(ids) + len(abandoned)
    stats["filter_consumers"] = delivery_stats(fr.all_procs(), [])["consumers"]
    return c.result(
        "Transactions: committed, rolled back, decided by the check-back, given up by it, "
        "rolled back but sent again outside, committed twice, committed while the group's "
        "consumer was gone, and abandoned by a producer that died before ending it; beside "
        "them SQL92 filter consumers, two groups with a stale second instance.",
        [group, *fr.procs], injected, found, stats,
    )  # fmt: skip
