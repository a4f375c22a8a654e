"""The Spark session of the simulator's Spark tests: one ``local[2]`` session per test module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from sim.spark import spark_session


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = spark_session("local[2]")
    yield session
    session.stop()
