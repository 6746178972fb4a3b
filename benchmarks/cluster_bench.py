"""`make bench` (cluster part): this broker vs Apache RocketMQ, RabbitMQ and Redis Streams.

Each system runs on loopback in a temporary directory, started and stopped here (ours.py,
peers.py, rocketmq_peer.py), all of them at once. Producers send 1 KiB messages one at a
time, each waiting for its acknowledgement, for `--seconds`; batch sends are 64 messages per
request (Redis: a pipeline of 64 XADDs). The systems take turns at each case, `--rounds`
times in alternating order, so that a shared machine's load weighs on all of them alike;
each run is printed with the 1-minute load average when it ended.

Apache RocketMQ 4.9.7, the reference, and this broker, each one master with ASYNC flush and
no slave, are driven by the same clients: the official Java producer (one JVM, 1 or 8
sending threads) and this project's SyncProducer (1 or 8 processes), named `java->` and
`python->`; then each client's consumer reads everything back. The ratios this broker /
Apache RocketMQ per client and case have the goal 1.0.

Against RabbitMQ and Redis, this broker runs two groups; every producer is a blocking client,
as the peers' pika and redis-py are: ours is SyncProducer; the asyncio Producer awaiting each
send is measured too ("ours asyncio"). What an acknowledgement means:
- this broker: a sync send, answered once the message is in the CommitLog; the cluster runs
  with ASYNC flush (RocketMQ's default: the log is flushed every 500 ms, as Redis's
  `appendfsync everysec`), no slaves unless `--slaves`. The single sends are repeated on a
  SYNC-flush cluster (answered after the fdatasync, group commit), for the comparison with
  RabbitMQ, which confirms a persistent message once it is on disk.
- Redis: XADD (appendonly, fsync every second); RabbitMQ: durable queue, persistent
  messages, a publisher confirm per publish.
Then one consumer reads everything back (XREADGROUP + XACK, basic_consume + ack, push
consumer). Last, `--messages` go end to end through this broker and every one is checked
off. Figures and ratios are printed; the goals are reported, never asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import ours
import peers
import rocketmq_peer
from ours import BATCH, TOPIC
from peers import Run, log

Runner = Callable[[int, int], Run]  # (producers, messages per request) -> one timed run
CLIENTS = ("java", "python")
BROKERS = ("apache", "mqaudit")
GOALS = [  # (figure, over, at least): ratios of msgs/s between two cases
    *[
        (f"{c}->mqaudit {case}", f"{c}->apache {case}", 1.0)
        for case in ("send x{n}", "batch64 x1", "consume")
        for c in CLIENTS
    ],
    ("ours send x{n}", "rabbitmq send x{n}", 3.0),
    ("ours send x{n}", "redis send x{n}", 0.5),
    ("ours batch64 x1", "redis pipeline64 x1", 0.5),
]
# Not goals: the asyncio client awaiting each send; this broker flushing each send to disk
# before answering, as RabbitMQ does.
ALSO = [
    ("ours asyncio send x{n}", "rabbitmq send x{n}"),
    ("ours syncflush send x{n}", "rabbitmq send x{n}"),
]


def load1() -> float:
    return round(os.getloadavg()[0], 2)


class Bench:
    """The figures of one run of the benchmark, case by case, printed as they come."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.figures: dict[str, dict[str, Any]] = {}

    def case(self, name: str, result: dict[str, Any]) -> None:
        self.figures[name] = {"load1": load1(), **result}
        print(json.dumps({"case": name, **self.figures[name]}), flush=True)

    def forked(self, fn: Callable[..., peers.Timed], target: Any) -> Runner:
        """A case whose producers are forked processes running `fn`."""
        a = self.args
        return lambda n, batch: peers.run_producers(fn, target, n, batch, a.size, a.seconds)

    def java(self, ns: str) -> Runner:
        """A case whose producer is the official Java one, sending to `ns`."""
        a = self.args
        return lambda n, batch: rocketmq_peer.java_producer(ns, TOPIC, n, batch, a.size, a.seconds)

    def side_by_side(self, cases: list[tuple[str, Runner]], n: int, batch: int) -> None:
        """Every system's run of one case in turn, `--rounds` times, each round in the
        reverse order of the last: the load of a shared machine drifts, and so it drifts
        alike for all of them. A run that fails is reported and leaves its case out."""
        runs: dict[str, list[tuple[Run, float]]] = {name: [] for name, _ in cases}
        for r in range(self.args.rounds):
            for name, runner in cases if r % 2 == 0 else cases[::-1]:
                log(f"{name}: {n} producer(s), {batch} message(s) per request, round {r + 1}")
                try:
                    run = runner(n, batch)
                except Exception as e:
                    log(f"{name}, round {r + 1} failed: {e!r}"[:2000])
                    continue
                runs[name].append((run, load1()))
                rate = round(run.messages / run.seconds)
                print(json.dumps({"run": name, "round": r + 1, "msgs_per_s": rate,
                                  "p50_ms": round(run.p50_ms, 3), "load1": load1()}),
                      flush=True)  # fmt: skip
        for name, done in runs.items():
            if done:
                self.case(name, summarize(done))

    def consume_rounds(self, cases: list[tuple[str, Callable[[str], float], int]]) -> None:
        """Each (name, consume(group) -> seconds, messages) reads everything back, with a new
        consumer group each round, the rounds in alternating order as the sends."""
        runs: dict[str, list[tuple[Run, float]]] = {name: [] for name, _, _ in cases}
        for r in range(self.args.rounds):
            for name, consume, count in cases if r % 2 == 0 else cases[::-1]:
                log(f"{name}: {count:,} messages, round {r + 1}")
                group = f"bench_{name.split('->')[0]}_{r + 1}"
                try:
                    seconds = consume(group)
                except Exception as e:
                    log(f"{name}, round {r + 1} failed: {e!r}"[:2000])
                    continue
                runs[name].append((Run(count, seconds, 0.0, 0.0), load1()))
                print(json.dumps({"run": name, "round": r + 1, "msgs_per_s": round(count / seconds),
                                  "load1": load1()}), flush=True)  # fmt: skip
        for name, done in runs.items():
            if done:
                self.case(name, {k: v for k, v in summarize(done).items() if "_ms" not in k})

    def consume(self, prefix: str, count: int, seconds: float) -> None:
        self.case(f"{prefix} consume", {"messages": count, "msgs_per_s": round(count / seconds)})


