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
import bisect
import contextlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import ours
import peers
import psutil
import rocketmq_peer
from ours import BATCH, TOPIC
from peers import Run, log

Runner = Callable[[int], Run]  # round -> one timed run
Case = tuple[str, Runner, Sequence[int]]  # name, runner, the broker pids whose CPU it counts
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


class CpuClock:
    """The CPU time (user + system, all threads) of some processes, sampled every 50 ms in a
    thread: what each used between two wall-clock times, a run's start and end."""

    def __init__(self, pids: Sequence[int]) -> None:
        self.procs = {pid: psutil.Process(pid) for pid in pids}
        self.samples: dict[int, list[tuple[float, float]]] = {pid: [] for pid in pids}
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        while not self.stopped.wait(0.05):
            for pid, proc in self.procs.items():
                with contextlib.suppress(psutil.Error):
                    self.samples[pid].append((time.time(), sum(proc.cpu_times()[:2])))

    def close(self) -> None:
        self.stopped.set()
        self.thread.join()

    def used(self, pids: Sequence[int], start: float, end: float) -> float:
        """CPU seconds `pids` used from `start` to `end` (interpolated between samples)."""

        def at(pid: int, t: float) -> float:
            times = [ts for ts, _ in self.samples[pid]]
            i = min(max(bisect.bisect_left(times, t), 1), len(times) - 1)
            (t0, c0), (t1, c1) = self.samples[pid][i - 1], self.samples[pid][i]
            return c0 + (c1 - c0) * (t - t0) / (t1 - t0) if t1 > t0 else c1

        return sum(at(pid, end) - at(pid, start) for pid in pids)


class Bench:
    """The figures of one run of the benchmark, case by case, printed as they come."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.figures: dict[str, dict[str, Any]] = {}
        self.cpu: CpuClock | None = None  # of the brokers whose CPU the cases count

    def case(self, name: str, result: dict[str, Any]) -> None:
        self.figures[name] = {"load1": load1(), **result}
        print(json.dumps({"case": name, **self.figures[name]}), flush=True)

    def forked(self, fn: Callable[..., peers.Timed], target: Any, n: int, batch: int) -> Runner:
        """Runs of `n` forked producer processes, each running `fn`."""
        a = self.args
        return lambda _: peers.run_producers(fn, target, n, batch, a.size, a.seconds)

    def java(self, ns: str, n: int, batch: int) -> Runner:
        """Runs of the official Java producer (`n` threads), sending to `ns`."""
        a = self.args
        return lambda _: rocketmq_peer.java_producer(ns, TOPIC, n, batch, a.size, a.seconds)

    def consumer(self, consume: Callable[[str], Run], client: str) -> Runner:
        """Runs of `consume(group)`, reading everything back, with a new group each round."""
        return lambda r: consume(f"bench_{client}_{r}")

    def side_by_side(self, cases: list[Case]) -> None:
        """Every system's run of one case in turn, `--rounds` times, each round in the
        reverse order of the last: the load of a shared machine drifts, and so it drifts
        alike for all of them. A run that fails is reported and leaves its case out."""
        runs: dict[str, list[tuple[Run, float, float | None]]] = {name: [] for name, *_ in cases}
        for r in range(1, self.args.rounds + 1):
            for name, runner, pids in cases if r % 2 == 1 else cases[::-1]:
                log(f"{name}, round {r}")
                run = attempt(f"{name}, round {r}", runner, r)
                if run is None:
                    continue
                cpu = None
                if pids and self.cpu is not None:
                    cpu = self.cpu.used(pids, run.start, run.end) / run.messages * 1e6
                runs[name].append((run, load1(), cpu))
                row = {"run": name, "round": r, "msgs_per_s": round(run.messages / run.seconds),
                       "load1": load1()}  # fmt: skip
                if run.p50_ms:
                    row["p50_ms"] = round(run.p50_ms, 3)
                if cpu is not None:
                    row["broker_cpu_us_per_msg"] = round(cpu, 1)
                print(json.dumps(row), flush=True)
        for name, done in runs.items():
            if done:
                self.case(name, summarize(done))

    def consume(self, prefix: str, count: int, seconds: float) -> None:
        self.case(f"{prefix} consume", {"messages": count, "msgs_per_s": round(count / seconds)})


def attempt(what: str, runner: Runner, r: int) -> Run | None:
    """`runner(r)`, or None when it failed (the failure is reported)."""
    try:
        return runner(r)
    except Exception as e:
        log(f"{what} failed: {e!r}"[:2000])
        return None


def summarize(runs: list[tuple[Run, float, float | None]]) -> dict[str, Any]:
    """The runs of one case as one figure: all messages over all timed seconds; the
    percentiles, the load average (when each run ended) and the broker's CPU time per
    message averaged over the runs."""
    count, elapsed = sum(r.messages for r, *_ in runs), sum(r.seconds for r, *_ in runs)
    figure = {"messages": count, "msgs_per_s": round(count / elapsed)}
    if any(r.p50_ms for r, *_ in runs):
        figure["p50_ms"] = round(sum(r.p50_ms for r, *_ in runs) / len(runs), 3)
        figure["p99_ms"] = round(sum(r.p99_ms for r, *_ in runs) / len(runs), 3)
    figure["load1"] = round(sum(load for _, load, _ in runs) / len(runs), 2)
    cpus = [cpu for *_, cpu in runs if cpu is not None]
    if cpus:
        figure["broker_cpu_us_per_msg"] = round(sum(cpus) / len(cpus), 1)
    return figure


def against_apache(bench: Bench, work: Path, systems: contextlib.ExitStack) -> None:
    """Apache RocketMQ's broker and this one, same settings, the same clients driving both."""
    log("Apache RocketMQ 4.9.7 and this broker: one master each, ASYNC flush, no slave")
    ns_apache, pid_apache = systems.enter_context(rocketmq_peer.real_cluster(work / "apache"))
    one_broker = ("--groups", "broker-a", "--name-servers", "1")
    ns_ours = systems.enter_context(ours.our_cluster(work / "peer", False, "async", *one_broker))
    rocketmq_peer.create_topic(ns_apache, TOPIC)
    nss = {"apache": ns_apache, "mqaudit": ns_ours}
    pids = {"apache": [pid_apache], "mqaudit": ours.broker_pids(work / "peer")}
    bench.cpu = CpuClock([pid for b in BROKERS for pid in pids[b]])
    systems.callback(bench.cpu.close)

    def sends(what: str, n: int, batch: int) -> list[Case]:
        java = [(f"java->{b} {what}", bench.java(nss[b], n, batch), pids[b]) for b in BROKERS]
        return java + [
            (f"python->{b} {what}", bench.forked(ours.ours_producer, nss[b], n, batch), pids[b])
            for b in BROKERS
        ]

    # A JVM compiles its hot code during its first tens of thousands of requests (C2 was a
    # third of the real broker's CPU in a fresh one's first runs): a run of each kind first.
    most = max(bench.args.producers)
    for name, runner, _ in sends(f"warm-up x{most}", most, 1) + sends("warm-up", 1, BATCH):
        log(f"{name}: not counted")
        attempt(name, runner, 0)
    for n in bench.args.producers:
        bench.side_by_side(sends(f"send x{n}", n, 1))
    bench.side_by_side(sends("batch64 x1", 1, BATCH))
    counts = {
        "apache": rocketmq_peer.stored_count(ns_apache, TOPIC),
        "mqaudit": ours.stored_count(ns_ours),
    }
    log(f"stored: {counts}; each round reads them all back with a new consumer group")
    consumers = {
        "java": partial(rocketmq_peer.java_consume, topic=TOPIC),
        "python": ours.ours_consume,
    }
    bench.side_by_side([
        (f"{c}->{b} consume", bench.consumer(partial(consumers[c], nss[b], counts[b]), c), pids[b])
        for c in CLIENTS for b in BROKERS
    ])  # fmt: skip


