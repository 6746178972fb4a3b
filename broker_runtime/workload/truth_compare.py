"""Findings held against ground truth: per kind (or kind and cause), how many the truth
lists, how many were found, how many are both, and the precision and recall that makes.

A finding is a key tuple `(scenario, kind, msg_id, group, cause)`; both sides name theirs
the same way. The demo's summary scores RabbitMQ's findings with it, the truth tests print
its tables (tests/integration/truth_compare.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

# (scenario, kind, msg_id, group, cause): one finding, as both sides must name it.
Key = tuple[str, str, str, str | None, str | None]


def score(truth: set[Any], found: set[Any]) -> dict[str, Any]:
    """Counts of both sides and of their overlap; precision and recall (1.0 where a side
    has nothing to miss)."""
    both = len(truth & found)
    return {
        "truth": len(truth),
        "found": len(found),
        "both": both,
        "precision": round(both / len(found), 3) if found else 1.0,
        "recall": round(both / len(truth), 3) if truth else 1.0,
    }


def scores(
    truth: Iterable[Any], found: Iterable[Any], by: Callable[[Any], Any]
) -> dict[Any, dict[str, Any]]:
    """`score` of the keys of each value of `by` (e.g. the kind), sorted by it."""
    t, f = set(truth), set(found)
    return {
        g: score({k for k in t if by(k) == g}, {k for k in f if by(k) == g})
        for g in sorted({by(k) for k in t | f})
    }


def precision_recall(truth: Iterable[Key], found: Iterable[Key]) -> list[tuple[str, ...]]:
    """Rows (kind, cause, truth, found, both, precision, recall): per kind and cause, then
    per kind with any cause (message and group only)."""
    t, f = set(truth), set(found)
    by_cause = scores(t, f, lambda k: (k[1], k[4] or "-"))
    any_cause = scores({k[:4] for k in t}, {k[:4] for k in f}, lambda k: (k[1], "(any)"))
    return [
        (kind, cause, *(str(s[c]) for c in ("truth", "found", "both")),
         f"{s['precision']:.3f}", f"{s['recall']:.3f}")
        for (kind, cause), s in (*by_cause.items(), *any_cause.items())
    ]  # fmt: skip
