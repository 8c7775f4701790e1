# The two commands of README.md (run, test), and the edit-run loop's test-fast.
# Each creates or updates .venv when needed.
.PHONY: run test test-fast flakes
ARGS ?=
PYTEST_ARGS ?=
# pytest workers: one per core, at most 4 (each holds its own servers and
# engines). Work is handed out by module (modules that share an expensive
# fixture go together; tests/conftest.py), longest first.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); echo $$(( n > 4 ? 4 : n )))
XDIST = $(if $(filter-out 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile)

run:
	@scripts/setup.sh
	.venv/bin/python app.py $(ARGS)

# All three tiers (unit, engine, browser); the 20 slowest tests are listed at the end.
test:
	@scripts/setup.sh --test
	.venv/bin/python -m pytest $(XDIST) --durations=20 $(PYTEST_ARGS)

# The unit tier only: no engine, no browser; well under a minute.
test-fast:
	@scripts/setup.sh --test
	.venv/bin/python -m pytest -m unit -q $(PYTEST_ARGS)

# Reruns the tests with the most waits and timing checks (scripts/flakes.sh).
flakes:
	@scripts/setup.sh --test
	scripts/flakes.sh
