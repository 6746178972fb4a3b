"""Builds the optional C kernels: the store's (see broker_runtime/store/accel.py), the
remoting header codec's (broker_runtime/remoting/_header.c) and the pipeline reader's
(pipeline/readers/_scan.c, which compiles in the store's CRC-32 kernel).

Everything else about the package is in pyproject.toml. `optional=True`: without a C compiler,
zlib headers or Python headers the build goes on without the extension, and the store runs its
pure-Python kernels (the reader: its pure twin in unit_batch.py).
"""

from setuptools import Extension, setup

STORE = "broker_runtime/store"
READERS = "pipeline/readers"
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
        ),
        Extension(
            "broker_runtime.remoting._header",
            sources=["broker_runtime/remoting/_header.c"],
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,
        ),
        Extension(
            "pipeline.readers._scan",
            sources=[f"{READERS}/_scan.c", f"{READERS}/_scan_columns.c", f"{STORE}/_accel_crc.c"],
            depends=[f"{READERS}/_scan.h", f"{STORE}/_accel.h"],
            include_dirs=[STORE],
            libraries=["z"],
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,
        ),
    ]
)
