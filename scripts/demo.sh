#!/usr/bin/env bash
# Create .venv if needed, install the project (with its Spark extra), then run
# the demo and the examples on the embedded store (or on LARGE_QUEUE_URL's store).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[spark]'
.venv/bin/large-queue demo
.venv/bin/python examples/quickstart.py
.venv/bin/python examples/producer_consumer.py
.venv/bin/python examples/spark_pipeline.py
