"""Test configuration: fixtures come from the ``tests.fix_*`` plugins (see pyproject addopts).

Hypothesis profiles: ``ci`` (the default: 300 examples of 100 steps per state
machine) and ``long`` (1,000 examples of 200 steps). Choose one with
``LARGE_QUEUE_HYPOTHESIS_PROFILE=long`` or ``--hypothesis-profile=long``.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_COMMON = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large]}
settings.register_profile("ci", max_examples=300, stateful_step_count=100, **_COMMON)  # type: ignore[arg-type]
settings.register_profile("long", max_examples=1000, stateful_step_count=200, **_COMMON)  # type: ignore[arg-type]
settings.load_profile(os.environ.get("LARGE_QUEUE_HYPOTHESIS_PROFILE", "ci"))
