"""`python -m tests.fuzz.run TARGET [libFuzzer flags]`: coverage-guided fuzzing (atheris) of
one target of targets.py, starting from its corpus in tests/fuzz/corpus/TARGET/.

New inputs go to the first corpus directory given in the flags' place (pass a scratch
directory first to keep the repository's corpus as it is); a failing input is written where
-artifact_prefix says and the run exits non-zero. Add the inputs worth keeping to the corpus.
"""

from __future__ import annotations

import sys
from pathlib import Path

import atheris

CORPUS = Path(__file__).parent / "corpus"

with atheris.instrument_imports(include=["broker_runtime", "pipeline", "tests.fuzz"]):
    from tests.fuzz.targets import TARGETS


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in TARGETS:
        sys.exit(f"usage: python -m tests.fuzz.run {{{','.join(TARGETS)}}} [libFuzzer flags]")
    name, flags = sys.argv[1], sys.argv[2:]
    dirs = [f for f in flags if not f.startswith("-")]
    flags = [f for f in flags if f.startswith("-")]
    atheris.Setup([sys.argv[0], *flags, *dirs, str(CORPUS / name)], TARGETS[name])
    atheris.Fuzz()


if __name__ == "__main__":
    main()