def summarize(runs: list[tuple[Run, float]]) -> dict[str, Any]:
    """The runs of one case as one figure: all messages over all timed seconds; the
    percentiles and the load average (when each run ended) averaged over the runs."""
    count, elapsed = sum(r.messages for r, _ in runs), sum(r.seconds for r, _ in runs)
    return {
        "messages": count,
        "msgs_per_s": round(count / elapsed),
        "p50_ms": round(sum(r.p50_ms for r, _ in runs) / len(runs), 3),
        "p99_ms": round(sum(r.p99_ms for r, _ in runs) / len(runs), 3),
        "load1": round(sum(load for _, load in runs) / len(runs), 2),
    }


def against_apache(bench: Bench, work: Path, systems: contextlib.ExitStack) -> None:
    """Apache RocketMQ's broker and this one, same settings, the same clients driving both."""
    producers = bench.args.producers
    log("Apache RocketMQ 4.9.7 and this broker: one master each, ASYNC flush, no slave")
    nss = {
        "apache": systems.enter_context(rocketmq_peer.real_cluster(work / "apache")),
        "mqaudit": systems.enter_context(ours.our_cluster(work / "peer", False, groups="broker-a")),
    }
    ours.create_topic(nss["apache"], TOPIC)

    def cases(what: str) -> list[tuple[str, Runner]]:
        return [
            *[(f"java->{b} {what}", bench.java(nss[b])) for b in BROKERS],
            *[(f"python->{b} {what}", bench.forked(ours.ours_producer, nss[b])) for b in BROKERS],
        ]

    for n in producers:
        bench.side_by_side(cases(f"send x{n}"), n, 1)
    bench.side_by_side(cases("batch64 x1"), 1, BATCH)
    counts = {b: ours.stored_count(nss[b]) for b in BROKERS}
    bench.consume_rounds([
        *[(f"java->{b} consume", partial(rocketmq_peer.java_consume, nss[b], TOPIC, counts[b]),
           counts[b]) for b in BROKERS],
        *[(f"python->{b} consume", partial(ours.ours_consume, nss[b], counts[b]), counts[b])
          for b in BROKERS],
    ])  # fmt: skip


