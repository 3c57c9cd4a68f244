"""The torture run (processes, pauses past the lock TTL, kills) in the suite: a short one.

``LARGE_QUEUE_TORTURE_SECONDS`` lengthens it; ``large-queue torture`` runs it
by hand with every parameter. It runs on both stores (see ``place``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from large_queue._torture import TortureConfig, run
from tests.fix_backends import Place

SECONDS = float(os.environ.get("LARGE_QUEUE_TORTURE_SECONDS", "8"))


@pytest.mark.torture
def test_torture_finds_no_anomaly(place: Place, tmp_path: Path) -> None:
    lines: list[str] = []
    report = run(
        TortureConfig(url=place.url, duration=SECONDS, fault_interval=0.8, seed=7),
        directory=str(tmp_path / "histories"),
        log=lines.append,
    )
    print("\n".join(lines))
    assert report.pauses >= 1 and report.kills >= 1, "faults were not injected"
    assert report.verdict.enqueues_acknowledged > 1000
    assert report.verdict.ok, "\n".join(lines)
