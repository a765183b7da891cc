"""The worker's environment: every variable Offtake reads, read here and nowhere else.

The operator passes a worker what the pipeline spec cannot carry (where Secrets are mounted, the
Spark Connect server it made, the pod's name) as environment variables; a local run sets them
itself. Reading them in one module (and in ``cli.py``, the other edge) keeps the rest of the
worker a function of its arguments: a module deep in a sink never depends on ambient state a
test or a caller cannot see. ``tests/unit/test_environment.py`` holds every other module to it.
"""

from __future__ import annotations

import os
from pathlib import Path

# Where the operator mounts the Secrets a spec names (a local run points these elsewhere).
KAFKA_SECRET_DIR_ENV = "OFFTAKE_KAFKA_SECRET_DIR"
REGISTRY_SECRET_DIR_ENV = "OFFTAKE_SCHEMA_REGISTRY_SECRETS_DIR"
JDBC_SECRET_DIR_ENV = "OFFTAKE_JDBC_SECRET_DIR"
# What the worker fetches or makes once (Spark packages, class-data archives).
CACHE_ENV = "OFFTAKE_CACHE"
SPARK_ARCHIVES_ENV = "OFFTAKE_SPARK_ARCHIVES"
# submit.mode kubernetes: the Spark Connect server the operator made for the pipeline.
SPARK_CONNECT_URL_ENV = "OFFTAKE_SPARK_CONNECT_URL"


def value(variable: str) -> str | None:
    """``variable``'s value, None when unset or blank."""
    found = os.environ.get(variable, "").strip()
    return found or None


def directory(variable: str, default: str, override: str | None = None) -> Path:
    """``override`` when given (a caller's explicit folder: a test, a local run), else the
    folder named by ``variable``, else ``default``."""
    return Path(override or value(variable) or default)


def cache_root() -> Path:
    """``$OFFTAKE_CACHE``, else ~/.cache/offtake."""
    explicit = value(CACHE_ENV)
    return Path(explicit) if explicit else Path.home() / ".cache" / "offtake"


def java_home() -> str | None:
    """``$JAVA_HOME``: the JVM Spark's launcher runs."""
    return value("JAVA_HOME")


def enable_spark_connect_mode() -> None:
    """Tell pyspark this process is a Spark Connect client (what ``SparkSession.builder
    .remote()`` sets): pyspark.sql.functions read it to take the Connect path."""
    os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
