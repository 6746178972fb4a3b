"""The Dockerfile's checks for docker/check_compose.py, without a Docker engine: its
instructions parsed (continuation lines joined, comments dropped), COPY/ADD sources present in
the build context, --from stages known, CMD/ENTRYPOINT in exec form, every built target ending
as a non-root user.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Instruction:
    line: int
    keyword: str
    args: str


def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions with continuation lines joined; comments dropped."""
    out: list[Instruction] = []
    parts: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not parts and (not stripped or stripped.startswith("#")):
            continue
        if parts and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if not parts:
            start = number
        if stripped.endswith("\\"):
            parts.append(stripped[:-1].strip())
            continue
        parts.append(stripped)
        keyword, _, args = " ".join(p for p in parts if p).partition(" ")
        out.append(Instruction(start, keyword.upper(), args.strip()))
        parts = []
    return out


def _flags_and_paths(args: str) -> tuple[dict[str, str], list[str]]:
    if args.startswith("["):
        words = [str(w) for w in json.loads(args)]
    else:
        words = args.split()
    flags = {}
    while words and words[0].startswith("--"):
        key, _, value = words.pop(0)[2:].partition("=")
        flags[key] = value
    return flags, words


def dockerfile_stages(instructions: list[Instruction]) -> dict[str, dict[str, Any]]:
    """stage name -> {"base": image or stage, "user": last USER (inherited), "args": ARG names}."""
    stages: dict[str, dict[str, Any]] = {}
    current: dict[str, Any] | None = None
    for ins in instructions:
        if ins.keyword == "FROM":
            words = ins.args.split()
            base = next(w for w in words if not w.startswith("--"))
            name = words[-1] if len(words) >= 3 and words[-2].upper() == "AS" else None
            inherited = stages.get(base, {}).get("user", "root")
            current = {"base": base, "user": inherited, "args": set()}
            stages[name or f"#{len(stages)}"] = current
        elif current is not None and ins.keyword == "USER":
            current["user"] = ins.args.split(":")[0]
        elif current is not None and ins.keyword == "ARG":
            current["args"].add(ins.args.split("=")[0])
    return stages


def global_args(instructions: list[Instruction]) -> dict[str, str]:
    """ARGs declared before the first FROM, with their defaults."""
    found = {}
    for ins in instructions:
        if ins.keyword == "FROM":
            break
        if ins.keyword == "ARG":
            name, _, default = ins.args.partition("=")
            found[name] = default
    return found


def dockerfile_problems(path: Path, context: Path, targets: set[str]) -> list[str]:
    """Problems of the Dockerfile; `targets` (the stages images are built from) must not
    end as root."""
    instructions = parse_dockerfile(path.read_text())
    stages = dockerfile_stages(instructions)
    problems = []
    seen: set[str] = set()
    current = ""
    for ins in instructions:
        where = f"{path.name}:{ins.line}"
        if ins.keyword == "FROM":
            words = ins.args.split()
            current = words[-1] if len(words) >= 3 and words[-2].upper() == "AS" else ""
            seen.add(current)
        if ins.keyword in ("CMD", "ENTRYPOINT") and not ins.args.startswith("["):
            problems.append(f"{where}: {ins.keyword} in shell form (signals never reach it)")
        if ins.keyword not in ("COPY", "ADD"):
            continue
        flags, words = _flags_and_paths(ins.args)
        sources = words[:-1]
        if not sources:
            problems.append(f"{where}: {ins.keyword} without a source")
        if "from" in flags:
            if flags["from"] not in seen and not re.search(r"[:/]", flags["from"]):
                problems.append(f"{where}: --from={flags['from']} is no earlier stage")
            continue
        for source in sources:
            if not list(context.glob(source)):
                problems.append(f"{where}: {ins.keyword} source {source} is not in the context")
    for target in sorted(targets):
        if target not in stages:
            problems.append(f"{path.name}: no stage {target}")
        elif stages[target]["user"] in ("root", "0"):
            problems.append(f"{path.name}: target {target} runs as root")
    return problems
