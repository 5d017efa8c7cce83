# deltabus: `make demo` runs the main job end to end, `make test` runs the tests.
SHELL := /bin/bash
PY := .venv/bin/python
UV := python3 -m uv
UV_VERSION := 0.13.8
export GX_ANALYTICS_ENABLED := false
export DAGSTER_HOME ?= $(CURDIR)/.deltabus/dagster_home

.PHONY: help venv minio-bin minio minio-down demo test lint format bench ui clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

.venv/.synced: pyproject.toml uv.lock
	@python3 -m uv --version >/dev/null 2>&1 || python3 -m pip install -q "uv==$(UV_VERSION)"
	$(UV) sync --frozen --python 3.11
	@touch $@

venv: .venv/.synced  ## create the virtualenv with the pinned packages

minio-bin: venv  ## build the pinned MinIO with `go install` (cached in ~/.cache/deltabus)
	$(PY) -m deltabus minio build

minio: minio-bin  ## start a local MinIO on loopback and create the bucket (writes .env)
	$(PY) -m deltabus minio up

minio-down:  ## stop the local MinIO
	$(PY) -m deltabus minio down

demo: minio  ## set everything up and run the main job end to end against MinIO
	$(PY) -m deltabus demo

test: venv minio-bin  ## run the test suite (starts its own MinIO)
	$(PY) -m pytest -q

lint: venv  ## ruff lint and format check
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: venv
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

clean:
	rm -rf .deltabus lake results.csv
