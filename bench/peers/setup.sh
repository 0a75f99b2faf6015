#!/usr/bin/env bash
# Creates bench/peers/.venv with the peers the comparison runs (DBOS Transact),
# apart from the project's own virtualenv so neither's dependencies move the other.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python="${PYTHON:-python3.11}"
if [ ! -x "$here/.venv/bin/python" ]; then
    "$python" -m venv "$here/.venv"
fi
"$here/.venv/bin/python" -m pip install --quiet --upgrade pip
"$here/.venv/bin/python" -m pip install --quiet "dbos==${DBOS_VERSION:-3.4.0}" "psycopg[binary]>=3.1"
"$here/.venv/bin/python" -c "import dbos, importlib.metadata as m; print('dbos', m.version('dbos'))"
