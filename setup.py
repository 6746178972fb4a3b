"""Builds the store's optional C kernels (see broker_runtime/store/accel.py).

Everything else about the package is in pyproject.toml. `optional=True`: without a C compiler,
zlib headers or Python headers the build goes on without the extension, and the store runs its
pure-Python kernels.
"""

from setuptools import Extension, setup

STORE = "broker_runtime/store"
SOURCES = ["module", "prepare", "encode", "rows", "dispatch", "crc"]  # _accel_<name>.c

setup(
    ext_modules=[
        Extension(
            "broker_runtime.store._accel",
            sources=[f"{STORE}/_accel_{name}.c" for name in SOURCES],
            depends=[f"{STORE}/_accel.h"],
            libraries=["z"],
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,
        )
    ]
)
