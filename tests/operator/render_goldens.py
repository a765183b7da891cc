"""Every child the operator renders, for every example and a matrix of specs, as YAML text.

The render package's split (issue 40 item 1) had to leave each child byte for byte as it was:
these goldens were written by the code before the split, and test_render_goldens.py renders
the same inputs with today's code and compares. A change to a child that is meant regenerates
them, and the diff shows in review::

    .venv/bin/python tests/operator/render_goldens.py --write

The inputs: each examples/*.yaml as it is, then with the variants below (Kafka Secrets, pod
template settings, resources, paused, autoscaling on messages, seconds and a queue backlog,
an SLO, ServiceMonitor labels, Spark on Kubernetes) under the operator's defaults, and the
first two also under the chart's NetworkPolicy with metrics peers and a pull policy.
"""

from __future__ import annotations

import copy
import dataclasses
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from offtake.config import ConfigError, parse_pipeline
from offtake.config.redrive import dlq_topic_of, parse_redrive
from offtake_operator import inject, render
from offtake_operator.operator_spec import parse_operator_spec
from offtake_operator.reconcile import worker_manifest
from offtake_operator.render.slo_rules import render_prometheus_rule
from offtake_operator.render.worker_network_policy import worker_network_policies
from offtake_operator.settings import OperatorConfig

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
GOLDENS = Path(__file__).resolve().parent / "goldens"
JSON = dict[str, Any]
KAFKA_MOUNTS = [
    ("orders-kafka", {"password": "sasl.password", "user": "sasl.username"}),
    ("cluster-ca", {"ca.crt": "ssl.ca.pem"}),
]


def _set(path: str, value: Any) -> Callable[[JSON], None]:
    def apply(spec: JSON) -> None:
        *parents, leaf = path.split(".")
        node = spec
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = copy.deepcopy(value)

    return apply


