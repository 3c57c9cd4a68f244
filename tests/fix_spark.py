"""Pytest plugin: one local SparkSession (``local[2]``) per test session, with the data source registered."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A local SparkSession; skipped when pyspark is not installed."""
    pytest.importorskip("pyspark", reason="the spark extra is not installed")
    java_home = os.environ.get("JAVA_HOME", "")
    if not shutil.which("java") and not os.path.exists(os.path.join(java_home, "bin", "java")):
        pytest.skip("Spark needs Java 17 or newer: no java on PATH and no JAVA_HOME")
    from pyspark.sql import SparkSession

    from large_queue.spark import register

    os.environ["PYSPARK_PYTHON"] = sys.executable  # workers must import this environment's large_queue
    session = (
        SparkSession.builder.master("local[2]")
        .appName("large_queue tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()
