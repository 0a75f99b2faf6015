#!/usr/bin/env bash
# Set everything up and run the demo on the embedded default (SQLite).
set -euo pipefail
EXTRAS="server"
source "$(dirname "$0")/_venv.sh"
cd "$ROOT"
exec python examples/charge_and_provision.py "$@"
