# The two commands a newcomer needs:  make run   (the whole system, demo included)
#                                     make test  (the test suite; needs PostgreSQL and Redis)
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/rsc
# Database 1, not 0: `make run`, the benches and other tools default to REDIS_URL's database 0,
# and the suite's cleanups SCAN their own databases, so keys others leave in 0 slowed every one
# of them (tests/redis_keys.py). xdist worker K uses 1 + 4K with 4 workers (test_settings.py).
TEST_REDIS_URL ?= redis://127.0.0.1:6379/1

.PHONY: install run test lint docs-api bench bench-heartbeat bench-dataplane bench-describe

# uv (pinned in requirements-dev.txt) installs the pinned requirements, pip among them: ~5 s
# where pip took ~25 s of a clean clone's `make test`. The interpreter's own pip puts uv in a
# venv made without pip (ensurepip took ~6 s); where that fails, ensurepip and pip do it all.
# uv reads pip's PIP_INDEX_URL and PIP_EXTRA_INDEX_URL (a mirror) as its own. --compile-bytecode
# (all of site-packages, ~8 s) as pip does: left to each module's first import, the suite's
# first processes compiled the same libraries side by side (one clean-clone run: 584 busy
# CPU-s against ~500).
UV = env $${PIP_INDEX_URL:+UV_INDEX_URL="$$PIP_INDEX_URL"} \
	$${PIP_EXTRA_INDEX_URL:+UV_EXTRA_INDEX_URL="$$PIP_EXTRA_INDEX_URL"} $(VENV)/bin/uv pip install -q --python $(PY)
$(VENV)/.installed: requirements.txt requirements-dev.txt
	$(PYTHON) -m venv --without-pip $(VENV)
	($(PYTHON) -m pip --python $(PY) install -q "$$(grep -m1 '^uv==' requirements-dev.txt)" \
		&& $(UV) --compile-bytecode -r requirements-dev.txt) \
		|| ($(PY) -m ensurepip --default-pip > /dev/null && $(VENV)/bin/pip install -q -r requirements-dev.txt)
	touch $@

# The member library, editable: `rsc-dataplane` and `python -m dataplane` work from any
# directory and always run this checkout's code. Its own stamp, so an existing venv gets it too.
$(VENV)/.dataplane-installed: $(VENV)/.installed dataplane/pyproject.toml
	$(UV) -e ./dataplane || PYTHONWARNINGS=ignore $(VENV)/bin/pip install -q -e ./dataplane
	touch $@

install: $(VENV)/.installed $(VENV)/.dataplane-installed

run: install
	$(PY) scripts/run.py

# Import contracts first (.importlinter: pure core, stand-alone data plane, the app layers).
# pytest-xdist runs the suite on TEST_WORKERS processes (most tests wait on servers, Redis,
# PostgreSQL or Celery, not the CPU), each with a database and a Redis database of its own
# (coordinator_project/test_settings.py); tests that share one machine-wide thing run on one
# worker (tests/conftest.py, XDIST_GROUPS). TEST_WORKERS=0 runs in this process.
TEST_WORKERS ?= 4
# The suite starts hundreds of Python processes (servers, manage.py, members); where
# PYTHONDONTWRITEBYTECODE is set none of them caches bytecode, and in a fresh clone each compiles
# the project's modules again. compileall writes them once (stale ones only) to __pycache__.
# pytest caches each test module with its asserts rewritten, but not where that variable is
# set: then every xdist worker rewrote them all (~5 of its ~9 CPU-s of collection). pytest runs
# without it, and one collection writes that cache while the import check and compileall run.
TEST_ENV = env -u PYTHONDONTWRITEBYTECODE DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} \
	REDIS_URL=$${REDIS_URL:-$(TEST_REDIS_URL)}
test: install
	$(TEST_ENV) $(VENV)/bin/pytest -q -p no:cacheprovider --collect-only $(PYTEST_ARGS) > /dev/null 2>&1 & warm=$$!; \
	$(VENV)/bin/lint-imports --no-logo --no-cache \
	&& $(PY) -m compileall -q -x '/(build|var|node_modules)/' coordinator_project coordination groups members \
		assignments webserver dataplane tests bench scripts manage.py > /dev/null; \
	status=$$?; wait $$warm; exit $$status
	$(TEST_ENV) $(VENV)/bin/pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadgroup --durations=15 $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# The member library's API reference (HTML, from its docstrings) into build/api/dataplane.html.
docs-api: install
	$(VENV)/bin/pdoc -o build/api dataplane

bench: bench-heartbeat bench-dataplane bench-describe

# BENCH_SCALE=10k: 10,000 members over 16,384 shards (issue 26) instead of 1,000 over 4,096;
# the rolling restart runs at the default size only.
bench-heartbeat: install
	DATABASE_URL=$${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/rsc_bench} $(PY) bench/heartbeat.py
	if [ -z "$${BENCH_SCALE}" ] || [ "$${BENCH_SCALE}" = 1k ]; then \
		DATABASE_URL=$${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/rsc_bench_rolling} $(PY) bench/rolling_restart.py; fi

bench-dataplane: install
	REDIS_URL=$${REDIS_URL:-redis://127.0.0.1:6379/0} $(PY) bench/dataplane.py
	$(PY) bench/dataplane_cpu.py

bench-describe: install
	DATABASE_URL=$${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/rsc_bench_describe} \
		REDIS_URL=$${REDIS_URL:-redis://127.0.0.1:6379/0} $(PY) bench/describe.py
