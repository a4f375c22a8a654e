#!/usr/bin/env bash
# Create .venv (Python 3.11+) and install chatsync with its test tools. Safe to run twice.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[test]"

# The web view's browser test (tests/cluster/test_web_view.py) drives headless Chromium
# through chromedriver: Debian's packages, installed here when missing (root or sudo).
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; elif sudo -n true 2>/dev/null; then SUDO="sudo -n"; else SUDO=no; fi
  if [ "$SUDO" != no ] && command -v apt-get >/dev/null; then
    echo "setup: installing chromium and chromium-driver (Debian's packages) for the browser test"
    if ! { $SUDO apt-get update -qq &&
           DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium chromium-driver >/dev/null; }; then
      echo "setup: apt-get could not install them: tests/cluster/test_web_view.py will fail" >&2
    fi
  else
    echo "setup: chromium/chromedriver missing and no apt-get as root: tests/cluster/test_web_view.py will fail" >&2
  fi
fi
