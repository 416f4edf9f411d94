#!/usr/bin/env bash
# One entry point for a fresh machine (only Python 3.11+ needed):
#   bash infra/bootstrap.sh up [jetfleet up flags]    set up .venv, run the local fleet
#   bash infra/bootstrap.sh test [pytest args]        set up .venv with test extras, lint, test
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${JETFLEET_VENV:-.venv}

setup() {
  local extras=$1
  if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
  fi
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null 2>&1 || true
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e ".${extras}"
}

cmd=${1:-help}
shift || true
case "$cmd" in
  up)
    setup ""
    exec "$VENV/bin/jetfleet" up "$@"
    ;;
  test)
    setup "[test]"
    "$VENV/bin/ruff" check .
    "$VENV/bin/ruff" format --check .
    "$VENV/bin/mypy"  # files and strictness from pyproject.toml
    exec "$VENV/bin/python" -m pytest -q "$@"
    ;;
  *)
    echo "usage: bash infra/bootstrap.sh up|test [args]" >&2
    exit 2
    ;;
esac
