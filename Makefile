# The two commands of README.md. Both create or update .venv when needed.
.PHONY: run test
ARGS ?=
PYTEST_ARGS ?=

run:
	@scripts/setup.sh
	.venv/bin/python app.py $(ARGS)

test:
	@scripts/setup.sh --test
	.venv/bin/python -m pytest $(PYTEST_ARGS)
