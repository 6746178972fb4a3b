"""Broker and name server configs from JSON files and command-line overrides.

A broker config file is a JSON object whose keys are BrokerConfig's field names, with the
store's settings under "store" (StoreConfig's field names), e.g.
{"broker_name": "broker-a", "broker_id": 0, "role": "SYNC_MASTER", "port": 10911,
 "ha_port": 10912, "namesrv_addrs": "127.0.0.1:9876;127.0.0.1:9877",
 "store": {"store_dir": "/data/broker-a/master", "flush": "sync", "segment_size": 1048576}}.
Unknown keys are refused by name (a typo must not silently fall back to a default).
"""

from __future__ import annotations

import dataclasses
import json
import types
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

from broker_runtime.common.config import BrokerConfig, NamesrvConfig, StoreConfig

T = TypeVar("T")


class ConfigError(ValueError):
    pass


def _convert(value: Any, kind: Any, key: str) -> Any:
    origin = get_origin(kind)
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(kind) if a is not type(None)]
        if value is None:
            return None
        return _convert(value, args[0], key)
    try:
        if kind is bool:
            if isinstance(value, str):
                if value.lower() not in ("true", "false"):
                    raise ValueError(value)
                return value.lower() == "true"
            return bool(value)
        if kind is int:
            if isinstance(value, bool):
                raise ValueError(value)
            return int(value)
        if kind is float:
            return float(value)
        if kind is Path:
            return Path(value)
        if isinstance(kind, type) and issubclass(kind, Enum):
            return kind(value)
        if origin is tuple:
            kinds = get_args(kind)
            items = value.split(";") if isinstance(value, str) else list(value)
            if len(kinds) == 2 and kinds[1] is Ellipsis:  # tuple[X, ...]: a ";"-separated list
                parts = [str(i).strip() for i in items]
                return tuple(_convert(i, kinds[0], key) for i in parts if i)
            if len(items) != len(kinds):
                raise ValueError(f"expected {len(kinds)} items")
            return tuple(_convert(i, k, key) for i, k in zip(items, kinds, strict=True))
        if kind is str:
            return str(value)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"config key {key!r}: {value!r} is not a valid {kind}: {e}") from None
    return value


def build(cls: type[T], data: dict[str, Any], where: str = "config") -> T:
    """`cls(**data)` with values converted to the field types and unknown keys refused."""
    hints = get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"{where}: unknown keys {unknown}; known: {sorted(names)}")
    values = {k: _convert(v, hints[k], k) for k, v in data.items()}
    try:
        return cls(**values)
    except TypeError as e:
        raise ConfigError(f"{where}: {e}") from None


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read config {path}: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config {path} is not a JSON object")
    return data


def broker_config(data: dict[str, Any], where: str = "broker config") -> BrokerConfig:
    """A BrokerConfig from a file's (or flags') dict; the store host is the broker's address."""
    data = dict(data)
    store = dict(data.pop("store", {}) or {})
    if "store_dir" in data:
        store.setdefault("store_dir", data.pop("store_dir"))
    if "store_dir" not in store:
        raise ConfigError(f"{where}: store.store_dir is required")
    host = str(data.get("host", "127.0.0.1"))
    port = _convert(data.get("port", 10911), int, "port")
    store.setdefault("store_host", (host, port))
    if isinstance(store["store_host"], list):
        store["store_host"] = tuple(store["store_host"])
    data["store"] = build(StoreConfig, store, f"{where}.store")
    return build(BrokerConfig, data, where)


def config_to_json(config: Any) -> dict[str, Any]:
    """A config dataclass as JSON-able dict (the inverse of `build`)."""

    def plain(v: Any) -> Any:
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, Enum):
            return v.value
        if isinstance(v, Path):
            return str(v)
        if isinstance(v, tuple):
            return [plain(i) for i in v]
        return v

    out: dict[str, Any] = plain(config)
    return out


def namesrv_config(data: dict[str, Any]) -> NamesrvConfig:
    return build(NamesrvConfig, data, "name server config")
