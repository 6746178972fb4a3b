"""`mqaudit demo`: the product's main job, end to end on this machine.

For now (the store issue) it benches the store, verifies it and shows a few messages;
later issues grow it into the cluster + workload + audit run.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
from pathlib import Path

from broker_runtime.common.config import FlushMode
from broker_runtime.store import inspect
from broker_runtime.store.bench import run_bench


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = sub.add_parser("demo", help="run the main job on the embedded default")
    demo.add_argument("--out", type=Path, default=Path("demo-out"))
    demo.add_argument("--messages", type=int, default=200_000)
    demo.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    out: Path = args.out
    store = out / "store"
    shutil.rmtree(store, ignore_errors=True)  # the demo's own store, rebuilt each run
    out.mkdir(parents=True, exist_ok=True)
    print(f"== store bench: {args.messages} x 1 KiB messages, async flush, batch 32 -> {store}")
    bench = run_bench(
        store,
        messages=args.messages,
        size=1024,
        topics=4,
        queues=4,
        flush=FlushMode.ASYNC,
        segment_size=64 << 20,
        batch=32,
        progress=True,
    )
    print(json.dumps(bench))
    print("== store verify")
    report = inspect.verify(store).as_dict()
    print(json.dumps(report))
    print("== store dump (first 3 messages, bodies cut to 24 base64 characters)")
    for record in itertools.islice(inspect.dump(store), 3):
        record["body"] = record["body"][:24] + "..."
        print(json.dumps(record))
    summary = {"bench": bench, "verify": report}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"== summary: {out / 'summary.json'}")
    return 0 if report["consistent"] else 1
