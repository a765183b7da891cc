"""spec.mode: inject: the loader's rules and the pure rendering of the injected pod."""

from __future__ import annotations

from typing import Any

import pytest
from operator_testkit import pipeline_body

from offtake.config import ConfigError, parse_pipeline
from offtake_operator import inject, names, status
from offtake_operator.reconcile import worker_manifest
from offtake_operator.security import check_container
from offtake_operator.settings import OperatorConfig

CONFIG = OperatorConfig(worker_image="registry.test/offtake:1.2.3")


def injected_body(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"mode": "inject", "processor": {"container": {"port": 8080}}}
    base.update(spec)
    return pipeline_body("orders", **base)


def app_pod(**annotations: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "namespace": "shop",
            "labels": {"app": "shop"},
            "annotations": {names.INJECT_ANNOTATION: "orders", **annotations},
        },
        "spec": {
            "containers": [
                {"name": "app", "image": "shop:1", "ports": [{"containerPort": 8080}]},
                {"name": "proxy", "image": "proxy:1"},
            ],
            "volumes": [{"name": "data", "emptyDir": {}}],
        },
    }


def test_inject_mode_needs_a_port_and_no_image() -> None:
    parsed = parse_pipeline(worker_manifest(injected_body()))
    assert parsed.mode == "inject" and parsed.processor.container is not None
    assert parsed.processor.container.port == 8080 and parsed.processor.container.image == ""
    with pytest.raises(ConfigError, match=r"spec\.processor\.container.*mode: inject"):
        parse_pipeline(worker_manifest(pipeline_body("orders", mode="inject")))
    with pytest.raises(ConfigError, match=r"processor\.container\.image: not used with"):
        parse_pipeline(worker_manifest(injected_body(processor={"container": {"image": "x:1"}})))
    with pytest.raises(ConfigError, match=r"spec\.paused: not available with mode: inject"):
        parse_pipeline(worker_manifest(injected_body(paused=True)))
    with pytest.raises(ConfigError, match=r"processor\.container\.image"):
        parse_pipeline(worker_manifest(pipeline_body("orders", processor={"container": {}})))
    with pytest.raises(ConfigError, match=r"spec\.mode"):
        parse_pipeline(worker_manifest(pipeline_body("orders", mode="sidecar")))


def inject_into(pod: dict[str, Any], **spec: Any) -> tuple[dict[str, Any], list[str]]:
    body = injected_body(**spec)
    return inject.injected_pod(pod, body, parse_pipeline(worker_manifest(body)), CONFIG)


