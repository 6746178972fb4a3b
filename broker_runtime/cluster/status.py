"""`mqaudit cluster status`: each node of DIR/cluster.json, alive and answering or not."""

from __future__ import annotations

from typing import Any

from broker_runtime.cluster.layout import ClusterLayout
from broker_runtime.cluster.probe import broker_info, namesrv_info
from broker_runtime.cluster.supervisor import credentials, process_alive


def status(layout: ClusterLayout) -> dict[str, Any]:
    creds = credentials(layout)
    nodes = []
    for n in layout.nodes:
        row: dict[str, Any] = {
            "name": n.name, "role": n.role, "group": n.group, "broker_id": n.broker_id,
            "host": n.host, "port": n.port, "ha_port": n.ha_port, "pid": n.pid,
            "alive": process_alive(n), "store_dir": n.store_dir,
        }  # fmt: skip
        if n.role == "namesrv":
            info = namesrv_info(n.addr) if row["alive"] else None
            row["answering"] = info is not None
            if info is not None:
                table = info.get("brokerAddrTable", {})
                row["brokers"] = sorted(table) if isinstance(table, dict) else []
        else:
            rt = broker_info(n.addr, 2.0, creds) if row["alive"] else None
            row["answering"] = rt is not None
            if rt is not None:
                row["max_offset"] = int(rt.get("commitLogMaxOffset", "0"))
                row["runtime"] = rt
        nodes.append(row)
    ok = all(r["alive"] and r["answering"] for r in nodes)
    return {
        "data_dir": layout.data_dir,
        "namesrv_addr": layout.namesrv_addr,
        "ok": ok,
        "nodes": nodes,
    }
