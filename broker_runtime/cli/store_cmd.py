"""`mqaudit store ...`: bench, verify, recover and dump a store directory."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from broker_runtime.broker.damaged_units import skip_unit
from broker_runtime.common.config import FlushMode, StoreConfig
from broker_runtime.store import inspection
from broker_runtime.store.bench import run_bench
from broker_runtime.store.message_store import MessageStore, read_layout


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    store = sub.add_parser("store", help="work with a broker store directory")
    cmds = store.add_subparsers(dest="store_cmd", required=True)

    bench = cmds.add_parser("bench", help="write real messages through the store, time it")
    bench.add_argument("--store", type=Path, required=True, help="a new or empty directory")
    bench.add_argument("--messages", type=int, default=1_000_000)
    bench.add_argument("--size", type=int, default=1024, help="body bytes per message")
    bench.add_argument("--topics", type=int, default=4)
    bench.add_argument("--queues", type=int, default=4, help="queues per topic")
    bench.add_argument("--flush", choices=[m.value for m in FlushMode], default="async")
    bench.add_argument("--segment-size", type=int, default=1 << 30)
    bench.add_argument("--producers", type=int, default=1, help="concurrent producer threads")
    bench.add_argument("--batch", type=int, default=1, help="messages per put (batch send)")
    bench.set_defaults(func=cmd_bench)

    verify = cmds.add_parser("verify", help="check CRCs, tail and ConsumeQueues (read-only)")
    verify.add_argument("--store", type=Path, required=True)
    verify.set_defaults(func=cmd_verify)

    recover = cmds.add_parser("recover", help="run the recovery a broker runs at start")
    recover.add_argument("--store", type=Path, required=True)
    recover.add_argument(
        "--segment-size", type=int, default=None, help="default: as the store was created"
    )
    recover.set_defaults(func=cmd_recover)

    dump = cmds.add_parser(
        "dump", help="messages as JSON lines (read-only); damaged ranges skipped, on stderr"
    )
    dump.add_argument("--store", type=Path, required=True)
    dump.add_argument("--topic", default=None)
    dump.add_argument("--limit", type=int, default=None)
    dump.set_defaults(func=cmd_dump)
    _add_skip_unit(cmds)


def _add_skip_unit(cmds: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    skip = cmds.add_parser(
        "skip-unit",
        help="let pulls pass a damaged unit (recorded in config/skippedUnits.json)",
    )
    skip.add_argument("--store", type=Path, required=True)
    skip.add_argument("--topic", required=True)
    skip.add_argument("--queue", type=int, required=True)
    skip.add_argument("--offset", type=int, required=True, help="the unit's queue offset")
    skip.add_argument("--by", required=True, help="who decided (kept with the skip)")
    skip.add_argument("--note", default="", help="why (kept with the skip)")
    skip.set_defaults(func=cmd_skip_unit)


def cmd_skip_unit(args: argparse.Namespace) -> int:
    _require_store(args.store)
    try:
        record = skip_unit(args.store, args.topic, args.queue, args.offset, args.by, args.note)
    except ValueError as e:
        raise SystemExit(f"mqaudit: {e}") from None
    print(json.dumps(record))
    return 0


def _positive(name: str, value: int) -> None:
    if value <= 0:
        raise SystemExit(f"mqaudit: --{name} must be positive, got {value}")


def cmd_bench(args: argparse.Namespace) -> int:
    for name in ("messages", "size", "topics", "queues", "producers", "batch"):
        _positive(name, getattr(args, name))
    result = run_bench(
        args.store,
        messages=args.messages,
        size=args.size,
        topics=args.topics,
        queues=args.queues,
        flush=FlushMode(args.flush),
        segment_size=args.segment_size,
        producers=args.producers,
        batch=args.batch,
        progress=sys.stderr.isatty(),
    )
    print(json.dumps(result))
    return 0


def _require_store(path: Path) -> None:
    if not (path / "commitlog").is_dir():
        raise SystemExit(f"mqaudit: {path} has no commitlog/ directory: not a store")


def cmd_verify(args: argparse.Namespace) -> int:
    _require_store(args.store)
    report = inspection.verify(args.store)
    print(json.dumps(report.as_dict()))
    return 0 if report.consistent else 1


def cmd_recover(args: argparse.Namespace) -> int:
    _require_store(args.store)
    layout = read_layout(args.store)
    if layout is None:  # a store from elsewhere: take the segment size from its files
        files = sorted((args.store / "commitlog").glob("[0-9]" * 20))
        layout = {"segment_size": files[0].stat().st_size} if files else {}
    if args.segment_size is not None:
        layout["segment_size"] = args.segment_size
    d = StoreConfig(store_dir=args.store)
    config = StoreConfig(
        store_dir=args.store,
        segment_size=layout.get("segment_size", d.segment_size),
        cq_entries_per_file=layout.get("cq_entries_per_file", d.cq_entries_per_file),
        index_hash_slots=layout.get("index_hash_slots", d.index_hash_slots),
        index_max_entries=layout.get("index_max_entries", d.index_max_entries),
    )
    store = MessageStore(config)
    report = store.recovery
    store.shutdown()
    print(json.dumps(report.as_dict()))
    return 0


def cmd_dump(args: argparse.Namespace) -> int:
    """Exit 1 when damaged ranges were skipped (each one a `{"skipped": ...}` line on stderr)."""
    _require_store(args.store)
    out = sys.stdout
    skipped = 0

    def skip(problem: inspection.Problem) -> None:
        nonlocal skipped
        skipped += 1
        print(json.dumps({"skipped": asdict(problem)}), file=sys.stderr)

    try:
        for record in inspection.dump(args.store, args.topic, args.limit, skip):
            out.write(json.dumps(record) + "\n")
    except BrokenPipeError:  # `| head` closed the pipe: not an error
        sys.stderr.close()
    return 1 if skipped else 0
