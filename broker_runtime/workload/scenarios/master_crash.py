"""A master that loses power while replication to its slave lags, under ASYNC_MASTER +
ASYNC_FLUSH (acknowledged messages are lost) and SYNC_MASTER + SYNC_FLUSH (none are).

Each runs on a cluster of its own (one name server, broker-a master and slave):
1. the first messages are sent and replicated;
2. the slave stops: replication stalls from here on;
3. the rest are sent: an ASYNC_MASTER acknowledges them (SEND_OK) from its page cache, a
   SYNC_MASTER cannot get them replicated and answers SLAVE_NOT_AVAILABLE (stored and
   flushed on the master, not acknowledged);
4. the master loses power: SIGKILL, then its commitlog is cut back to the last fsync
   (power_loss.py);
5. the master restarts (recovery), the slave comes back and catches up.
Which acknowledged messages are gone is then read from both stores' commitlogs.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from broker_runtime.common.findings import LOST_AFTER_ACK
from broker_runtime.common.message import UNIQ_KEY, decode_offset_msg_id
from broker_runtime.store import inspection
from broker_runtime.store import record_codec as codec
from broker_runtime.workload.harness import Harness, WorkloadError
from broker_runtime.workload.power_loss import checkpoint_flushed, cut_commitlog, last_fsync
from broker_runtime.workload.scenarios.common import Ctx
from broker_runtime.workload.truth import finding

MASTER, SLAVE = "broker-a-master", "broker-a-slave"
# ASYNC_FLUSH: the flush and the checkpoint run together (same interval), so the checkpoint
# names the last fsync. RocketMQ flushes every 500 ms by default; 10 s here so that the
# messages sent right after a flush (about half a scenario's, sent in a few seconds even on
# a loaded machine) are all still unflushed when the power goes.
FLUSH_INTERVAL_MS = 10_000
ASYNC_SETTINGS = {
    "store.flush_interval_ms": str(FLUSH_INTERVAL_MS),
    "store.cq_flush_interval_ms": str(FLUSH_INTERVAL_MS),
}


def stored_keys(store_dir: Path, topic: str) -> set[str]:
    """UNIQ_KEYs of `topic`'s messages in a store's commitlog (read from its files)."""
    out = set()
    for _phys, view, pos in inspection.units(store_dir):
        m = codec.decode(view, pos)
        if m.topic == topic and UNIQ_KEY in m.properties:
            out.add(m.properties[UNIQ_KEY])
    return out


async def _replicated(h: Harness, addr: str, timeout: float = 30) -> int:
    """Until the slave has acknowledged the master's whole log; returns the log end."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        info = await h.runtime(addr)
        end = int(info["commitLogMaxOffset"])
        if int(info.get("haConnections", "0")) >= 1 and int(info["haSlaveAckOffset"]) >= end:
            return end
        if asyncio.get_running_loop().time() > deadline:
            raise WorkloadError(f"the slave of {addr} did not catch up: {info}")
        await asyncio.sleep(0.1)


async def _fresh_flush(store: Path, past: int) -> None:
    """Until the store has just flushed past `past` (its checkpoint was rewritten after
    that): the messages sent now stay unflushed for about one flush interval."""
    path = store / "checkpoint"
    deadline = time.monotonic() + 4 * FLUSH_INTERVAL_MS / 1000 + 5
    seen = path.stat().st_mtime_ns if path.exists() else 0
    while True:
        await asyncio.sleep(0.01)
        mtime = path.stat().st_mtime_ns if path.exists() else 0
        if mtime != seen and checkpoint_flushed(store) >= past:
            return
        seen = mtime
        if time.monotonic() > deadline:
            raise WorkloadError(f"{store} did not flush past {past}")


