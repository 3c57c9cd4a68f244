#!/usr/bin/env bash
# Create .venv if needed, install the project with its test tools, then run
# ruff (format check and lint), mypy (strict) and the pytest suite.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test,dev,spark,bench]'
.venv/bin/ruff format --check large_queue tests examples
.venv/bin/ruff check large_queue tests examples
.venv/bin/mypy
.venv/bin/python -m pytest "$@"
