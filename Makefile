# deltabus: `make demo` runs the main job end to end, `make test` runs the tests.
SHELL := /bin/bash
PY := .venv/bin/python
UV := python3 -m uv
UV_VERSION := 0.13.8
export GX_ANALYTICS_ENABLED := false
export DAGSTER_HOME ?= $(CURDIR)/.deltabus/dagster_home

.PHONY: help venv baseline kafka-jars opensearch-jars opensearch opensearch-down minio-bin toxiproxy-bin minio minio-down postgres postgres-down dagster-home demo test multihost chaos spark lint format bench ui clean docs docs-check deploy-check

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

.venv/.synced: pyproject.toml uv.lock
	@python3 -m uv --version >/dev/null 2>&1 || python3 -m pip install -q "uv==$(UV_VERSION)"
	$(UV) sync --frozen --python 3.11 --all-extras
	@touch $@

venv: .venv/.synced  ## create the virtualenv with the pinned packages, every extra and the dev tools

minio-bin: venv  ## build the pinned MinIO with `go install` (cached in ~/.cache/deltabus)
	$(PY) -m deltabus minio build

toxiproxy-bin: venv  ## build the pinned toxiproxy (bench --store) with `go install` (cached in ~/.cache/deltabus)
	$(PY) -m deltabus_bench.store_profiles build

minio: minio-bin  ## start a local MinIO on loopback and create the bucket (writes .env)
	$(PY) -m deltabus minio up

minio-down:  ## stop the local MinIO
	$(PY) -m deltabus minio down

postgres: venv  ## start a local PostgreSQL on loopback for the serving sink (writes its DSN to .env)
	$(PY) -m deltabus postgres up

postgres-down:  ## stop the local PostgreSQL
	$(PY) -m deltabus postgres down

dagster-home:
	@mkdir -p $(DAGSTER_HOME)
	@test -f $(DAGSTER_HOME)/dagster.yaml || cp platform/dagster.yaml $(DAGSTER_HOME)/dagster.yaml

demo: minio postgres opensearch dagster-home  ## set everything up, run pipeline_job then its producer run's checks + latency through Dagster, print them
	@echo "running pipeline_job (one stream window: the ETL transforms as the producer writes), then producer_run_job for its producer run (log: .deltabus/pipeline_job.log)"
	@set -o pipefail; $(PY) -m tools.launch pipeline_job --then producer_run_job 2>&1 \
	  | tee .deltabus/pipeline_job.log | $(PY) -m tools.progress \
	  || { tail -n 40 .deltabus/pipeline_job.log; exit 1; }
	@echo "serving timezone_unified in PostgreSQL (served_rows next to unified_net_rows):"
	$(PY) -m deltabus serve postgres --once
	@echo "indexing timezone_unified in OpenSearch (indexed_docs next to unified_net_rows):"
	$(PY) -m deltabus serve opensearch --once
	$(PY) -m tools.report

ui: minio dagster-home  ## Dagster UI + daemon (sensors, schedules) on http://127.0.0.1:3000
	$(PY) -m dagster dev -h 127.0.0.1 -p 3000

# `make bench` runs these workload files (workloads/*.yaml); any other runs with
# `deltabus bench --workload workloads/NAME.yaml`.
BENCH_WORKLOADS ?= sweep-100ms sweep-1000ms idle store-s3-standard

bench: venv minio-bin kafka-jars toxiproxy-bin  ## latency + cost sweeps of workloads/ (Kafka side by side, idle cost, behind an S3 Standard latency profile); reports in bench-out/
	for w in $(BENCH_WORKLOADS); do $(PY) -m deltabus bench --workload workloads/$$w.yaml || exit 1; done

# Most tests wait on servers and child processes: two processes keep both cores busy.
TEST_WORKERS ?= 2
BASELINE_WORKLOADS ?= sweep-100ms sweep-1000ms idle idle-5m idle-30m store-s3-standard store-s3-express serve-postgres serve-opensearch
BASELINE_OUT ?= bench-out/baseline

