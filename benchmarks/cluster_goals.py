"""cluster_bench.py's figures against its goals: the ratios of msgs/s between this broker's
cases and the peers', printed as a table with a verdict per goal."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

GOALS = [  # (figure, over, at least): ratios of msgs/s between two cases
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


def ratios(
    figures: dict[str, dict[str, Any]], producers: list[int], pairs: Sequence[tuple[Any, ...]]
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


def report(figures: dict[str, dict[str, Any]], producers: list[int]) -> list[dict[str, Any]]:
    print(f"\n{'case':28} {'msgs/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'load':>6}")
    for name, f in figures.items():
        if "p50_ms" in f or name.endswith("consume"):
            p50, p99 = f.get("p50_ms", ""), f.get("p99_ms", "")
            print(f"{name:28} {f['msgs_per_s']:>10,} {p50!s:>8} {p99!s:>8} {f['load1']:>6}")
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
        print(f"{v['ours'] + peer:52} {v['ratio']:>8}  goal {v['goal']}: "
              f"{'met' if v['met'] else 'NOT met'}")  # fmt: skip
    for v in ratios(figures, producers, ALSO):
        print(f"{v['ours'] + ' / ' + v['peer']:52} {v['ratio']:>8}  (for comparison)")
    return verdicts