def against_others(bench: Bench, work: Path, systems: contextlib.ExitStack) -> str:
    """This broker (two groups) vs Redis Streams and RabbitMQ; its name server's address."""
    args, skip = bench.args, bench.args.skip
    log(f"this broker: 2 groups, {'with' if args.slaves else 'no'} slaves, async flush")
    ns = systems.enter_context(ours.our_cluster(work / "ours", args.slaves))
    sends = [("ours", ours.ours_producer, ns), ("ours asyncio", ours.ours_asyncio_producer, ns)]
    batches: list[Case] = [("ours batch64 x1", bench.forked(ours.ours_producer, ns, 1, BATCH), ())]
    if "syncflush" not in skip:
        log("this broker again, SYNC flush: a send is answered after the fdatasync")
        ns_sync = systems.enter_context(ours.our_cluster(work / "sync", args.slaves, "sync"))
        sends.append(("ours syncflush", ours.ours_producer, ns_sync))
    if "redis" not in skip and shutil.which("redis-server") is None:
        log("redis-server is not installed (make system-deps installs it): its cases are left out")
        skip.add("redis")
    if "redis" not in skip:
        log("Redis Streams (appendonly, fsync every second)")
        redis_port = systems.enter_context(peers.redis_server(work / "redis"))
        sends.append(("redis", peers.redis_producer, redis_port))
        redis_batch = bench.forked(peers.redis_producer, redis_port, 1, BATCH)
        batches.append(("redis pipeline64 x1", redis_batch, ()))
    rabbit = "rabbitmq" not in skip and peers.ensure_rabbitmq()
    if rabbit:
        log("RabbitMQ (durable queue, persistent messages, publisher confirms)")
        rabbit_port = systems.enter_context(peers.rabbitmq_server(work / "rabbitmq"))
        sends.append(("rabbitmq", peers.rabbit_producer, rabbit_port))
    elif "rabbitmq" not in skip:
        log("RabbitMQ could not be installed: its cases are left out")
    for n in args.producers:
        bench.side_by_side(
            [(f"{name} send x{n}", bench.forked(fn, t, n, 1), ()) for name, fn, t in sends]
        )
    bench.side_by_side(batches)
    count = ours.stored_count(ns)
    bench.consume("ours", count, ours.ours_consume(ns, count).seconds)
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
    """msg/s of each client on each broker, the ratio this broker / Apache RocketMQ, and
    each broker's CPU time per message (user + system, all its threads)."""
    whats = [*(f"send x{n}" for n in producers), "batch64 x1", "consume"]
    rows = [
        (f"{what}, {client} client", [figures.get(f"{client}->{b} {what}") for b in BROKERS])
        for what in whats
        for client in CLIENTS
    ]
    rows = [(label, pair) for label, pair in rows if any(pair)]
    if rows:
        print(f"\n{'msg/s':28} {'apache':>9} {'mqaudit':>9} {'ratio':>6}   "
              f"broker CPU us/msg: {'apache':>7} {'mqaudit':>7}")  # fmt: skip
    for label, (theirs, mine) in rows:
        rates = [f"{f['msgs_per_s']:>9,}" if f else f"{'failed':>9}" for f in (theirs, mine)]
        cpus = [f"{f.get('broker_cpu_us_per_msg', '') if f else '':>7}" for f in (theirs, mine)]
        ratio = round(mine["msgs_per_s"] / theirs["msgs_per_s"], 2) if theirs and mine else ""
        print(f"{label:28} {rates[0]} {rates[1]} {ratio!s:>6}   {'':18} {cpus[0]} {cpus[1]}")


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
