"""Shared by the test_accel_*.py files: the C kernels, and outcomes to compare them by."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest


def c_kernels() -> ModuleType:
    """The built extension (whatever MQAUDIT_STORE_PURE says); skips the test when not built.

    Under CI a missing extension fails instead: the C path would go untested.
    """
    try:
        return importlib.import_module("broker_runtime.store._accel")
    except ImportError as e:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the store's C extension is not built: {e}")
        pytest.skip(f"the store's C extension is not built: {e}")


def c_path_in_use() -> None:
    """Skips the test when MQAUDIT_STORE_PURE switched the store to its Python kernels.

    For tests of the store's default path (the public entries calling the C kernels).
    """
    from broker_runtime.store import accel

    if accel.IMPLEMENTATION != "c" and os.environ.get(accel.PURE_ENV, "") not in ("", "0"):
        pytest.skip(f"{accel.PURE_ENV} is set: the store runs its Python kernels")


def outcome(fn: Callable[[], Any]) -> tuple[Any, ...]:
    """('ok', value) or ('error', exception type, message): what a caller of `fn` sees."""
    try:
        return ("ok", fn())
    except Exception as e:
        return ("error", type(e), str(e))
