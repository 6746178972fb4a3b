"""Which scenarios run with how many messages, and where each fault lands: pure, by seed.

`--messages N` is the run's total: it is split evenly across the scenarios run (the first
ones get the remainder). Each scenario draws its fault positions from its own generator,
seeded by the run's seed and the scenario's name, so that a scenario's plan does not depend
on which other scenarios run. The two rebalance scenarios share their draw, so that the
lock on and the lock off are compared on the same workload.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

CONSUMER_CRASH = "consumer_crash_unacked"
ACK_LOST = "ack_lost"
PRODUCER_RESEND = "producer_resend"
NAMESRV_SPLIT = "namesrv_split"
CONSUMER_FAILURES = "consumer_failures"
MASTER_CRASH_ASYNC = "master_crash_async"
MASTER_CRASH_SYNC = "master_crash_sync"
REBALANCE_LOCK_OFF = "rebalance_lock_off"
REBALANCE_LOCK_ON = "rebalance_lock_on"
TRANSACTIONS = "transactions"

SCENARIOS: tuple[str, ...] = (
    CONSUMER_CRASH,
    ACK_LOST,
    PRODUCER_RESEND,
    NAMESRV_SPLIT,
    CONSUMER_FAILURES,
    REBALANCE_LOCK_OFF,
    REBALANCE_LOCK_ON,
    MASTER_CRASH_ASYNC,
    MASTER_CRASH_SYNC,
    TRANSACTIONS,
)
MIN_MESSAGES = 24  # per scenario: enough for every queue to get some and faults to land

DEFAULT_MAX_RECONSUME = 3
DEFAULT_RETRY_DELAY_LEVEL = 1  # 1 s (the first level), asked for by the listener

# How each transaction of the transactions scenario ends, and how many of each (the rest
# commit at once). See broker_runtime.workload.scenarios.transactions.
TX_ROLES: dict[str, int] = {
    "abandoned": 1,  # its producer is gone before END_TRANSACTION; no producer of the group left
    "gave_up": 1,  # UNKNOW, and the check-back is answered UNKNOW every time
    "rollback": 2,
    "check_commit": 2,  # UNKNOW, then the check-back is answered COMMIT
    "check_rollback": 1,  # UNKNOW, then ROLLBACK
    "rolled_back_delivered": 1,  # rolled back, then sent again outside the transaction
    "committed_twice": 1,  # END_TRANSACTION commit sent twice
    "late": 2,  # committed while the group's consumer is down, which never comes back
}


@dataclass(frozen=True)
class ScenarioPlan:
    name: str
    messages: int
    params: dict[str, Any] = field(default_factory=dict)


def resolve(scenario: str) -> list[str]:
    """`all`, a name, or names separated by commas -> the scenarios to run, in run order."""
    if scenario == "all":
        return list(SCENARIOS)
    names = {n.strip() for n in scenario.split(",") if n.strip()}
    unknown = sorted(names - set(SCENARIOS))
    if unknown or not names:
        raise ValueError(
            f"unknown scenario {', '.join(unknown) or repr(scenario)}: "
            f"use all, or names from {', '.join(SCENARIOS)}"
        )
    return [n for n in SCENARIOS if n in names]


def split_messages(total: int, names: list[str]) -> dict[str, int]:
    if not names:
        raise ValueError("no scenario to run")
    each, rest = divmod(total, len(names))
    if each < MIN_MESSAGES:
        raise ValueError(
            f"--messages {total} gives {each} per scenario for {len(names)} scenario(s); "
            f"each needs at least {MIN_MESSAGES}"
        )
    return {n: each + (1 if i < rest else 0) for i, n in enumerate(names)}


def _rng(seed: int, key: str) -> random.Random:
    return random.Random(f"{seed}:{key}")  # str seeds hash with sha512: the same everywhere


def _some(rng: random.Random, population: range, fraction: float, at_least: int = 1) -> list[int]:
    k = min(len(population), max(at_least, round(len(population) * fraction)))
    return sorted(rng.sample(population, k))


def plan_scenario(name: str, messages: int, seed: int) -> ScenarioPlan:
    m = messages
    rng = _rng(seed, name)
    params: dict[str, Any]
    if name == CONSUMER_CRASH:
        # The message the first consumer never finishes: its queue's offset stops there.
        params = {"hold_index": rng.randrange(m // 4, m // 2)}
    elif name == ACK_LOST:
        # From this message on, the acks (offset commits) of its queue never arrive.
        params = {"ack_lost_from_index": rng.randrange(m // 4, m // 2)}
    elif name == PRODUCER_RESEND:
        lost = _some(rng, range(m), 0.03)
        rest = sorted(set(range(m)) - set(lost))
        # The answers to `lost_responses` are lost (stored twice); `unreachable` never
        # reach the broker (their stubs stay UNCONFIRMED, for the resend job).
        params = {"lost_responses": lost, "unreachable": sorted(rng.sample(rest, len(lost)))}
    elif name == NAMESRV_SPLIT:
        params = {}
    elif name == CONSUMER_FAILURES:
        chosen = rng.sample(range(m), max(2, round(m * 0.08)))
        cut = max(1, len(chosen) // 3)
        params = {
            "permanent": sorted(chosen[:cut]),
            "transient": {str(i): rng.choice((1, 2)) for i in sorted(chosen[cut:])},
            "max_reconsume": DEFAULT_MAX_RECONSUME,
            "retry_delay_level": DEFAULT_RETRY_DELAY_LEVEL,
        }
    elif name in (MASTER_CRASH_ASYNC, MASTER_CRASH_SYNC):
        # Sends before this index reach the slave; then the slave stops (replication
        # stalls) and the master loses power after the last send.
        params = {"slave_stops_at_index": rng.randrange(m // 2, (m * 3) // 4)}
    elif name in (REBALANCE_LOCK_OFF, REBALANCE_LOCK_ON):
        shared = _rng(seed, "rebalance")
        params = {"second_consumer_at_index": shared.randrange(m // 5, (m * 2) // 5)}
    elif name == TRANSACTIONS:
        picks = iter(rng.sample(range(m), sum(TX_ROLES.values())))
        params = {role: sorted(next(picks) for _ in range(n)) for role, n in TX_ROLES.items()}
    else:
        raise ValueError(f"unknown scenario {name!r}")
    return ScenarioPlan(name, m, params)


def plan_run(seed: int, total_messages: int, scenario: str) -> list[ScenarioPlan]:
    names = resolve(scenario)
    counts = split_messages(total_messages, names)
    return [plan_scenario(n, counts[n], seed) for n in names]