def against_others(bench: Bench, work: Path, systems: contextlib.ExitStack) -> str:
    """This broker (two groups) vs Redis Streams and RabbitMQ; its name server's address."""
    args, skip = bench.args, bench.args.skip
    log(f"this broker: 2 groups, {'with' if args.slaves else 'no'} slaves, async flush")
    ns = systems.enter_context(ours.our_cluster(work / "ours", args.slaves))
    sends = [("ours", ours.ours_producer, ns), ("ours asyncio", ours.ours_asyncio_producer, ns)]
    batches = [("ours batch64 x1", bench.forked(ours.ours_producer, ns))]
    if "syncflush" not in skip:
        log("this broker again, SYNC flush: a send is answered after the fdatasync")
        ns_sync = systems.enter_context(ours.our_cluster(work / "sync", args.slaves, "sync"))
        sends.append(("ours syncflush", ours.ours_producer, ns_sync))
    if "redis" not in skip:
        log("Redis Streams (appendonly, fsync every second)")
        redis_port = systems.enter_context(peers.redis_server(work / "redis"))
        sends.append(("redis", peers.redis_producer, redis_port))
        batches.append(("redis pipeline64 x1", bench.forked(peers.redis_producer, redis_port)))
    rabbit = "rabbitmq" not in skip and peers.ensure_rabbitmq()
    if rabbit:
        log("RabbitMQ (durable queue, persistent messages, publisher confirms)")
        rabbit_port = systems.enter_context(peers.rabbitmq_server(work / "rabbitmq"))
        sends.append(("rabbitmq", peers.rabbit_producer, rabbit_port))
    elif "rabbitmq" not in skip:
        log("RabbitMQ could not be installed: its cases are left out")
    for n in args.producers:
        cases = [(f"{name} send x{n}", bench.forked(fn, t)) for name, fn, t in sends]
        bench.side_by_side(cases, n, 1)
    bench.side_by_side(batches, 1, BATCH)
    count = ours.stored_count(ns)
    bench.consume("ours", count, ours.ours_consume(ns, count))
    if "redis" not in skip:
        count = peers.redis_stored(redis_port)
        bench.consume("redis", count, peers.redis_consume(redis_port, count))
    if rabbit:
        count = peers.rabbit_stored(rabbit_port)
        bench.consume("rabbitmq", count, peers.rabbit_consume(rabbit_port, count))
    return ns


# -- the report -----------------------------------------------------------------------------
def ratios(
    figures: dict[str, dict[str, Any]], producers: list[int], pairs: list[tuple[Any, ...]]
) -> list[dict[str, Any]]:
    """Each pair's ratio of msgs/s, for every producer count; with a verdict when it has a
    goal."""
    out = []
    for a, b, *goal in pairs:
        for n in producers if "{n}" in a else [1]:
            fa, fb = figures.get(a.format(n=n)), figures.get(b.format(n=n))
            if fa is not None and fb is not None:
                ratio = round(fa["msgs_per_s"] / fb["msgs_per_s"], 2)
                out.append({"ours": a.format(n=n), "peer": b.format(n=n), "ratio": ratio})
                if goal:
                    out[-1].update(goal=float(goal[0]), met=ratio >= float(goal[0]))
    return out