def test_the_worker_becomes_a_restricted_native_sidecar_of_the_pod() -> None:
    pod = app_pod()
    out, warnings = inject_into(
        pod, kafka={"bootstrapServers": "k:9092", "secretRef": {"name": "s"}}
    )
    assert warnings == [] and pod == app_pod()  # the input is left alone
    (worker,) = out["spec"]["initContainers"]
    assert worker["name"] == names.INJECTED_CONTAINER and worker["restartPolicy"] == "Always"
    assert worker["image"] == "registry.test/offtake:1.2.3"
    assert worker["args"] == ["worker", "--pipeline", names.PIPELINE_PATH, "--probe-port", "9101"]
    check_container(worker["securityContext"], {}, "injected")  # restricted without pod help
    assert worker["securityContext"]["runAsUser"] == 10001
    # /drain on, for the pod and its node only; no secret anywhere in the pod spec.
    env = {e["name"]: e for e in worker["env"]}
    assert env["OFFTAKE_DRAIN"]["value"] == "true"
    assert env["OFFTAKE_NODE_IPS"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.hostIP"}}
    assert not any("TOKEN" in name for name in env)
    volumes = {v["name"]: v for v in out["spec"]["volumes"]}
    assert volumes["data"] == {"name": "data", "emptyDir": {}}
    assert volumes["offtake-pipeline"]["configMap"]["name"] == "orders-pipeline"
    assert volumes["offtake-kafka-secret"]["secret"]["secretName"] == "s"
    assert {m["name"] for m in worker["volumeMounts"]} <= set(volumes)
    # No service account token in the worker: an empty directory where it would be mounted.
    (shadow,) = [m for m in worker["volumeMounts"] if "serviceaccount" in m["mountPath"]]
    assert volumes[shadow["name"]]["emptyDir"] == {"sizeLimit": "1Mi"}
    app, proxy = out["spec"]["containers"]
    assert app["lifecycle"]["preStop"]["httpGet"] == {"path": "/drain", "port": 9100}
    assert "lifecycle" not in proxy
    assert out["spec"]["terminationGracePeriodSeconds"] >= 25 + names.GRACE_EXTRA_SECONDS
    assert out["metadata"]["labels"] == {
        "app": "shop",
        names.PIPELINE_LABEL: "orders",
        names.INJECTED_LABEL: "true",
    }
    assert len(out["metadata"]["annotations"][names.INJECTED_ANNOTATION]) == 64


def test_the_app_container_is_chosen_by_annotation_and_its_own_prestop_is_kept() -> None:
    pod = app_pod(**{names.APP_CONTAINER_ANNOTATION: "proxy"})
    pod["spec"]["containers"][1]["lifecycle"] = {"preStop": {"sleep": {"seconds": 5}}}
    out, warnings = inject_into(pod)
    assert out["spec"]["containers"][1]["lifecycle"] == {"preStop": {"sleep": {"seconds": 5}}}
    assert "lifecycle" not in out["spec"]["containers"][0]
    assert len(warnings) == 1 and "own preStop hook" in warnings[0]
    with pytest.raises(inject.InjectionError, match="names no container"):
        inject_into(app_pod(**{names.APP_CONTAINER_ANNOTATION: "nope"}))


def test_conflicts_with_the_pod_are_refused_by_name() -> None:
    with pytest.raises(inject.InjectionError, match=r"port 8080.*spec\.metrics\.port"):
        inject_into(app_pod(), metrics={"port": 8080})
    with pytest.raises(inject.InjectionError, match=r"port 8080.*spec\.metrics\.probePort"):
        inject_into(app_pod(), metrics={"probePort": 8080})
    pod = app_pod()
    pod["spec"]["volumes"].append({"name": "offtake-tmp", "emptyDir": {}})
    with pytest.raises(inject.InjectionError, match="offtake-tmp"):
        inject_into(pod)


def test_status_lists_injected_pods_and_warns_past_the_partition_count() -> None:
    def pod(name: str, ready: bool, checksum: str = "c1") -> dict[str, Any]:
        return {
            "metadata": {"name": name, "annotations": {names.INJECTED_ANNOTATION: checksum}},
            "status": {"initContainerStatuses": [{"name": "offtake-worker", "ready": ready}]},
        }

    pods = [pod("b", True), pod("a", False, "old"), pod("c", True)]
    seen = status.Observed("orders", 1, 0, pods=pods, checksum="c1", partitions=2)
    st, events = status.compute_status({}, seen, now="t")
    assert st["injectedPods"] == [
        {"name": "a", "ready": False, "updated": False},
        {"name": "b", "ready": True, "updated": True},
        {"name": "c", "ready": True, "updated": True},
    ]
    assert (st["replicas"], st["readyReplicas"], st["updatedReplicas"]) == (3, 2, 2)
    excess = next(c for c in st["conditions"] if c["type"] == status.EXCESS)
    assert excess["status"] == "True" and "1 workers stay idle" in excess["message"]
    assert any(e.reason == status.EXCESS for e in events)
    # Once warned, not again while it stays true.
    _, again = status.compute_status(st, seen, now="t2")
    assert not any(e.reason == status.EXCESS for e in again)
    none, _ = status.compute_status({}, status.Observed("orders", 1, 0, pods=[]), now="t")
    assert none["injectedPods"] == [] and "no pod is annotated" in none["message"]


def test_webhook_settings_need_a_certificate_and_key() -> None:
    from offtake_operator.settings import SettingsError

    assert OperatorConfig.from_env({}).webhook_port == 0  # no webhook unless asked for
    with pytest.raises(SettingsError, match="OFFTAKE_WEBHOOK_CERT_FILE and OFFTAKE_WEBHOOK_KEY"):
        OperatorConfig.from_env({"OFFTAKE_WEBHOOK_PORT": "9443"})
    config = OperatorConfig.from_env(
        {
            "OFFTAKE_WEBHOOK_PORT": "9443",
            "OFFTAKE_WEBHOOK_CERT_FILE": "/c/tls.crt",
            "OFFTAKE_WEBHOOK_KEY_FILE": "/c/tls.key",
        }
    )
    assert (config.webhook_port, config.webhook_address) == (9443, "0.0.0.0")
    assert config.webhook_cert_file == "/c/tls.crt" and config.webhook_key_file == "/c/tls.key"
