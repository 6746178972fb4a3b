"""Container health checks of the mqaudit deployment: exit 0 when the node answers, 1 when not.

    healthcheck.py namesrv HOST:PORT        a name server answers GET_BROKER_CLUSTER_INFO
    healthcheck.py broker HOST:PORT         a broker answers GET_BROKER_RUNTIME_INFO
    healthcheck.py http URL [--expect TEXT] an HTTP 200 (whose body contains TEXT)

The images have no curl; this needs only the image's Python (and, for the RocketMQ-protocol
checks, broker_runtime's probe). The reason for a failure goes to stderr (docker inspect shows it).
"""

from __future__ import annotations

import argparse
import sys
import urllib.error
import urllib.request

TIMEOUT_S = 5.0


def check_http(url: str, expect: str | None) -> str | None:
    """None when healthy, else why not."""
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            body = response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return f"{url}: HTTP {e.code}"
    except (urllib.error.URLError, OSError) as e:
        return f"{url}: {getattr(e, 'reason', e)}"
    if expect is not None and expect not in body:
        return f"{url}: answer does not contain {expect!r}: {body[:200]!r}"
    return None


def check_node(kind: str, addr: str) -> str | None:
    from broker_runtime.cluster.probe import broker_info, namesrv_info

    probe = namesrv_info if kind == "namesrv" else broker_info
    return None if probe(addr, TIMEOUT_S) is not None else f"{kind} at {addr} does not answer"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    sub = parser.add_subparsers(dest="kind", required=True)
    for kind in ("namesrv", "broker"):
        sub.add_parser(kind).add_argument("addr", help="HOST:PORT")
    http = sub.add_parser("http")
    http.add_argument("url")
    http.add_argument("--expect", default=None, help="text the body must contain")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.kind == "http":
        problem = check_http(args.url, args.expect)
    else:
        problem = check_node(args.kind, args.addr)
    if problem is not None:
        print(f"unhealthy: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
