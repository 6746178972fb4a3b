"""What a workload consumer did, as the application saw it: one JSON object per line.

Each line is written with a single `write` on an unbuffered file, so a consumer killed with
SIGKILL loses no line it wrote (the kernel has it). Events (`e`):
`ready` (waiting to be told to start), `start` {client}, `owns` {q: [[topic, broker, qid]]},
`recv` {d, i, id, t, b, q, o, r} (delivery d of message index i, UNIQ_KEY id, pulled from
topic t / broker b / queue q at offset o, reconsume times r), `done` {d, out}
(CONSUMED | RECONSUME_LATER | FAILED), `ack_lost` {q, o}, `stop`.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class JournalWriter:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._lock = threading.Lock()

    def write(self, event: str, **fields: Any) -> None:
        line = json.dumps({"e": event, "ts": time.time_ns() // 1_000_000, **fields})
        with self._lock:
            os.write(self._fd, (line + "\n").encode())

    def close(self) -> None:
        os.close(self._fd)


@dataclass
class Delivery:
    """One delivery of a message to a consumer, and how it ended (None: never finished)."""

    index: int
    msg_id: str
    client: str
    topic: str  # pulled from: the message's topic, or %RETRY%{group}
    broker: str
    queue_id: int
    queue_offset: int
    reconsume_times: int
    received_at: int
    outcome: str | None = None
    finished_at: int | None = None

    @property
    def position(self) -> tuple[str, str, int, int]:
        return self.topic, self.broker, self.queue_id, self.queue_offset


@dataclass
class JournalState:
    """A journal read so far (it may still grow)."""

    ready: bool = False
    client: str | None = None
    stopped: bool = False
    owns: set[tuple[str, str, int]] = field(default_factory=set)
    deliveries: list[Delivery] = field(default_factory=list)
    acks_lost: list[tuple[tuple[str, str, int], int]] = field(default_factory=list)
    _open: dict[int, Delivery] = field(default_factory=dict)

    def apply(self, ev: dict[str, Any]) -> None:
        kind = ev.get("e")
        if kind == "ready":
            self.ready = True
        elif kind == "start":
            self.client = str(ev["client"])
        elif kind == "owns":
            self.owns = {(str(t), str(b), int(q)) for t, b, q in ev["q"]}
        elif kind == "recv":
            d = Delivery(
                int(ev["i"]), str(ev["id"]), str(self.client), str(ev["t"]), str(ev["b"]),
                int(ev["q"]), int(ev["o"]), int(ev["r"]), int(ev["ts"]),
            )  # fmt: skip
            self.deliveries.append(d)
            self._open[int(ev["d"])] = d
        elif kind == "done":
            opened = self._open.pop(int(ev["d"]), None)
            if opened is not None:
                opened.outcome = str(ev["out"])
                opened.finished_at = int(ev["ts"])
        elif kind == "ack_lost":
            t, b, q = ev["q"]
            self.acks_lost.append(((str(t), str(b), int(q)), int(ev["o"])))
        elif kind == "stop":
            self.stopped = True

    def consumed(self) -> set[int]:
        """Indexes with at least one CONSUMED delivery."""
        return {d.index for d in self.deliveries if d.outcome == "CONSUMED"}


class JournalReader:
    """Reads a journal incrementally: `poll` applies the complete lines written since."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.state = JournalState()
        self._pos = 0
        self._partial = b""

    def poll(self) -> JournalState:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._pos)
                data = f.read()
        except FileNotFoundError:
            return self.state
        self._pos += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()  # an incomplete last line waits for its end
        for line in lines:
            if line.strip():
                self.state.apply(json.loads(line))
        return self.state
