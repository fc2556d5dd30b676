# The two commands of the README: `make demo` and `make test`. Everything they
# need is installed from here, so a fresh machine (Debian, Python 3.11) works.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install servers lint typecheck sql docs test test-fast test-bench demo dist clean

$(STAMP): pyproject.toml tools/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,spark,dashboard,docs,otel,embedded]' -e './tools[demo,bench]'
	touch $(STAMP)

# The venv, and the machine's server packages the tests start throwaway
# servers from (PostgreSQL, Redis, PgBouncer, Chromium, Java: see the script).
install: $(STAMP) servers

servers:
	bash infra/install-servers.sh

# import-linter's contracts (pyproject.toml, [tool.importlinter]): the layers
# of rota, no import cycle, no import where it has no business.
lint: $(STAMP)
	$(VENV)/bin/ruff check rota tools tests
	$(VENV)/bin/ruff format --check rota tools tests
	$(VENV)/bin/lint-imports

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# The functions made of named parts (rota/sql/parts/), rendered to their
# files of rota/sql/functions/ (rota/sql/render.py): run after editing a
# part, and commit both (tests/unit/test_sql_render.py compares them).
sql: $(STAMP)
	$(PY) -m rota.sql.render

# The documentation site (mkdocs.yml), its reference pages generated from the
# code at build time (tools/rota_tools/docs_reference.py); --strict makes a
# broken link or a docstring the build cannot read an error.
DOCS_SITE ?= build/site
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet --site-dir $(DOCS_SITE)

# The whole suite on TEST_WORKERS processes (pytest-xdist), each with its own
# servers; tests sharing a module's fixture stay on one, slow ones go first
# (tests/conftest.py).
TEST_WORKERS ?= 2
test: install lint typecheck docs
	$(PY) -m pytest tests -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder

# The benchmark tier alone: each `rota bench` scenario small, asserting what
# it must show (tests/bench); `make test` runs it too.
test-bench: $(STAMP)
	$(PY) -m pytest tests/bench -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder

# The unit tier: no servers, no network (tests/unit/conftest.py refuses
# sockets; fakeredis stands in for Redis), seconds.
test-fast: $(STAMP)
	$(PY) -m pytest tests/unit -q

# Needs no server package: without ROTA_DATABASE_URL / ROTA_REDIS_URL the demo
# runs on the embedded servers (`rota dev`'s), without Java on the Python loader.
demo: $(STAMP)
	$(PY) -m rota demo

# The wheels and sdists of both distributions, rota and rota-tools (tools/).
dist: $(STAMP)
	rm -rf dist
	$(PY) -m build --outdir dist .
	$(PY) -m build --outdir dist tools

clean:
	rm -rf $(VENV) dist .mypy_cache .ruff_cache .pytest_cache $(DOCS_SITE)
