#!/usr/bin/env bash
# Create .venv if needed, install the project, then run the demo on the
# embedded store (or on the store LARGE_QUEUE_URL names).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e .
.venv/bin/large-queue demo
.venv/bin/python examples/quickstart.py
.venv/bin/python examples/producer_consumer.py
