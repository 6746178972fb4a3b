"""`mqaudit`: the command line of the broker runtime and of the audit pipeline.

The broker's own commands are registered here; downstream packages (the pipeline, the demo)
add theirs through the `mqaudit.commands` entry points declared in pyproject.toml, so that
`broker_runtime` never imports them.
"""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import entry_points

from broker_runtime.cli import (
    admin_cmd,
    cluster_cmd,
    consume_cmd,
    node_cmd,
    produce_cmd,
    store_cmd,
    workload_cmd,
)
from broker_runtime.common.progress import show_progress
from broker_runtime.common.topics import InvalidNameError
from broker_runtime.store.record_codec import MessageRejected


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mqaudit", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    store_cmd.add_parser(sub)
    node_cmd.add_parser(sub)
    cluster_cmd.add_parser(sub)
    produce_cmd.add_parser(sub)
    consume_cmd.add_parser(sub)
    admin_cmd.add_parser(sub)
    workload_cmd.add_parser(sub)
    for ep in sorted(entry_points(group="mqaudit.commands"), key=lambda e: e.name):
        ep.load()(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    show_progress(quiet=getattr(args, "quiet", False))
    try:
        code: int = args.func(args)
    except (FileExistsError, InvalidNameError, MessageRejected, ValueError) as e:
        print(f"mqaudit: {e}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
