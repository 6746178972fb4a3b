"""A bounded coverage-guided run (atheris) of every fuzz target over its corpus: the corpus
replayed, then a fixed number of new inputs (a fixed seed: the same inputs on every run).

FUZZ_RUNS sets the number of new inputs a target gets (0: only the corpus); a failing
input is left in the test's temporary directory and named in the failure.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.fuzz.run import CORPUS
from tests.fuzz.targets import TARGETS

RUNS = int(os.environ.get("FUZZ_RUNS", "3000"))
# Under 1,000 bytes: a header nested deeper than Python's recursion limit is issue 18's
# "Frames" item, not this run's to find.
MAX_LEN = 512


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_a_bounded_fuzzing_run_finds_nothing(target: str, tmp_path: Path) -> None:
    assert sorted(p.name for p in CORPUS.iterdir()) == sorted(TARGETS)
    assert any((CORPUS / target).iterdir()), "every target has a corpus"
    scratch = tmp_path / "new"
    scratch.mkdir()
    proc = subprocess.run(
        [
            sys.executable, "-m", "tests.fuzz.run", target, str(scratch),
            f"-runs={RUNS}", f"-max_len={MAX_LEN}", "-seed=1",
            f"-artifact_prefix={tmp_path}/", "-print_final_stats=1",
        ],
        cwd=REPO, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    crashes = sorted(tmp_path.glob("crash-*")) + sorted(tmp_path.glob("timeout-*"))
    assert proc.returncode == 0 and not crashes, f"{crashes}\n{proc.stderr[-4000:]}"
    executed = re.search(r"stat::number_of_executed_units: (\d+)", proc.stderr)
    assert executed is not None and int(executed[1]) >= RUNS, proc.stderr[-2000:]
