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
# pip's output (editable-install warnings, progress) is shown only if it fails.
quietly() {
    local log
    log="$(mktemp)"
    if ! "$@" >"$log" 2>&1; then
        cat "$log" >&2
        rm -f "$log"
        echo "failed: $*" >&2
        return 1
    fi
    rm -f "$log"
}
if [ ! -f "$stamp" ]; then
    echo "Installing stepstone[$EXTRAS] into $VENV ..." >&2
    quietly "$VENV/bin/python" -m pip install --upgrade pip
    quietly "$VENV/bin/python" -m pip install -e "$ROOT[$EXTRAS]"
    touch "$stamp"
fi
export PATH="$VENV/bin:$PATH"
