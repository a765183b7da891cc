"""The worker pod's parts: the processor sidecar, Secret volumes and mounts (render.pod)."""

from __future__ import annotations

from operator_testkit import example, pipeline_body
from render_testkit import pod_spec

from offtake_operator import names


def test_sidecar_runs_as_a_native_sidecar_that_outlives_the_worker() -> None:
    body = example("sidecar.yaml")
    spec = pod_spec(body)
    (sidecar,) = spec["initContainers"]
    # restartPolicy Always on an init container = a native sidecar: started before the
    # worker, stopped after it, so the draining worker can still reach it.
    assert sidecar["restartPolicy"] == "Always"
    assert sidecar["image"] == "registry.example.com/orders-scorer:1.4"
    assert sidecar["ports"] == [{"name": "processor", "containerPort": 8080, "protocol": "TCP"}]
    assert sidecar["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "processor"}
    assert sidecar["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "processor"}
    assert sidecar["env"] == [{"name": "MODEL", "value": "gradient-boost-v3"}]
    assert sidecar["resources"]["requests"] == {"cpu": "250m", "memory": "256Mi"}
    # The Kafka secret is mounted where the worker reads it.
    (worker,) = spec["containers"]
    assert {
        "name": "kafka-secret",
        "mountPath": "/etc/offtake/kafka-secret",
        "readOnly": True,
    } in worker["volumeMounts"]
    assert {"name": "kafka-secret", "secret": {"secretName": "kafka-credentials"}} in spec[
        "volumes"
    ]


def test_spark_jdbc_secret_is_mounted() -> None:
    body = pipeline_body(
        sink={
            "spark": {
                "format": "jdbc",
                "jdbc": {
                    "url": "jdbc:postgresql://db/x",
                    "table": "t",
                    "secretRef": {"name": "db"},
                },
            }
        }
    )
    spec = pod_spec(body)
    assert {"name": "jdbc-secret", "secret": {"secretName": "db"}} in spec["volumes"]
    assert any(
        m["mountPath"] == names.JDBC_SECRET_DIR for m in spec["containers"][0]["volumeMounts"]
    )


def test_schema_registry_secrets_are_mounted_one_folder_each() -> None:
    registry = {"url": "https://registry:8081", "secretRef": {"name": "sr-read"}}
    body = pipeline_body(
        source={"topics": ["orders"], "format": "avro", "schemaRegistry": registry},
        sink={
            "kafka": {
                "topic": "out",
                "format": "avro",
                "schema": {"subject": "out-value"},
                "schemaRegistry": {**registry, "secretRef": {"name": "sr-write"}},
            }
        },
    )
    spec = pod_spec(body)
    mounts = {m["mountPath"]: m["name"] for m in spec["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    for secret in ("sr-read", "sr-write"):
        name = mounts[f"{names.SCHEMA_REGISTRY_SECRETS_DIR}/{secret}"]
        assert volumes[name]["secret"] == {"secretName": secret}
