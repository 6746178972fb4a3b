"""Which implementation runs the store's per-message loops: the C extension, or pure Python.

The extension `_accel` (built from `_accel*.c` by `pip install`, when a C compiler is there) has
one kernel per hot loop: prepare, encode, dispatch split, ConsumeQueue packing, index keys and
index entries, and the writes to segment files. Each has a pure-Python twin next to the code
that calls it; the twin is the reference the tests hold the C kernel to, byte for byte, and it
runs when the extension is missing, was built from other sources (ABI mismatch), or
`MQAUDIT_STORE_PURE=1` is set.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

PURE_ENV = "MQAUDIT_STORE_PURE"
ABI = 3  # must equal _accel.ABI: bumped with every change of a kernel's signature or meaning


def load_native() -> ModuleType | None:
    """The C kernels, or None when the pure-Python ones must run."""
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return None
    try:
        mod = importlib.import_module("broker_runtime.store._accel")
    except ImportError:
        return None
    return mod if getattr(mod, "ABI", None) == ABI else None


native = load_native()
IMPLEMENTATION = "c" if native is not None else "python"
# How the C kernels compute CRC-32 on this CPU (the pure path uses zlib).
CRC = ("zlib", "pclmulqdq", "vpclmulqdq-avx512")[native.CLMUL] if native is not None else "zlib"
