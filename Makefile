# The two commands of README.md (run, test), and the edit-run loop's test-fast.
# Each creates or updates .venv when needed.
.PHONY: run test test-fast flakes
ARGS ?=
PYTEST_ARGS ?=
# The engine and browser tiers spend much of their time waiting (servers
# starting, streams, the browser): two pytest workers keep both cores busy.
# Each test module stays on one worker, with its own servers.
TEST_WORKERS ?= 2

run:
	@scripts/setup.sh
	.venv/bin/python app.py $(ARGS)

# All three tiers (unit, engine, browser); the 20 slowest tests are listed at the end.
test:
	@scripts/setup.sh --test
	.venv/bin/python -m pytest -n $(TEST_WORKERS) --dist loadfile --durations=20 $(PYTEST_ARGS)

# The unit tier only: no engine, no browser; well under a minute.
test-fast:
	@scripts/setup.sh --test
	.venv/bin/python -m pytest -m unit -q $(PYTEST_ARGS)

# Reruns the tests with the most waits and timing checks (scripts/flakes.sh).
flakes:
	@scripts/setup.sh --test
	scripts/flakes.sh