def apache_table(figures: dict[str, dict[str, Any]], producers: list[int]) -> None:
    """msg/s of each client on each broker, and the ratio this broker / Apache RocketMQ."""
    whats = [*(f"send x{n}" for n in producers), "batch64 x1", "consume"]
    rows = [
        (f"{what}, {client} client", [figures.get(f"{client}->{b} {what}") for b in BROKERS])
        for what in whats
        for client in CLIENTS
    ]
    rows = [(label, pair) for label, pair in rows if any(pair)]
    if rows:
        print(
            f"\n{'Apache RocketMQ 4.9.7 vs mqaudit':34} {'apache':>10} {'mqaudit':>10} {'ratio':>6}"
        )
    for label, (theirs, mine) in rows:
        rates = [f"{f['msgs_per_s']:>10,}" if f else f"{'failed':>10}" for f in (theirs, mine)]
        ratio = round(mine["msgs_per_s"] / theirs["msgs_per_s"], 2) if theirs and mine else ""
        print(f"{label:34} {rates[0]} {rates[1]} {ratio!s:>6}")


def report(figures: dict[str, dict[str, Any]], producers: list[int]) -> list[dict[str, Any]]:
    print(f"\n{'case':28} {'msgs/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'load':>6}")
    for name, f in figures.items():
        if "p50_ms" in f or name.endswith("consume"):
            p50, p99 = f.get("p50_ms", ""), f.get("p99_ms", "")
            print(f"{name:28} {f['msgs_per_s']:>10,} {p50!s:>8} {p99!s:>8} {f['load1']:>6}")
    apache_table(figures, producers)
    verdicts = ratios(figures, producers, GOALS)
    e2e = figures.get("ours end-to-end")
    if e2e is not None:
        print(f"\nend to end: {e2e['messages']:,} messages in {e2e['end_to_end_s']} s "
              f"({e2e['end_to_end_msgs_per_s']:,} msg/s), lost {e2e['lost']}, "
              f"duplicates {e2e['duplicates']}")  # fmt: skip
        verdicts.append({"ours": "end-to-end lost", "ratio": e2e["lost"], "goal": 0,
                         "met": e2e["lost"] == 0})  # fmt: skip
    print()
    for v in verdicts:
        peer = f" / {v['peer']}" if "peer" in v else ""
        print(f"{v['ours'] + peer:56} {v['ratio']:>8}  goal {v['goal']}: "
              f"{'met' if v['met'] else 'NOT met'}")  # fmt: skip
    for v in ratios(figures, producers, ALSO):
        print(f"{v['ours'] + ' / ' + v['peer']:56} {v['ratio']:>8}  (for comparison)")
    return verdicts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="per send case and round")
    ap.add_argument("--rounds", type=int, default=2, help="of each case, order reversed")
    ap.add_argument("--size", type=int, default=1024, help="body bytes")
    ap.add_argument("--producers", default="1,8", help="producer counts (processes, threads)")
    ap.add_argument("--messages", type=int, default=1_000_000, help="end to end (0: skip)")
    ap.add_argument("--slaves", action="store_true", help="run this broker with slaves (not "
                    "against Apache RocketMQ, which runs without)")  # fmt: skip
    ap.add_argument("--skip", default="", help="cases to leave out: "
                    "rocketmq,others (RabbitMQ, Redis and what this broker does against them),"
                    "rabbitmq,redis,syncflush")  # fmt: skip
    ap.add_argument("--out", type=Path, default=ours.ROOT / "bench-out" / "cluster_bench.json")
    args = ap.parse_args()
    args.producers = [int(x) for x in args.producers.split(",")]
    args.skip = set(filter(None, args.skip.split(",")))
    bench = Bench(args)
    work = Path(tempfile.mkdtemp(prefix="cluster-bench-"))
    log(f"load average at the start: {load1():.2f} on {os.cpu_count()} cores")
    try:
        with contextlib.ExitStack() as systems:
            if "rocketmq" not in args.skip:
                why_not = rocketmq_peer.available()
                if why_not is None:
                    against_apache(bench, work, systems)
                else:
                    log(f"Apache RocketMQ left out: {why_not} (make system-deps installs maven)")
            if "others" not in args.skip:
                ns = against_others(bench, work, systems)
                if args.messages > 0:
                    log(f"this broker: {args.messages:,} messages end to end")
                    bench.case("ours end-to-end", ours.end_to_end(ns, args.messages, args.size))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    verdicts = report(bench.figures, args.producers)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"figures": bench.figures, "goals": verdicts}, indent=2))
    print(f"\nfigures written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
