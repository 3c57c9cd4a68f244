"""The torture run (processes, pauses past the lock TTL, kills) in the suite: a short one.

``LARGE_QUEUE_TORTURE_SECONDS`` lengthens it; ``large-queue torture`` runs it
by hand with every parameter. The Aerospike variant runs when
``LARGE_QUEUE_TEST_AEROSPIKE`` is set.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from large_queue._torture import TortureConfig, run
from tests.fix_backends import AEROSPIKE_ENVIRONMENT_VARIABLE

SECONDS = float(os.environ.get("LARGE_QUEUE_TORTURE_SECONDS", "8"))


@pytest.mark.torture
@pytest.mark.parametrize("kind", ["embedded", "aerospike"])
def test_torture_finds_no_anomaly(kind: str, tmp_path: Path) -> None:
    if kind == "embedded":
        url = f"embedded://{tmp_path}/torture.db"
    elif os.environ.get(AEROSPIKE_ENVIRONMENT_VARIABLE):
        url = f"aerospike://{os.environ[AEROSPIKE_ENVIRONMENT_VARIABLE]}/test"
    else:
        pytest.skip(f"set {AEROSPIKE_ENVIRONMENT_VARIABLE}=host:port to torture an Aerospike server")
    lines: list[str] = []
    report = run(
        TortureConfig(url=url, duration=SECONDS, fault_interval=0.8, seed=7),
        directory=str(tmp_path / "histories"),
        log=lines.append,
    )
    print("\n".join(lines))
    assert report.pauses >= 1 and report.kills >= 1, "faults were not injected"
    assert report.verdict.enqueues_acknowledged > 1000
    assert report.verdict.ok, "\n".join(lines)