#: name -> (edits of spec, applies to this example stem or every one when None).
VARIANTS: dict[str, tuple[list[Callable[[JSON], None]], str | None]] = {
    "base": ([], None),
    "secrets-template": (
        [
            _set("kafka.secretRef", {"name": "orders-kafka"}),
            _set("kafka.caSecretRef", {"name": "cluster-ca"}),
            _set(
                "kafka.config",
                {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512"},
            ),
            _set(
                "template",
                {
                    "metadata": {"labels": {"team": "shop"}, "annotations": {"a": "b"}},
                    "spec": {
                        "nodeSelector": {"disk": "ssd"},
                        "serviceAccountName": "orders",
                        "env": [{"name": "X", "value": "1"}],
                        "securityContext": {"runAsUser": 4242},
                    },
                },
            ),
            _set("resources", {"requests": {"cpu": "250m"}}),
            _set("replicas", 3),
        ],
        None,
    ),
    "paused": ([_set("paused", True)], None),
    "autoscale-messages": (
        [_set("autoscaling", {"enabled": True, "maxReplicas": 6, "targetLagPerReplica": 500})],
        "kafka-to-kafka",
    ),
    "autoscale-seconds": (
        [
            _set(
                "autoscaling",
                {
                    "enabled": True,
                    "minReplicas": 0,
                    "targetLagSeconds": 30,
                    "prometheusAddress": "http://prometheus:9090",
                },
            )
        ],
        "kafka-to-kafka",
    ),
    "autoscale-backlog": (
        [
            _set(
                "autoscaling",
                {
                    "enabled": True,
                    "targetLagPerReplica": 100,
                    "prometheusAddress": "http://prometheus:9090",
                },
            )
        ],
        "queue-mode",
    ),
    "autoscale-queue-seconds": (
        [_set("autoscaling", {"enabled": True, "targetLagSeconds": 20})],
        "queue-mode",
    ),
    "slo-monitor": (
        [
            _set(
                "slo",
                {
                    "maxLagSeconds": 60,
                    "maxErrorRatio": 0.01,
                    "maxTimeSinceLastCommitSeconds": 300,
                },
            ),
            _set("serviceMonitor", {"labels": {"release": "prom"}}),
        ],
        "log-sink",
    ),
    "spark-kubernetes": (
        [
            _set(
                "sink.spark.submit",
                {"mode": "kubernetes", "conf": {"spark.sql.shuffle.partitions": "8"}},
            )
        ],
        "spark-parquet",
    ),
}

CONFIGS = {
    "defaults": OperatorConfig(),
    "policy": dataclasses.replace(
        OperatorConfig(),
        worker_network_policy=True,
        worker_metrics_from=({"podSelector": {"matchLabels": {"app": "prometheus"}}},),
        worker_image_pull_policy="IfNotPresent",
        service_monitor_labels={"release": "kps"},
    ),
}


def _body(example: Path, edits: list[Callable[[JSON], None]]) -> JSON:
    body: JSON = yaml.safe_load(example.read_text())
    body["metadata"].setdefault("namespace", "shop")
    body["metadata"]["uid"] = "00000000-0000-0000-0000-000000000001"
    for edit in edits:
        edit(body["spec"])
    return body


def _children(body: JSON, config: OperatorConfig) -> list[Any]:
    pipeline = parse_pipeline(worker_manifest(body))
    extras = parse_operator_spec(body["spec"])
    derived = {"sasl.username": "orders"} if "secretRef" in body["spec"]["kafka"] else None
    docs: list[Any] = [
        list(render.security_contexts(body)),
        render.pipeline_document(body, derived),
        render.render_configmap(body, derived),
        render.render_service(body, pipeline),
        render.render_pdb(body),
        render.render_service_monitor(body, config.service_monitor_labels),
        {"desired": render.desired_worker_replicas(pipeline, rewinding=False)},
        {"rewinding": render.desired_worker_replicas(pipeline, rewinding=True)},
        {"grace": render.grace_period_seconds(pipeline)},
        {"secret_key_env": render.secret_key_env(pipeline)},
        {"schema_registry_secrets": render.schema_registry_secrets(pipeline)},
        {"resources": render.worker_resources(body["spec"], pipeline, config)},
        {"keda_security": render.keda_security(pipeline)},
        {"lag_seconds_query": render.lag_seconds_query(body)},
    ]
    if pipeline.mode == "inject":
        workload: JSON = yaml.safe_load((EXAMPLES / "inject" / "deployment.yaml").read_text())
        for mounts in (None, KAFKA_MOUNTS):
            pod, patch = inject.injected_pod(
                copy.deepcopy(workload["spec"]["template"]),
                body,
                pipeline,
                config,
                kafka_mounts=mounts,
                kafka_config=derived,
            )
            docs += [pod, patch]
    for mounts in (None, KAFKA_MOUNTS) if pipeline.mode != "inject" else ():
        docs.append(
            render.render_deployment(
                body, pipeline, config, replicas=2, kafka_mounts=mounts, kafka_config=derived
            )
        )
    auto = extras.autoscaling
    if not auto.enabled:
        auto = dataclasses.replace(auto, enabled=True)
    cap = render.replica_cap(pipeline, 4)
    docs.append({"cap": cap, "bounds": list(render.replica_bounds(auto, cap))})
    docs.append(render.render_hpa(body, auto, cap))
    docs.append(render.render_hpa(body, auto, None))
    docs.append({"keda": [render.uses_scaled_object(auto, s) for s in (True, False)]})
    if not auto.asks_prometheus or auto.prometheus_address is not None:
        for authenticated in (False, True):
            docs.append(
                render.render_scaled_object(body, pipeline, auto, cap, authenticated=authenticated)
            )
    docs.append(render.render_trigger_authentication(body, KAFKA_MOUNTS))
    docs.append(render.render_trigger_authentication(body, []))
    docs.append({"spark_connect": render.uses_spark_connect(pipeline)})
    if render.uses_spark_connect(pipeline):
        docs.append(render.render_spark_connect(body, pipeline))
        docs.append(render.render_spark_connect_token(body, "golden"))
        docs.extend(render.render_spark_network_policies(body))
    docs.extend(worker_network_policies(body, pipeline, config))
    if extras.slo is not None:
        docs.append(render_prometheus_rule(body, extras.slo, {"release": "kps"}))
    dlq = dlq_topic_of(body["spec"])
    request = parse_redrive(
        {"id": "g1", "from": dlq or "dlq", "until": "2026-05-01T12:00:00Z"}, dlq
    )
    assert request is not None
    for mounts in (None, KAFKA_MOUNTS):
        docs.append(
            render.render_redrive_job(
                body, pipeline, config, request, "g-redrive", kafka_mounts=mounts
            )
        )
    return docs


def cases() -> Iterator[tuple[str, str]]:
    """(golden file name, its YAML) for every example, variant and operator configuration."""
    for example in sorted(EXAMPLES.glob("*.yaml")):
        for variant, (edits, only) in VARIANTS.items():
            if only is not None and only != example.stem:
                continue
            for config_name, config in CONFIGS.items():
                if config_name != "defaults" and variant not in ("base", "secrets-template"):
                    continue  # the configuration's effects show on these two already
                body = _body(example, edits)
                try:
                    parse_pipeline(worker_manifest(body))
                except ConfigError:
                    continue  # a variant the example's mode refuses (inject: no paused)
                docs = _children(body, copy.deepcopy(config))
                text = yaml.safe_dump_all(docs, sort_keys=False, default_flow_style=False)
                yield f"{example.stem}.{variant}.{config_name}.yaml", text


def main(argv: list[str]) -> int:
    if argv != ["--write"]:
        print(__doc__)
        return 2
    GOLDENS.mkdir(exist_ok=True)
    for old in GOLDENS.glob("*.yaml"):
        old.unlink()
    count = 0
    for name, text in cases():
        (GOLDENS / name).write_text(text)
        count += 1
    print(f"wrote {count} goldens to {GOLDENS}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
