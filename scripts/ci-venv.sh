#!/usr/bin/env bash
# A cached Python venv at target/ci-venv with the official `openai` and `anthropic` clients
# and `jsonschema` (pinned), for crates/encore/tests/serve_cli.rs (the_openai_python_client_works
# and the_agent_python_clients_work*, which run scripts/openai_client_test.py and
# scripts/agent_clients_test.py with ENCORE_OPENAI_PYTHON=target/ci-venv/bin/python).
# Re-creates the venv only when the pinned version is missing. Prints the python's path.
set -euo pipefail
cd "$(dirname "$0")/.."
OPENAI_VERSION=3.54.0
ANTHROPIC_VERSION=2.14.0
# jsonschema validates the structured outputs the client gets back.
JSONSCHEMA_VERSION=4.25.1
venv=target/ci-venv
if ! "$venv/bin/python" -c "import openai, anthropic, jsonschema, sys; from importlib.metadata import version as v; sys.exit(openai.__version__ != '$OPENAI_VERSION' or anthropic.__version__ != '$ANTHROPIC_VERSION' or v('jsonschema') != '$JSONSCHEMA_VERSION')" 2>/dev/null; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    "openai==$OPENAI_VERSION" "anthropic==$ANTHROPIC_VERSION" "jsonschema==$JSONSCHEMA_VERSION"
fi
echo "$PWD/$venv/bin/python"
