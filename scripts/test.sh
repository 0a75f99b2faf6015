#!/usr/bin/env bash
# Set everything up and run the whole test suite: lint, types, tests.
set -euo pipefail
EXTRAS="dev,server,postgres,crypto,otel,sqlalchemy"
source "$(dirname "$0")/_venv.sh"
cd "$ROOT"
source scripts/_services.sh
echo "== ruff";  ruff check stepstone tests bench examples && ruff format --check stepstone tests bench examples
echo "== mypy";  mypy  # strict over stepstone, tests, bench and examples ([tool.mypy] files)
echo "== imports"; lint-imports --no-logo  # the layers of docs/architecture.md (pyproject.toml)
# The PostgreSQL tests start a private cluster (tests/pgcluster.py); with CI set,
# a missing PostgreSQL fails them instead of skipping them.
export CI="${CI:-1}"
# Two test processes (the machine's two cores): much of the suite waits on real
# processes, servers and commits. STEPSTONE_TEST_WORKERS=0 runs it in one process.
echo "== pytest"; python -m pytest -q -n "${STEPSTONE_TEST_WORKERS:-2}" "$@"
