"""Issue 12's production settings, without a cluster: restricted pods, Secrets, labels."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest
from operator_testkit import example, pipeline_body

from offtake.config import ConfigError, RedriveRequest, parse_pipeline
from offtake.sinks.spark.jdbc import credentials, secret_credentials
from offtake_operator import names, render
from offtake_operator.apply import covers, stamped
from offtake_operator.kafka_secret import KafkaSecretError, map_secret
from offtake_operator.operator_spec import parse_operator_spec
from offtake_operator.reconcile import validate, worker_manifest
from offtake_operator.settings import OperatorConfig, SettingsError

CONFIG = OperatorConfig(worker_image="registry.test/offtake:1.2.3")


def pod(body: dict[str, Any], **kw: Any) -> dict[str, Any]:
    p = parse_pipeline(worker_manifest(body))
    dep = render.render_deployment(body, p, CONFIG, replicas=1, **kw)
    spec: dict[str, Any] = dep["spec"]["template"]["spec"]
    return spec


# ------------------------------------------------------------------ restricted by default


def assert_restricted(container: dict[str, Any]) -> None:
    ctx = container["securityContext"]
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["capabilities"] == {"drop": ["ALL"]}
    assert ctx["runAsNonRoot"] is True
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}
    mounts = [m["mountPath"] for m in container["volumeMounts"]]
    assert "/tmp" in mounts, "a read-only root filesystem needs a writable /tmp"


def test_worker_and_sidecar_pass_restricted_by_default() -> None:
    spec = pod(example("sidecar.yaml"))
    assert spec["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 10001,
        "runAsGroup": 10001,
        "fsGroup": 10001,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    (worker,) = spec["containers"]
    (sidecar,) = spec["initContainers"]
    assert_restricted(worker)
    assert_restricted(sidecar)
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["tmp"] == {"name": "tmp", "emptyDir": {}}
    assert volumes["processor-tmp"] == {"name": "processor-tmp", "emptyDir": {}}
    # Spark's ivy cache and anything else that wants a home directory: the writable /tmp.
    assert {"name": "HOME", "value": "/tmp"} in worker["env"]


def test_security_overrides_merge_over_the_defaults() -> None:
    body = example("sidecar.yaml")
    body["spec"]["template"] = {
        "spec": {
            "securityContext": {"runAsUser": 2000, "fsGroup": 3000},
            "containerSecurityContext": {"readOnlyRootFilesystem": False},
        }
    }
    body["spec"]["processor"]["container"]["securityContext"] = {
        "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}
    }
    validate(body)
    spec = pod(body)
    assert spec["securityContext"]["runAsUser"] == 2000
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    worker = spec["containers"][0]["securityContext"]
    assert worker["readOnlyRootFilesystem"] is False and worker["capabilities"] == {"drop": ["ALL"]}
    sidecar = spec["initContainers"][0]["securityContext"]
    assert sidecar["capabilities"]["add"] == ["NET_BIND_SERVICE"]


@pytest.mark.parametrize(
    ("template", "processor", "field"),
    [
        ({"securityContext": {"runAsNonRoot": False}}, None, "spec.template.spec.securityContext"),
        ({"securityContext": {"runAsUser": 0}}, None, "securityContext.runAsUser"),
        (
            {"securityContext": {"seccompProfile": {"type": "Unconfined"}}},
            None,
            "spec.template.spec.securityContext.seccompProfile.type",
        ),
        (
            {"containerSecurityContext": {"privileged": True}},
            None,
            "spec.template.spec.containerSecurityContext.privileged",
        ),
        (
            {"containerSecurityContext": {"allowPrivilegeEscalation": True}},
            None,
            "containerSecurityContext.allowPrivilegeEscalation",
        ),
        (
            {"containerSecurityContext": {"capabilities": {"drop": ["NET_RAW"]}}},
            None,
            "containerSecurityContext.capabilities.drop",
        ),
        (
            None,
            {"capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]}},
            "spec.processor.container.securityContext.capabilities.add",
        ),
        ({"securityContext": {"sysctls": [{"name": "kernel.msgmax"}]}}, None, "sysctls"),
    ],
)
def test_overrides_that_restricted_refuses_are_refused_naming_the_field(
    template: dict[str, Any] | None, processor: dict[str, Any] | None, field: str
) -> None:
    body = example("sidecar.yaml")
    if template is not None:
        body["spec"]["template"] = {"spec": template}
    if processor is not None:
        body["spec"]["processor"]["container"]["securityContext"] = processor
    with pytest.raises(ConfigError, match=r"Pod Security restricted|safe sysctl") as err:
        validate(body)
    assert field in str(err.value)


# ------------------------------------------------------------------ secrets


def test_inline_secrets_in_kafka_config_are_refused_naming_the_field() -> None:
    for key in (
        "sasl.password",
        "ssl.key.password",
        "sasl.oauthbearer.client.secret",
        "sasl.jaas.config",
        "ssl.key.pem",
        "SASL.PASSWORD",
    ):
        body = pipeline_body(kafka={"bootstrapServers": "k:9092", "config": {key: "hunter2"}})
        with pytest.raises(ConfigError) as err:
            validate(body)
        assert f'spec.kafka.config["{key}"]' in str(err.value)
        assert "secretRef" in str(err.value) and "hunter2" not in str(err.value)
    # Settings that merely mention a mechanism are fine.
    validate(
        pipeline_body(
            kafka={
                "bootstrapServers": "k:9092",
                "config": {
                    "sasl.mechanism": "SCRAM-SHA-512",
                    "security.protocol": "SASL_SSL",
                    "sasl.username": "orders",
                },
            }
        )
    )


STRIMZI_SCRAM = {
    "password": "s3cret-pw",
    "sasl.jaas.config": (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="orders-user" password="s3cret-pw";'
    ),
}
STRIMZI_TLS = {
    "ca.crt": "-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----",
    "user.crt": "-----BEGIN CERTIFICATE-----\nU\n-----END CERTIFICATE-----",
    "user.key": "-----BEGIN PRIVATE KEY-----\nK\n-----END PRIVATE KEY-----",
    "user.p12": "binary",
    "user.password": "p12-password",
}


def test_a_strimzi_scram_kafkauser_secret_maps_to_librdkafka_properties() -> None:
    secret = map_secret("shop", "orders-user", STRIMZI_SCRAM)
    assert secret.mounts == (("orders-user", {"password": "sasl.password"}),)
    assert secret.plain == {"sasl.username": "orders-user"}
    assert secret.properties == {"sasl.password": "s3cret-pw", "sasl.username": "orders-user"}


def test_a_strimzi_tls_kafkauser_secret_maps_to_pem_properties() -> None:
    secret = map_secret("shop", "orders-user", STRIMZI_TLS)
    # Its ca.crt is the clients CA, which cannot verify the brokers: left out.
    assert secret.mounts[0][1] == {"user.crt": "ssl.certificate.pem", "user.key": "ssl.key.pem"}
    assert secret.plain == {}
    cluster_ca = map_secret("kafka", "my-cluster-cluster-ca-cert", {"ca.crt": "C", "ca.p12": "P"})
    assert cluster_ca.mounts[0][1] == {"ca.crt": "ssl.ca.pem"}
    assert "user.password" not in secret.properties and "user.p12" not in secret.properties


def test_property_keys_pass_and_unknown_keys_are_refused_by_name() -> None:
    plain = map_secret("shop", "k", {"sasl.username": "u", "sasl.password": "p"})
    assert plain.mounts[0][1] == {
        "sasl.username": "sasl.username",
        "sasl.password": "sasl.password",
    }
    with pytest.raises(KafkaSecretError, match=r"Secret shop/k key 'token'"):
        map_secret("shop", "k", {"token": "x"})
    with pytest.raises(KafkaSecretError, match=r"both set sasl\.password"):
        map_secret("shop", "k", {"password": "a", "sasl.password": "b"})


def test_the_secret_is_mounted_with_property_names_and_the_user_name_is_in_the_config() -> None:
    body = example("sidecar.yaml")
    secret = map_secret("shop", "kafka-credentials", STRIMZI_SCRAM)
    spec = pod(body, kafka_mounts=secret.mounts, kafka_config=secret.plain)
    volume = next(v for v in spec["volumes"] if v["name"] == "kafka-secret")
    assert volume["secret"] == {
        "secretName": "kafka-credentials",
        "items": [{"key": "password", "path": "sasl.password"}],
    }
    cm = render.render_configmap(body, secret.plain)
    assert "sasl.username: orders-user" in cm["data"]["pipeline.yaml"]
    assert "s3cret-pw" not in cm["data"]["pipeline.yaml"]
    # The pipeline's own kafka.config wins over what the operator derived.
    body["spec"]["kafka"]["config"] = {"sasl.username": "mine"}
    assert (
        "sasl.username: mine"
        in render.render_configmap(body, secret.plain)["data"]["pipeline.yaml"]
    )


def test_jdbc_credentials_come_from_the_mounted_secret(tmp_path: Path) -> None:
    (tmp_path / "username").write_text("writer\n")
    (tmp_path / "password").write_text("pg-secret\n")
    assert secret_credentials(str(tmp_path)) == {"user": "writer", "password": "pg-secret"}
    body = pipeline_body(
        sink={
            "spark": {
                "format": "jdbc",
                "jdbc": {
                    "url": "jdbc:postgresql://db/shop",
                    "table": "orders",
                    "secretRef": {"name": "db"},
                },
            }
        }
    )
    jdbc = parse_pipeline(worker_manifest(body)).sink.spark.jdbc  # type: ignore[union-attr]
    assert credentials(jdbc, str(tmp_path)) == {
        "driver": "org.postgresql.Driver",
        "user": "writer",
        "password": "pg-secret",
    }
    # Without a secretRef nothing is read from the directory.
    body["spec"]["sink"]["spark"]["jdbc"].pop("secretRef")
    jdbc = parse_pipeline(worker_manifest(body)).sink.spark.jdbc  # type: ignore[union-attr]
    assert credentials(jdbc, str(tmp_path)) == {"driver": "org.postgresql.Driver"}


# ------------------------------------------------------------------ ServiceMonitor labels


def test_service_monitor_labels_from_the_chart_and_the_pipeline() -> None:
    config = OperatorConfig.from_env(
        {"OFFTAKE_SERVICE_MONITOR_LABELS": '{"release": "kps", "team": "data"}'}
    )
    extras = parse_operator_spec({"serviceMonitor": {"labels": {"team": "shop"}}})
    labels = {**config.service_monitor_labels, **extras.service_monitor_labels}
    sm = render.render_service_monitor(pipeline_body(), {**labels, "offtake.dev/pipeline": "x"})
    assert sm["metadata"]["labels"]["release"] == "kps"
    assert sm["metadata"]["labels"]["team"] == "shop"
    assert sm["metadata"]["labels"]["offtake.dev/pipeline"] == "orders"  # ours win
    with pytest.raises(SettingsError, match="OFFTAKE_SERVICE_MONITOR_LABELS"):
        OperatorConfig.from_env({"OFFTAKE_SERVICE_MONITOR_LABELS": "release=kps"})
    with pytest.raises(ConfigError, match=r"spec\.serviceMonitor\.labels"):
        parse_operator_spec({"serviceMonitor": {"labels": {"a": 1}}})


# ------------------------------------------------------------------ server-side apply


def test_a_rendering_that_lost_a_field_is_not_covered_by_the_old_child() -> None:
    """A child applied from an older rendering has every field of a newer one that only
    removed something, so covers() alone would skip the apply; the checksum does not."""
    with_selector = pipeline_body(template={"spec": {"nodeSelector": {"pool": "a"}}})
    same = stamped(pod_dep(with_selector))
    same["metadata"]["annotations"]["extra"] = "added by someone else"
    assert covers(same, stamped(pod_dep(with_selector)))  # nothing to apply
    dep_old = stamped(pod_dep(with_selector))
    dep_new = stamped(pod_dep(pipeline_body()))
    assert covers(dep_old["spec"]["template"]["spec"], dep_new["spec"]["template"]["spec"])
    assert not covers(dep_old, dep_new)


def pod_dep(body: dict[str, Any]) -> dict[str, Any]:
    return render.render_deployment(body, parse_pipeline(worker_manifest(body)), CONFIG, replicas=1)


def test_a_scaled_object_authenticates_with_the_kafka_secret() -> None:

    body = pipeline_body(
        kafka={
            "bootstrapServers": "k:9093",
            "secretRef": {"name": "orders-user"},
            "config": {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512"},
        }
    )
    p = parse_pipeline(worker_manifest(body))
    secret = map_secret("shop", "orders-user", {**STRIMZI_TLS, "sasl.password": "x"})
    auth = render.render_trigger_authentication(body, secret.mounts)
    assert auth is not None and auth["kind"] == "TriggerAuthentication"
    assert {r["parameter"]: r["key"] for r in auth["spec"]["secretTargetRef"]} == {
        "cert": "user.crt",
        "key": "user.key",
        "password": "sasl.password",
    }
    scaling = parse_operator_spec({"autoscaling": {"enabled": True}}).autoscaling
    so = render.render_scaled_object(body, p, scaling, 4, authenticated=True)
    (trigger,) = so["spec"]["triggers"]
    assert trigger["authenticationRef"] == {"name": "orders"}
    assert trigger["metadata"]["sasl"] == "scram_sha512" and trigger["metadata"]["tls"] == "enable"
    assert render.render_trigger_authentication(body, [("s", {"x": "security.protocol"})]) is None


def test_the_operator_metrics_port_setting() -> None:
    assert OperatorConfig.from_env({}).metrics_port == 0
    assert OperatorConfig.from_env({"OFFTAKE_METRICS_PORT": "8081"}).metrics_port == 8081
    with pytest.raises(SettingsError, match="OFFTAKE_METRICS_PORT"):
        OperatorConfig.from_env({"OFFTAKE_METRICS_PORT": "http"})


def test_scram_credentials_and_the_cluster_ca_from_two_secrets_share_one_directory() -> None:
    from offtake_operator.kafka_secret import with_cluster_ca

    user = map_secret("shop", "orders-user", STRIMZI_SCRAM)
    both = with_cluster_ca(
        user, "shop", "my-cluster-cluster-ca-cert", {"ca.crt": "CA", "ca.p12": "P"}
    )
    assert both.properties == {
        "sasl.password": "s3cret-pw",
        "sasl.username": "orders-user",
        "ssl.ca.pem": "CA",
    }
    body = example("sidecar.yaml")
    body["spec"]["kafka"]["caSecretRef"] = {"name": "my-cluster-cluster-ca-cert"}
    volume = next(
        v for v in pod(body, kafka_mounts=both.mounts)["volumes"] if v["name"] == "kafka-secret"
    )
    assert volume["projected"]["sources"] == [
        {
            "secret": {
                "name": "orders-user",
                "items": [{"key": "password", "path": "sasl.password"}],
            }
        },
        {
            "secret": {
                "name": "my-cluster-cluster-ca-cert",
                "items": [{"key": "ca.crt", "path": "ssl.ca.pem"}],
            }
        },
    ]
    with pytest.raises(KafkaSecretError, match=r"no key 'ca\.crt'"):
        with_cluster_ca(user, "shop", "x", {"tls.crt": "C"})
    with pytest.raises(KafkaSecretError, match=r"already sets ssl\.ca\.pem"):
        with_cluster_ca(map_secret("shop", "u", {"ssl.ca.pem": "A"}), "shop", "x", {"ca.crt": "C"})


def test_min_replicas_zero_scales_to_zero_with_keda_and_to_one_with_an_hpa() -> None:
    extras = parse_operator_spec({"autoscaling": {"enabled": True, "minReplicas": 0}})
    assert extras.autoscaling.min_replicas == 0
    body = pipeline_body()
    p = parse_pipeline(worker_manifest(body))
    so = render.render_scaled_object(body, p, extras.autoscaling, 6)
    assert so["spec"]["minReplicaCount"] == 0 and so["spec"]["maxReplicaCount"] == 6
    assert render.render_hpa(body, extras.autoscaling, 6)["spec"]["minReplicas"] == 1
    with pytest.raises(ConfigError, match="minReplicas"):
        parse_operator_spec({"autoscaling": {"minReplicas": -1}})


def test_queue_mode_autoscales_on_lag_seconds_or_on_its_backlog() -> None:
    """A share group has no lag in messages: the default target would never scale, so one of
    targetLagSeconds (age when acquired) or targetLagPerReplica (backlog per worker) is needed."""
    queue = {"source": {"topics": ["jobs"], "groupType": "share"}}
    with pytest.raises(ConfigError, match=r"targetLagSeconds: or targetLagPerReplica is required"):
        parse_operator_spec({**queue, "autoscaling": {"enabled": True}})
    scaling = {"enabled": True, "targetLagSeconds": 30}
    assert parse_operator_spec({**queue, "autoscaling": scaling}).autoscaling.target_lag_seconds
    assert not parse_operator_spec(queue).autoscaling.enabled  # off: nothing to refuse
    on_backlog = parse_operator_spec(
        {**queue, "autoscaling": {"enabled": True, "targetLagPerReplica": 200}}
    ).autoscaling
    assert on_backlog.on_backlog and not on_backlog.on_seconds
    # A consumer group's targetLagPerReplica stays lag in messages (KEDA's Kafka scaler).
    consumer = parse_operator_spec({"autoscaling": {"enabled": True, "targetLagPerReplica": 200}})
    assert not consumer.autoscaling.on_backlog


def test_queue_mode_backlog_autoscaling_asks_prometheus_for_the_least_backlog_per_partition() -> (
    None
):
    """issue 39 item 3: the generated autoscaling follows the backlog past the acquisition
    frontier (each worker's offtake_share_backlog_messages, the least per partition, summed)."""
    spec = {"source": {"topics": ["jobs"], "groupType": "share"}}
    scaling = {"enabled": True, "targetLagPerReplica": 200, "maxReplicas": 8}
    body = pipeline_body("jobs", **spec, autoscaling=scaling)
    p = parse_pipeline(worker_manifest(body))
    hpa_scaling = parse_operator_spec({**spec, "autoscaling": scaling}).autoscaling
    hpa = render.render_hpa(body, hpa_scaling, render.replica_cap(p, 2))
    assert hpa["spec"]["maxReplicas"] == 8  # not capped at the 2 partitions
    assert hpa["spec"]["metrics"] == [
        {
            "type": "External",
            "external": {
                "metric": {
                    "name": "offtake_share_backlog_messages",
                    "selector": {"matchLabels": {"pipeline": "jobs"}},
                },
                "target": {"type": "AverageValue", "averageValue": "200"},
            },
        }
    ]
    # KEDA only with a Prometheus to ask (its Kafka scaler reads consumer groups only).
    assert not render.uses_scaled_object(hpa_scaling, keda_served=True)
    keda_scaling = parse_operator_spec(
        {**spec, "autoscaling": {**scaling, "prometheusAddress": "http://prom:9090"}}
    ).autoscaling
    assert render.uses_scaled_object(keda_scaling, keda_served=True)
    so = render.render_scaled_object(body, p, keda_scaling, None)
    (trigger,) = so["spec"]["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    assert trigger["metadata"]["query"] == (
        "sum(min by (topic, partition) "
        '(offtake_share_backlog_messages{namespace="shop", pipeline="jobs"}))'
    )
    assert trigger["metadata"]["threshold"] == "200"


def test_strimzi_secrets_with_their_binary_keystores_are_read_as_they_are() -> None:
    """Strimzi's user.p12 and ca.p12 are PKCS#12 bytes, not text: they are left out like
    the other keys librdkafka has no use for, instead of refusing the whole Secret."""
    import asyncio
    import base64

    from offtake_operator.kafka_secret import read_kafka_secret

    p12 = bytes(range(256))  # not UTF-8
    secrets = {
        "orders-user": {
            "password": b"s3cret-pw",
            "sasl.jaas.config": STRIMZI_SCRAM["sasl.jaas.config"].encode(),
        },
        "my-cluster-cluster-ca-cert": {"ca.crt": b"CA", "ca.p12": p12, "ca.password": b"x"},
        "broken": {"sasl.password": p12},
    }

    class Secrets:
        async def get(self, _res: Any, _ns: str, name: str) -> dict[str, Any]:
            data = {k: base64.b64encode(v).decode() for k, v in secrets[name].items()}
            return {"data": data}

    body = pipeline_body()
    body["spec"]["kafka"]["secretRef"] = {"name": "orders-user"}
    body["spec"]["kafka"]["caSecretRef"] = {"name": "my-cluster-cluster-ca-cert"}
    spec = parse_pipeline(worker_manifest(body))
    secret = asyncio.run(read_kafka_secret(Secrets(), "shop", spec))  # type: ignore[arg-type]
    assert secret is not None
    assert secret.properties == {
        "sasl.password": "s3cret-pw",
        "sasl.username": "orders-user",
        "ssl.ca.pem": "CA",
    }
    # A key that would be used must still be text.
    body["spec"]["kafka"]["secretRef"] = {"name": "broken"}
    spec = parse_pipeline(worker_manifest(body))
    with pytest.raises(KafkaSecretError, match=r"key 'sasl\.password' is not UTF-8 text"):
        asyncio.run(read_kafka_secret(Secrets(), "shop", spec))  # type: ignore[arg-type]


def test_the_redrive_job_runs_like_a_worker_and_is_not_one() -> None:
    """spec.redrive's Job: the workers' image, config, Kafka Secret, pod settings, resources and
    restricted security contexts (with the pipeline's overrides); not selected as a worker."""

    body = pipeline_body(
        "orders",
        kafka={"bootstrapServers": "k:9093", "secretRef": {"name": "orders-user"}},
        resources={"limits": {"memory": "256Mi"}},
        template={
            "metadata": {"labels": {"team": "shop"}},
            "spec": {
                "serviceAccountName": "orders-sa",
                "nodeSelector": {"pool": "data"},
                "env": [{"name": "EXTRA", "value": "1"}],
                "securityContext": {"runAsUser": 12345},
            },
        },
    )
    p = parse_pipeline(worker_manifest(body))
    until = datetime.datetime(2026, 5, 1, 12, tzinfo=datetime.UTC)
    request = RedriveRequest("fix-1", "orders-dlq", until)
    mounts = (("orders-user", {"password": "sasl.password"}),)
    job = render.render_redrive_job(body, p, CONFIG, request, "g.redrive", kafka_mounts=mounts)
    assert job["apiVersion"] == "batch/v1" and job["metadata"]["name"] == "orders-redrive"
    assert job["metadata"]["ownerReferences"][0]["controller"] is True
    assert job["spec"]["ttlSecondsAfterFinished"] == 24 * 3600, "finished Jobs do not pile up"
    assert job["metadata"]["labels"][names.PIPELINE_LABEL] == "orders"  # watched as a child
    template = job["spec"]["template"]
    labels = template["metadata"]["labels"]
    assert names.PIPELINE_LABEL not in labels, "the Deployment, Service and PDB select by it"
    assert labels[names.REDRIVE_LABEL] == "orders" and labels["team"] == "shop"
    spec = template["spec"]
    assert spec["restartPolicy"] == "Never"
    assert spec["serviceAccountName"] == "orders-sa" and spec["nodeSelector"] == {"pool": "data"}
    assert spec["securityContext"]["runAsUser"] == 12345
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = spec["containers"]
    assert_restricted(container)
    assert container["image"] == CONFIG.worker_image
    assert container["resources"] == {"limits": {"memory": "256Mi"}}
    assert {"name": "EXTRA", "value": "1"} in container["env"]
    assert container["args"][-6:] == [
        "--from",
        "orders-dlq",
        "--until",
        "2026-05-01T12:00:00Z",
        "--group",
        "g.redrive",
    ]
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["pipeline"]["configMap"]["name"] == "orders-pipeline"
    assert volumes["kafka-secret"]["secret"]["items"] == [
        {"key": "password", "path": "sasl.password"}
    ]
    mounts_at = {m["mountPath"] for m in container["volumeMounts"]}
    assert {names.PIPELINE_PATH, names.KAFKA_SECRET_DIR, "/tmp"} <= mounts_at
