# Sourced by the scripts: create ./.venv (once) and install the project with
# the given extras. Needs only python3 (3.11+) on the machine.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11+ is required"'
    "$PY" -m venv "$VENV"
fi
stamp="$VENV/.installed-$(cat "$ROOT/pyproject.toml" | sha1sum | cut -c1-12)-${EXTRAS}"
if [ ! -f "$stamp" ]; then
    "$VENV/bin/python" -m pip install --quiet --upgrade pip >/dev/null
    "$VENV/bin/python" -m pip install --quiet -e "$ROOT[$EXTRAS]"
    touch "$stamp"
fi
export PATH="$VENV/bin:$PATH"
