#!/usr/bin/env bash
# Flake hunt: rerun the 30 tests with the most waits and timing checks 5 times
# each (scripts/flakes.py says how they are chosen). Usage: scripts/flakes.sh [--top N] [--runs N] [--workers N] [--list]
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python scripts/flakes.py "$@"
