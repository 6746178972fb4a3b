"""Imports run one way: every module sits on a floor (ARCHITECTURE.md lists them) and imports
only from its own floor or lower ones, and no modules import each other in a circle.

Every import counts, at the top of a module or inside a function; those under
`if TYPE_CHECKING:` do not (they never run), nor those under `if __name__ == "__main__":` (a
module run as a program is an entry point, on the top floor, and is not imported then).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

from tests.conftest import REPO

PACKAGES = ("broker_runtime", "pipeline", "expectations", "dags")

# Lowest first. A module is on the floor of the longest prefix that names it.
FLOORS: list[tuple[str, tuple[str, ...]]] = [
    ("broker: shared vocabulary", ("broker_runtime", "broker_runtime.common")),
    ("broker: state files", ("broker_runtime.offsets",)),
    ("broker: storage, wire, ledgers", (
        "broker_runtime.store", "broker_runtime.remoting", "broker_runtime.ledger",
    )),
    ("broker: access control, replication", ("broker_runtime.acl", "broker_runtime.ha")),
    ("broker: nodes and clients", (
        "broker_runtime.broker", "broker_runtime.namesrv", "broker_runtime.client",
        "broker_runtime.cluster", "broker_runtime.rabbit",
    )),
    ("broker: workloads", ("broker_runtime.workload",)),
    ("lake: catalog, schemas, Spark and Delta I/O", (
        "pipeline", "pipeline.schemas", "pipeline.audit_schemas", "pipeline.lake",
        "pipeline.jvm", "pipeline.local_fs", "pipeline.spark_session", "pipeline.spark_tasks",
        "pipeline.delta_io", "pipeline.delta_files", "pipeline.delta_native",
    )),
    ("lake: readers and transforms", ("pipeline.readers", "pipeline.transforms")),
    ("lake: remediation and reports", ("pipeline.remediation", "pipeline.reports")),
    ("lake: jobs", ("pipeline.jobs",)),
    ("gates", ("expectations",)),
    ("steps", ("pipeline.steps",)),
    ("DAGs", ("dags",)),
    ("entry points", (
        "broker_runtime.cli", "pipeline.cli", "pipeline.run", "pipeline.demo",
        "pipeline.demo_summary", "pipeline.demo_remedies", "pipeline.demo_dags",
        "pipeline.demo_rabbit",
        "dags.spark_app",
        "pipeline.airflow_local", "pipeline.class_archive",
    )),
]  # fmt: skip


def floor_of(module: str) -> int:
    best, level = -1, -1
    for i, (_, prefixes) in enumerate(FLOORS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, level = len(p), i
    assert level >= 0, f"{module} is on no floor"
    return level


def modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _not_imported(tree: ast.AST) -> set[int]:
    """The nodes under `if TYPE_CHECKING:` and `if __name__ == "__main__":`."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        test = ast.unparse(node.test) if isinstance(node, ast.If) else ""
        if "TYPE_CHECKING" in test or "__main__" in test:
            skip |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return skip


def imports(module: str, path: Path, known: dict[str, Path]) -> Iterator[str]:
    """The known modules `module` imports at run time."""

    def owner(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    tree = ast.parse(path.read_text(), str(path))
    skip = _not_imported(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                if (target := owner(alias.name)) is not None:
                    yield target
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".")
                if path.name != "__init__.py":
                    package = package[:-1]
                package = package[: len(package) - node.level + 1]
                base = ".".join([*package, base] if base else package)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                target = full if full in known else owner(base)
                if target is not None:
                    yield target


@functools.cache
def _graph() -> dict[str, frozenset[str]]:
    known = modules()
    return {m: frozenset(imports(m, p, known)) - {m} for m, p in known.items()}


def graph() -> dict[str, set[str]]:
    return {m: set(t) for m, t in _graph().items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_every_module_is_on_a_floor() -> None:
    for module in modules():
        floor_of(module)


def test_no_import_goes_up_a_floor() -> None:
    upward = [
        f"{a} ({FLOORS[floor_of(a)][0]}) imports {b} ({FLOORS[floor_of(b)][0]})"
        for a, targets in sorted(graph().items())
        for b in sorted(targets)
        if floor_of(b) > floor_of(a)
    ]
    assert upward == []


def test_no_import_circles() -> None:
    edges = graph()
    # A package's __init__ importing its own modules is how packages work, not a circle.
    for module in edges:
        edges[module] = {t for t in edges[module] if not module.startswith(t + ".")}
    assert circles(edges) == []


def test_the_walker_sees_function_level_imports_and_skips_type_only_ones() -> None:
    edges = graph()
    assert "pipeline.jobs.ingest" in edges["pipeline.steps"]  # inside a function
    assert "pyspark" not in str(edges["pipeline.steps"])
    assert "pipeline.cli" not in edges["pipeline.jobs.resend"]  # its __main__ block
    assert "pipeline.transforms.lag" in edges["pipeline.cli.audit_cmds"]
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
