# onceflow: two commands matter: `make run` and `make test`. Everything they need is installed here.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# uv comes from PyPI (.ci/uv installs it when missing); Python downloads are off because only
# package registries are reachable.
UV := PYTHON=$(PYTHON) bash .ci/uv
export UV_PYTHON_DOWNLOADS := never
PYTEST_ARGS ?=

.PHONY: help install bytecode wheel-test-envs published-schemas system-deps lint format test test-fast test-slow bench bench-quick run clean docs docs-screenshots

help:
	@echo "make run    start Airflow on embedded defaults (SQLite, Sheets emulator) with this repo's DAGs"
	@echo "make test   lint + the whole test suite (set ONCEFLOW_TEST_DATABASE_URL for PostgreSQL)"
	@echo "make lint   ruff + mypy only;  make test-slow  the slow suite"
	@echo "make bench  every benchmark at full size (hours);  make bench-quick  the same at small sizes"
	@echo "make docs   build the documentation site into site/ (make test builds it strictly: tests/docs)"
	@echo "make docs-screenshots  re-take the quickstart's pictures by following it (slow; commit docs/img)"

# --compile-bytecode: every Airflow process (each task is one) would otherwise compile its imports
# from source, where PYTHONDONTWRITEBYTECODE is set (as here) or site-packages is read-only: on
# 2 cores, importing airflow.sdk took 5 s instead of 2, pandas 1.2 s of CPU instead of 0.4.
# (The Makefile is a prerequisite so that a venv synced before a change to this rule is synced again.)
$(VENV)/.synced: pyproject.toml uv.lock Makefile
	$(UV) sync --frozen --compile-bytecode --python $(PYTHON)
	@touch $@

# This repository's own modules (an editable install, so not compiled by uv). checked-hash: each
# import compares the source's hash, so an edit, a git checkout or a bisect step never runs a stale
# .pyc (mtime-and-size pycs can: same size, same second). A read-only checkout just skips this.
bytecode: $(VENV)/.synced
	@$(PY) -m compileall -q --invalidation-mode checked-hash providers \
		|| echo "providers/ not compiled (read-only, or a file that does not compile): its modules compile at import"

install: system-deps bytecode wheel-test-envs published-schemas

# The wheel tests run uv offline (uv is not Python: the network guard cannot see it). This step,
# with the network, builds their cached Airflow venvs of each supported minor and fills uv's
# cache with what they install; it writes a stamp and is a no-op until uv.lock or
# tests/acceptance/wheel_env.py changes. See docs/testing.md, "The network guard".
wheel-test-envs: $(VENV)/.synced
	@$(PY) tests/acceptance/wheel_env.py prepare

# The Compose Specification's and Kubernetes' JSON schemas the deployment tests validate against,
# from two pinned PyPI wheels (check-jsonschema, kubernetes-validate) into ~/.cache/onceflow/schemas;
# a no-op once there. Nothing of them is committed. See docs/testing.md, "Published schemas".
published-schemas: $(VENV)/.synced
	@$(PY) tests/unit/published_schemas.py prepare

# Debian packages the tests use (unshare for the parse guard, apertium and apertium-eng-spa for the article chain).
system-deps:
	@bash .ci/system-deps

lint: $(VENV)/.synced
	$(VENV)/bin/ruff check providers tests dags plugins benchmarks docs/_build
	$(VENV)/bin/ruff format --check providers tests dags plugins benchmarks docs/_build
	$(VENV)/bin/mypy

format: $(VENV)/.synced
	$(VENV)/bin/ruff check --fix providers tests dags plugins benchmarks docs/_build
	$(VENV)/bin/ruff format providers tests dags plugins benchmarks docs/_build

test: install lint
	$(VENV)/bin/pytest -m "not slow" $(PYTEST_ARGS)

test-fast: install
	$(VENV)/bin/pytest tests/unit $(PYTEST_ARGS)

test-slow: install
	$(VENV)/bin/pytest -m slow $(PYTEST_ARGS)

bench: install
	@set -e; for b in benchmarks/bench_*.py; do echo "=== $$b"; $(PY) $$b; done

# The same comparisons at small sizes: minutes instead of hours (the 730-day backfill alone is ~2 h).
bench-quick: install
	$(PY) benchmarks/bench_dag_parse.py --repeat 3
	$(PY) benchmarks/bench_sheet_claims.py --quick
	$(PY) benchmarks/bench_sheet_wakeup_cost.py --quick
	$(PY) benchmarks/bench_ledger_claims.py --items 2000 --claimers 1,4,16
	$(PY) benchmarks/bench_partition_load.py --rows 100000
	$(PY) benchmarks/bench_depends_on_past.py --quick
	$(PY) benchmarks/bench_backfill.py --quick
	$(PY) benchmarks/bench_task_waits.py --quick
	$(PY) benchmarks/bench_staging_formats.py --sizes 100,1000,5000 --repeat 1
	$(PY) benchmarks/bench_article_chain.py --quick

# No system-deps: `make run` needs neither root nor the test tools.
# ONCEFLOW_HOME and RUN_ARGS (e.g. RUN_ARGS="--port 8090") are for tests and second copies.
ONCEFLOW_HOME ?= .onceflow
RUN_ARGS ?=
run: bytecode
	$(VENV)/bin/onceflow up --home $(ONCEFLOW_HOME) $(RUN_ARGS)

# The site (mkdocs.yml): --strict fails on any warning, broken link or missing anchor. tests/docs/
# builds it the same way in `make test`. (NO_MKDOCS_2_WARNING: Material's notice about its successor.)
docs: $(VENV)/.synced
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

# The quickstart's pictures (docs/img/quickstart-*.png): follows the quickstart with make run and
# headless Chromium (tests/docs/test_quickstart_follow.py, slow: about 20 minutes), then commit them.
docs-screenshots: $(VENV)/.synced
	$(VENV)/bin/pytest tests/docs/test_quickstart_follow.py -m slow -k following -q

clean:
	rm -rf .onceflow .tools .pytest_cache .mypy_cache .ruff_cache site
