# The two commands of README.md (run, test), and the edit-run loop's test-fast.
# Each creates or updates .venv when needed.
.PHONY: run test test-fast flakes docs
ARGS ?=
PYTEST_ARGS ?=
# Python caches the bytecode of what it imports, even where
# PYTHONDONTWRITEBYTECODE is set: a test set-up leaves compiling to the
# first imports (scripts/setup.sh), instead of compiling all 3 GB up front.
PY = env -u PYTHONDONTWRITEBYTECODE .venv/bin/python
# pytest workers: two on a 2-core machine (this project's and CI's:
# 15-21 min here by the day, against about 19 serial; three were no
# faster), one per two cores above that. Work is handed out by module
# (modules that share an expensive fixture go together; tests/conftest.py),
# longest first.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); echo $$(( n / 2 > 2 ? n / 2 : (n > 1 ? 2 : 1) )))
XDIST = $(if $(filter-out 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile)

run:
	@scripts/setup.sh
	$(PY) app.py $(ARGS)

# All three tiers (unit, engine, browser); the 20 slowest tests are listed at the end.
test:
	@scripts/setup.sh --test
	$(PY) -m pytest $(XDIST) --durations=20 $(PYTEST_ARGS)

# The unit tier only: no engine, no browser; well under a minute.
test-fast:
	@scripts/setup.sh --test
	$(PY) -m pytest -m unit -q $(PYTEST_ARGS)

# The documentation site (MkDocs, Material theme) into site/; --strict: a
# broken link or anchor fails the build (tests/test_docs_site.py builds it too).
docs:
	@scripts/setup.sh --test
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

# Reruns the tests with the most waits and timing checks (scripts/flakes.sh),
# on make test's workers.
flakes:
	@scripts/setup.sh --test
	env -u PYTHONDONTWRITEBYTECODE scripts/flakes.sh --workers $(TEST_WORKERS)
