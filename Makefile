# The README's two commands, `make demo` and `make test`, are all a new machine needs:
# both build .venv from requirements.lock first when it is missing or stale.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
JARS_STAMP := $(VENV)/.delta-jars
CLASSES_STAMP := $(VENV)/.class-archive
LOCAL_FS_STAMP := $(VENV)/.local-fs
DEMO_OUT ?= demo-out

.PHONY: venv delta-jars class-archive system-deps toxiproxy docs-assets interop-build interop demo test test-native check bench lock clean

$(STAMP): requirements.lock pyproject.toml setup.py $(wildcard broker_runtime/store/_accel*.[ch]) \
          broker_runtime/remoting/_header.c $(wildcard pipeline/readers/_scan*.[ch])
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.lock
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -e .
	@touch $(STAMP)

venv: $(CLASSES_STAMP)

# Delta Lake's jars for the installed delta-spark, resolved once into Spark's Ivy cache
# (~/.ivy2.5.2) from Maven Central, so that later sessions start offline with the native
# Delta backend. Without network this says so and the pipeline falls back to the embedded
# delta-rs backend; `make delta-jars` tries again.
$(JARS_STAMP): $(STAMP)
	@$(PY) -m pipeline.spark_session fetch-delta-jars \
	  || echo "Delta Lake jars not fetched: the embedded delta-rs backend will be used"
	@touch $(JARS_STAMP)

delta-jars: $(STAMP)
	$(PY) -m pipeline.spark_session fetch-delta-jars
	@touch $(JARS_STAMP)

# Hadoop's local file system without a `chmod` process per file and directory it makes
# (pipeline/local_fs.py), compiled with the JDK's javac; without javac, sessions use Hadoop's.
$(LOCAL_FS_STAMP): $(STAMP) pipeline/java/NioLocalFileSystem.java
	@$(PY) -m pipeline.local_fs build \
	  || echo "local file system class not built: Spark sessions use Hadoop's RawLocalFileSystem"
	@touch $(LOCAL_FS_STAMP)

# An archive of the JVM classes one small `pipeline run` loads (pipeline/class_archive.py):
# on JDK 25+ (local sessions run on the newest installed, pipeline/jvm.py) an AOT cache that
# also keeps the methods' profiles, else a class-data-sharing archive. Later Spark sessions
# map it instead of loading those classes again. Made once per .venv, after the Delta jars
# (about 2 minutes); without it, sessions start as before.
$(CLASSES_STAMP): $(JARS_STAMP) $(LOCAL_FS_STAMP) pipeline/class_archive.py pipeline/jvm.py
	@$(PY) -m pipeline.class_archive build \
	  || echo "class archive not made: Spark sessions load their classes without it"
	@touch $(CLASSES_STAMP)

class-archive: $(JARS_STAMP) $(LOCAL_FS_STAMP)
	$(PY) -m pipeline.class_archive build
	@touch $(CLASSES_STAMP)

# Debian programs the tests start on loopback (ledgers on PostgreSQL, de-dup on Redis, the
# reports rendered in headless Chromium, RabbitMQ audited like our own brokers, npm for the
# Data Docs' offline assets). Needs root and apt; elsewhere install them by hand, or the tests
# that need them skip (they fail instead when CI=true).
# Each is installed only where its program is missing: installing Debian's npm beside a
# NodeSource nodejs (which ships npm) is refused by apt.
system-deps:
	@missing=""; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	command -v mvn >/dev/null || missing="$$missing maven"; \
	command -v npm >/dev/null || missing="$$missing npm"; \
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$$missing postgresql"; \
	test -x /usr/lib/rabbitmq/bin/rabbitmq-server || missing="$$missing rabbitmq-server"; \
	if [ -z "$$missing" ]; then echo "system packages present"; \
	else echo "installing:$$missing"; apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; fi
	@$(MAKE) --no-print-directory toxiproxy

# Toxiproxy, the fault-injecting proxy of the replication tests (tests/fault_proxy.py): not in
# Debian, so built from the Go module proxy into .venv/bin when `go` is installed.
TOXIPROXY := $(VENV)/bin/toxiproxy-server
TOXIPROXY_VERSION := v2.12.0
toxiproxy:
	@if [ -x $(TOXIPROXY) ]; then echo "toxiproxy present"; \
	elif command -v go >/dev/null; then \
	  tmp=$$(mktemp -d) && GOBIN=$$tmp go install \
	    github.com/Shopify/toxiproxy/v2/cmd/server@$(TOXIPROXY_VERSION) && \
	  mkdir -p $(VENV)/bin && mv $$tmp/server $(TOXIPROXY) && rm -rf $$tmp; \
	else echo "no go: toxiproxy not built (the replication fault tests will skip)"; fi

