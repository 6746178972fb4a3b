"""`mqaudit`: the command line of the broker runtime and of the audit pipeline.

The broker's own commands are registered here; downstream packages (the pipeline, the demo)
add theirs through the `mqaudit.commands` entry points declared in pyproject.toml, so that
`broker_runtime` never imports them.

A run of one of the broker's own commands builds only that command's parser, so it imports
only what the command runs: a name server or broker process (the cluster starts dozens) then
starts in about 0.15-0.3 CPU s instead of the 1.2 s that every command's libraries (pandas,
SQLAlchemy, Spark's Python side through the pipeline's commands) took. Any other first word
(a downstream command, `--help`, a typo) builds the whole parser.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from broker_runtime.common.progress import show_progress
from broker_runtime.common.topics import InvalidNameError
from broker_runtime.store.record_codec import MessageRejected

# The broker's own commands: the command -> its module in broker_runtime.cli, whose
# `add_parser(subparsers)` registers it (in this order in the help).
COMMANDS = {
    "store": "store_cmd",
    "namesrv": "node_cmd",
    "broker": "node_cmd",
    "cluster": "cluster_cmd",
    "produce": "produce_cmd",
    "consume": "consume_cmd",
    "admin": "admin_cmd",
    "workload": "workload_cmd",
    "rabbit-workload": "rabbit_workload_cmd",
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """Every command's parser; with `command` one of COMMANDS, only that command's."""
    parser = argparse.ArgumentParser(prog="mqaudit", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    own = COMMANDS.get(command or "")
    for name in dict.fromkeys([own] if own else COMMANDS.values()):
        importlib.import_module(f"broker_runtime.cli.{name}").add_parser(sub)
    if own is None:
        from importlib.metadata import entry_points

        for ep in sorted(entry_points(group="mqaudit.commands"), key=lambda e: e.name):
            ep.load()(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv[0] if argv else None).parse_args(argv)
    show_progress(quiet=getattr(args, "quiet", False))
    try:
        code: int = args.func(args)
    except (FileExistsError, InvalidNameError, MessageRejected, ValueError) as e:
        print(f"mqaudit: {e}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
