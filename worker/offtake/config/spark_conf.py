"""Which ``sink.spark.submit.conf`` keys a pipeline may set.

In ``submit.mode: kubernetes`` the operator renders the pipeline's Spark Connect server and the
Spark operator runs it; the server (Spark's driver) then creates its executor pods itself from
its Spark conf. A ``spark.kubernetes.*`` key there shapes those pods: host paths and other
volumes, a pod template file from the image, the service account and the credentials the
driver talks to the API server with, node selection, annotations. So the conf is filtered by
the operator's rules, whatever the mode (in ``local`` and ``connect`` these keys do nothing
legitimate, and one rule is easier to trust):

- ``spark.kubernetes.*`` is refused, except the resource sizing in :data:`ALLOWED_KUBERNETES`
  (the pods' security contexts, volumes and service account are the operator's);
- ``spark.connect.*`` is refused: the server's port, binding and authentication token are what
  the workers' NetworkPolicy and the token Secret are built around;
- ``spark.master`` and ``spark.submit.deployMode`` are refused: ``submit.mode`` and
  ``submit.master`` say where Spark runs.

Not refused, on purpose: ``spark.*.extraJavaOptions``, ``extraClassPath``, ``spark.jars``,
``spark.plugins``. They load code into the server's JVM, but that JVM runs the image the
pipeline names (``submit.image``) under the service account it names, in its own namespace:
the pipeline's author can already run any code there, so nothing crosses a boundary
(docs/spark-sink.md, "What submit.conf may set").
"""

from __future__ import annotations

from collections.abc import Mapping

from offtake.config._fields import ConfigError
from offtake.config.client_properties import map_key

__all__ = ["ALLOWED_KUBERNETES", "check_submit_conf"]

#: Sizing only: nothing here reaches the host, the API or another namespace.
ALLOWED_KUBERNETES = frozenset(
    {
        "spark.kubernetes.driver.request.cores",
        "spark.kubernetes.driver.limit.cores",
        "spark.kubernetes.executor.request.cores",
        "spark.kubernetes.executor.limit.cores",
        "spark.kubernetes.memoryOverheadFactor",
    }
)

_ALLOWED_LOWER = frozenset(k.lower() for k in ALLOWED_KUBERNETES)

_REFUSED_KEYS = {
    "spark.master": "submit.mode and submit.master say where Spark runs",
    "spark.submit.deploymode": "submit.mode says where Spark runs",
}


def check_submit_conf(conf: Mapping[str, str], field: str) -> None:
    """Raise ConfigError naming ``field[key]`` for the first key a pipeline may not set."""
    for key in sorted(conf):
        lowered = key.strip().lower()  # Spark's conf keys are case-sensitive; bypasses are not
        where = map_key(field, key)
        if lowered.startswith("spark.kubernetes.") and lowered not in _ALLOWED_LOWER:
            raise ConfigError(
                where,
                "spark.kubernetes.* settings are refused (volumes, host paths, pod templates, "
                "service accounts and API credentials of the Spark pods are the operator's); "
                f"allowed: {', '.join(sorted(ALLOWED_KUBERNETES))}",
            )
        if lowered.startswith("spark.connect."):
            raise ConfigError(
                where,
                "spark.connect.* settings are refused (the Connect server's port, binding and "
                "authentication token are set by the operator)",
            )
        if lowered in _REFUSED_KEYS:
            raise ConfigError(where, f"is refused: {_REFUSED_KEYS[lowered]}")
