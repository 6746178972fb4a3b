"""Jinja2 environment of the reports: templates next to this module, HTML autoescaped."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

TEMPLATES = Path(__file__).with_name("templates")


def timestamp(ms: Any) -> str:
    """Epoch milliseconds as UTC time; blank for none."""
    if ms is None:
        return ""
    when = dt.datetime.fromtimestamp(int(ms) / 1000, tz=dt.UTC)
    return when.strftime("%Y-%m-%d %H:%M:%S.") + f"{int(ms) % 1000:03d} UTC"


def duration(ms: Any) -> str:
    """Milliseconds as the two largest units (`3 h 12 m`, `45 s`, `120 ms`); blank for none."""
    if ms is None:
        return ""
    left = int(ms)
    if left < 1000:
        return f"{left} ms"
    parts = []
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if left >= size:
            parts.append(f"{left // size} {unit}")
            left %= size
    return " ".join(parts[:2])


def number(value: Any) -> str:
    return "" if value is None else f"{int(value):,}"


def environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=select_autoescape(["html", "j2"]),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(ts=timestamp, duration=duration, num=number)
    return env


def write_html(template: str, path: Path, **context: Any) -> Path:
    path.write_text(environment().get_template(template).render(**context), encoding="utf-8")
    return path
