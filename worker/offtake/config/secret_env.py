"""Secret keys the worker reads from its environment: ``*SecretRef: {name, key}`` fields.

The operator renders each as an environment variable of the worker container with
``valueFrom.secretKeyRef`` (so the value is never in the pipeline's ConfigMap or pod spec);
for a local ``offtake worker --pipeline`` run, set the variable yourself.
"""

from __future__ import annotations

from offtake import environment
from offtake.config._fields import ConfigError
from offtake.config.spec import PipelineSpec, SecretKeyRef

JDBC_PASSWORD_ENV = "OFFTAKE_JDBC_PASSWORD"
ICEBERG_PASSWORD_ENV = "OFFTAKE_ICEBERG_CATALOG_PASSWORD"
SPARK_CONNECT_TOKEN_ENV = "OFFTAKE_SPARK_CONNECT_TOKEN"


def secret_envs(spec: PipelineSpec) -> list[tuple[str, SecretKeyRef]]:
    """(environment variable, Secret key) for every ``*SecretRef: {name, key}`` of ``spec``."""
    spark = spec.sink.spark
    if spark is None:
        return []
    out: list[tuple[str, SecretKeyRef]] = []
    if spark.jdbc is not None and spark.jdbc.password_secret_ref is not None:
        out.append((JDBC_PASSWORD_ENV, spark.jdbc.password_secret_ref))
    if spark.iceberg is not None and spark.iceberg.password_secret_ref is not None:
        out.append((ICEBERG_PASSWORD_ENV, spark.iceberg.password_secret_ref))
    if spark.submit.token_secret_ref is not None:
        out.append((SPARK_CONNECT_TOKEN_ENV, spark.submit.token_secret_ref))
    return out


def read_secret_env(variable: str, field: str) -> str:
    """The value of ``variable``, or a ConfigError naming ``field`` when it is not set."""
    value = environment.value(variable)
    if not value:
        raise ConfigError(
            field,
            f"${variable} is not set: the operator sets it from the Secret key named here "
            "(for a local run, set it yourself)",
        )
    return value
