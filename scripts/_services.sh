# Sourced by test.sh: system packages the tests need, installed when missing.
need_apt=()
if [ -z "$(ls /usr/lib/postgresql/*/bin/initdb 2>/dev/null)" ]; then need_apt+=(postgresql); fi
if [ ! -x /usr/bin/chromium ]; then need_apt+=(chromium); fi
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "== installing ${need_apt[*]} (Debian packages)"
    SUDO=""; if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