async def master_crash(c: Ctx, sync: bool) -> dict[str, Any]:
    h, m = c.h, c.plan.messages
    k = int(c.plan.params["slave_stops_at_index"])
    layout = h.layout_of(c.root)
    master, slave = layout.node(MASTER), layout.node(SLAVE)
    store = Path(master.store_dir)
    await h.create_topic(c.namesrv, c.topic, 4, ["broker-a"])
    before = await c.produce(range(k))
    stop_end = await _replicated(h, master.addr)
    await asyncio.to_thread(h.stop_node, c.root, SLAVE)
    h.say(f"{c.name}: slave stopped at log offset {stop_end}")
    if not sync:  # under SYNC_FLUSH every answered put is on disk already: no window to wait
        await _fresh_flush(store, stop_end)
    flushed = checkpoint_flushed(store)
    started = time.monotonic()
    after = await c.produce(range(k, m))
    sending_s = round(time.monotonic() - started, 1)
    log_end = int((await h.runtime(master.addr))["commitLogMaxOffset"])
    h.stop_node(c.root, MASTER, kill=True)
    # Under SYNC_FLUSH a put is answered after its fsync; under ASYNC_FLUSH before it.
    answered = [decode_offset_msg_id(s.offset_msg_id)[1] for s in after if s.offset_msg_id]
    cut = last_fsync(store, answered if sync else [])
    cut_commitlog(store, cut)
    h.say(
        f"{c.name}: {m - k} more sent in {sending_s} s; master lost power: log {log_end} cut "
        f"to {cut}"
    )
    if not sync and cut > flushed:
        h.say(
            f"{c.name}: the master flushed again while they were sent (longer than its "
            f"{FLUSH_INTERVAL_MS / 1000:g} s flush interval): fewer acknowledged messages are lost"
        )
    # Both at once: the slave connects once the master is back.
    await asyncio.to_thread(h.start_nodes, c.root, MASTER, SLAVE)
    await _replicated(h, master.addr)
    await asyncio.to_thread(h.cluster_down, c.root)
    present = set()
    for node_store in (store, Path(slave.store_dir)):
        present |= await asyncio.to_thread(stored_keys, node_store, c.topic)
    sent = before + after
    acked = [s for s in sent if s.acked]
    lost = [s for s in acked if s.msg_id not in present]
    findings = [finding(LOST_AFTER_ACK, s.msg_id, None, 1, c.topic) for s in lost]
    statuses: dict[str, int] = {}
    for s in sent:
        statuses[str(s.status)] = statuses.get(str(s.status), 0) + 1
    mode = "SYNC_MASTER + SYNC_FLUSH" if sync else "ASYNC_MASTER + ASYNC_FLUSH"
    injected = {
        "fault": "slave stopped (replication stalls), then the master loses power",
        "mode": mode,
        "slave_stopped_after_index": k,
        "slave_log_end": stop_end,
        "master_log_end_at_power_loss": log_end,
        "flushed_before_sends": flushed,
        "sending_seconds": sending_s,
        "master_log_cut_at": cut,
        "lost_msg_ids": [s.msg_id for s in lost],
    }
    stats = {
        "sent": len(sent),
        "acknowledged": len(acked),
        "statuses": statuses,
        "acknowledged_lost": len(lost),
        "unacknowledged_kept": sum(1 for s in sent if not s.acked and s.msg_id in present),
    }
    outcome = (
        "Every SEND_OK had been replicated and flushed before it was answered: nothing "
        "acknowledged is lost; what the master stored without the slave was answered "
        "SLAVE_NOT_AVAILABLE (not acknowledged; those stubs stay UNCONFIRMED)."
        if sync
        else "The master acknowledged what the slave never got; what it had not flushed "
        "either is gone: acknowledged, then lost (lost_after_ack)."
    )
    return c.result(
        f"{mode}: the slave stops (replication lags behind from then on) and the master "
        "then loses power: SIGKILL, and its commitlog cut back to the last fsync recorded in "
        "its checkpoint (a simulated power cut: a SIGKILL alone loses nothing that reached "
        "the page cache). The master restarts and recovers, the slave catches up. " + outcome,
        [], injected, findings, stats,
    )  # fmt: skip


async def master_crash_async(c: Ctx) -> dict[str, Any]:
    return await master_crash(c, sync=False)


async def master_crash_sync(c: Ctx) -> dict[str, Any]:
    return await master_crash(c, sync=True)