baseline: venv minio-bin kafka-jars toxiproxy-bin opensearch-jars  ## run BASELINE_WORKLOADS from a clean checkout and write docs/benchmarks/results.md from their reports (one date, commit, CPU)
	@test -z "$$(git status --porcelain --untracked-files=no)" || { echo "baseline: commit or stash your changes first: a baseline names one clean commit" >&2; exit 2; }
	rm -rf $(BASELINE_OUT)
	failed=; for w in $(BASELINE_WORKLOADS); do $(PY) -m deltabus bench --workload workloads/$$w.yaml --out $(BASELINE_OUT)/$$w || failed="$$failed $$w"; done; \
	$(PY) -m deltabus_bench.baseline $(BASELINE_OUT) --long-runs docs/benchmarks/long-runs --out docs/benchmarks/results.md || exit 1; \
	test -z "$$failed" || { echo "baseline: the page is written; these workloads reported errors (see their report.md):$$failed" >&2; exit 1; }

opensearch-jars:  ## fetch the embedded OpenSearch node's jars with Maven (cached in ~/.cache/deltabus)
	bash platform/opensearch.sh fetch

opensearch: venv opensearch-jars  ## start a local OpenSearch node on loopback for the index sink (writes its URL to .env)
	$(PY) -m deltabus opensearch up

opensearch-down:  ## stop the local OpenSearch node
	$(PY) -m deltabus opensearch down

kafka-jars:  ## fetch Apache Kafka's and Kafka Streams' jars with Maven, compile the Kafka Streams ETL (cached in ~/.cache/deltabus)
	bash platform/kafka.sh fetch
	bash platform/kafka-streams.sh build

test: venv minio-bin kafka-jars toxiproxy-bin opensearch-jars  ## run the test suite (starts its own MinIO)
	$(PY) -m pytest -q -m "not multihost and not spark" -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=20

multihost:  ## (root) link cuts under ETL replicas and group members on 5 network-namespace hosts
	@if [ "$$(id -u)" != 0 ]; then \
	  echo "make multihost: needs root (network namespaces, veth pairs, a bridge); run it as root" >&2; \
	  exit 2; fi
	$(MAKE) --no-print-directory venv minio-bin
	$(PY) -m pytest -q -s -m multihost

spark: venv minio-bin  ## Delta Spark interop suite (pyspark + delta-spark, Delta/s3a jars from Maven; cached)
	$(UV) sync --frozen --python 3.11 --group spark --inexact
	bash platform/spark.sh fetch
	# The benchmark's Spark test runs last: its Spark session has no Delta catalog.
	DELTABUS_SPARK_REQUIRED=1 $(PY) -m pytest -q -m spark tests/test_spark_interop.py \
	  tests/test_spark_log_cleanup.py tests/test_checkpoint_writer.py
	DELTABUS_SPARK_REQUIRED=1 $(PY) -m pytest -q -m spark tests/test_bench_spark.py

chaos: venv minio-bin  ## seeded chaos soak: 10 min of SIGKILLs, MinIO restarts, second ETLs, then the count; SEED=n CHAOS_SECONDS=s
	DELTABUS_CHAOS_SECONDS=$${CHAOS_SECONDS:-600} DELTABUS_CHAOS_SEED=$${SEED:-1} \
	  $(PY) -m pytest -q -s tests/test_chaos_soak.py

lint: venv dagster-home docs-check  ## ruff lint and format check, the import rules, the Dagster definitions (dg check defs), the docs check
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	.venv/bin/lint-imports
	VIRTUAL_ENV=$(CURDIR)/.venv .venv/bin/dg check defs

docs: venv  ## regenerate the configuration table and the CLI reference in docs/
	$(PY) -m tools.docs generate

docs-check: venv  ## check the docs: relative links and anchors, generated parts up to date
	$(PY) -m tools.docs check

deploy-check:  ## Helm chart offline: lint, render (default and ci/ values), validate against Kubernetes schemas (helm, kubernetes-validate cached in ~/.cache/deltabus)
	bash platform/deploy-check.sh check

format: venv
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

clean:
	rm -rf .deltabus lake results.csv bench-out artifacts
