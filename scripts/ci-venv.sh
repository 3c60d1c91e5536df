#!/usr/bin/env bash
# A cached Python venv at target/ci-venv with the official `openai` client and `jsonschema`
# (pinned), for
# crates/encore/tests/serve_cli.rs (the_openai_python_client_works, which runs
# scripts/openai_client_test.py with ENCORE_OPENAI_PYTHON=target/ci-venv/bin/python).
# Re-creates the venv only when the pinned version is missing. Prints the python's path.
set -euo pipefail
cd "$(dirname "$0")/.."
OPENAI_VERSION=3.54.0
# jsonschema validates the structured outputs the client gets back.
JSONSCHEMA_VERSION=4.25.1
venv=target/ci-venv
if ! "$venv/bin/python" -c "import openai, jsonschema, sys; from importlib.metadata import version as v; sys.exit(openai.__version__ != '$OPENAI_VERSION' or v('jsonschema') != '$JSONSCHEMA_VERSION')" 2>/dev/null; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    "openai==$OPENAI_VERSION" "jsonschema==$JSONSCHEMA_VERSION"
fi
echo "$PWD/$venv/bin/python"