# Great Expectations' Data Docs load bootstrap, jQuery, bootstrap-table, vega and font-awesome
# from CDNs; the gates copy these pinned npm packages (expectations/docs_assets/package*.json)
# next to the pages instead, so that the docs read offline. Needs npm once (Node 20); npm's
# own cache in ~/.npm serves later installs offline. Without npm the pages keep their CDN links.
DOCS_ASSETS := $(VENV)/share/mqaudit-docs-assets
DOCS_ASSETS_STAMP := $(DOCS_ASSETS)/node_modules/.mqaudit-installed
$(DOCS_ASSETS_STAMP): expectations/docs_assets/package.json expectations/docs_assets/package-lock.json
	@if command -v npm >/dev/null; then \
	  mkdir -p $(DOCS_ASSETS) && cp expectations/docs_assets/package.json \
	    expectations/docs_assets/package-lock.json $(DOCS_ASSETS)/ && \
	  cd $(DOCS_ASSETS) && npm ci --prefer-offline --ignore-scripts --no-audit --no-fund \
	    --legacy-peer-deps --loglevel=error && touch $(CURDIR)/$(DOCS_ASSETS_STAMP); \
	else echo "npm missing: Data Docs will load their scripts from CDNs (make system-deps installs it)"; fi

docs-assets: $(DOCS_ASSETS_STAMP)

demo: $(CLASSES_STAMP) docs-assets
	$(VENV)/bin/mqaudit demo --out $(DEMO_OUT)

# Two workers (the CI machine has 2 cores; most tests wait on servers and subprocesses).
# A test file runs on one worker, in order, so its module fixtures (clusters, workloads,
# lakes) are built once; files start in collection order (tests/conftest.py puts the longest
# first; xdist would otherwise start the files with the most tests first). TEST_WORKERS=0
# runs everything in this process.
TEST_WORKERS ?= 2
test: $(CLASSES_STAMP) interop-build docs-assets
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# The whole suite on the native delta-spark backend (`make test` runs most of it embedded).
test-native: $(CLASSES_STAMP) interop-build docs-assets
	MQAUDIT_DELTA_BACKEND=native $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# Apache RocketMQ for the interop tests (tests/interop/pom.xml): the first build downloads it
# from Maven Central into ~/.m2, later ones run offline. Skipped where java or mvn is missing.
INTEROP_STAMP := tests/interop/target/classpath.txt
$(INTEROP_STAMP): tests/interop/pom.xml $(wildcard tests/interop/java/mqinterop/*.java)
	@if command -v java >/dev/null && command -v mvn >/dev/null; then \
	  mvn -q -o -f tests/interop/pom.xml compile 2>/dev/null || mvn -q -f tests/interop/pom.xml compile; \
	  touch $(INTEROP_STAMP); \
	else echo "java or mvn missing: the interop tests will skip (make system-deps installs maven)"; fi

# Apache RocketMQ 5's broker and name server (tests/interop/rocketmq5/pom.xml): the test that
# reads a store RocketMQ 5 wrote.
INTEROP5_STAMP := tests/interop/rocketmq5/target/classpath.txt
$(INTEROP5_STAMP): tests/interop/rocketmq5/pom.xml
	@if command -v java >/dev/null && command -v mvn >/dev/null; then \
	  mvn -q -o -f tests/interop/rocketmq5/pom.xml compile 2>/dev/null || mvn -q -f tests/interop/rocketmq5/pom.xml compile; \
	  touch $(INTEROP5_STAMP); \
	fi

interop-build: $(INTEROP_STAMP) $(INTEROP5_STAMP)

# The interop suite alone: Apache RocketMQ's own clients, mqadmin and broker against mqaudit's.
interop: $(STAMP) interop-build
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder tests/interop

check: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

bench: $(CLASSES_STAMP) interop-build
	$(PY) benchmarks/store_bench.py
	$(PY) benchmarks/cluster_bench.py
	$(PY) benchmarks/ingest_bench.py
	$(PY) benchmarks/workload_bench.py
	$(PY) benchmarks/audit_bench.py
	$(PY) benchmarks/demo_bench.py

# Re-resolve the pins from pyproject.toml (needs the package registries).
lock:
	rm -rf .lock-venv && $(PYTHON) -m venv .lock-venv
	.lock-venv/bin/pip install --quiet -e '.[pipeline,expectations,airflow,dev]'
	{ echo "# Exact pins for every package, produced by 'make lock' (pip freeze)."; \
	  .lock-venv/bin/pip freeze --exclude-editable | grep -v '^-e'; } > requirements.lock
	rm -rf .lock-venv

clean:
	rm -rf $(VENV) $(DEMO_OUT) bench-out
