# The README's two commands, `make demo` and `make test`, are all a new machine needs:
# both build .venv from requirements.lock first when it is missing or stale.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_OUT ?= demo-out

.PHONY: venv demo test check bench lock clean

$(STAMP): requirements.lock pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.lock
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -e .
	@touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/mqaudit demo --out $(DEMO_OUT)

test: $(STAMP)
	$(PY) -m pytest

check: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check broker_runtime tests benchmarks
	$(VENV)/bin/mypy

bench: $(STAMP)
	$(PY) benchmarks/store_bench.py

# Re-resolve the pins from pyproject.toml (needs the package registries).
lock:
	rm -rf .lock-venv && $(PYTHON) -m venv .lock-venv
	.lock-venv/bin/pip install --quiet -e '.[pipeline,expectations,airflow,dev]'
	{ echo "# Exact pins for every package, produced by 'make lock' (pip freeze)."; \
	  .lock-venv/bin/pip freeze --exclude-editable | grep -v '^-e'; } > requirements.lock
	rm -rf .lock-venv

clean:
	rm -rf $(VENV) $(DEMO_OUT) bench-out
