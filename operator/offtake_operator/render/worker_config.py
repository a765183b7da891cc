"""The worker's configuration document (the pipeline manifest it reads) and its ConfigMap."""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Mapping
from typing import Any

import yaml

from offtake.contract import OPERATOR_ONLY_FIELDS

from .. import names
from ..names import API_VERSION, KIND
from .metadata import JSON, child_metadata, meta

#: Spec fields that shape the Deployment rather than the worker's behaviour. They stay out of
#: the worker's pipeline.yaml so that, e.g., scaling or pausing does not change the config
#: checksum and roll every pod.
DEPLOYMENT_ONLY_FIELDS = ("replicas", "paused", *OPERATOR_ONLY_FIELDS)


def pipeline_document(
    body: Mapping[str, Any], kafka_config: Mapping[str, str] | None = None
) -> JSON:
    """The manifest the worker reads: this resource without status and deployment-only fields.

    ``kafka_config`` adds librdkafka properties the operator derived (the SCRAM user name of a
    Strimzi Secret); the pipeline's own ``kafka.config`` wins over them.
    """
    name, namespace = meta(body)
    spec = {k: copy.deepcopy(v) for k, v in body["spec"].items() if k not in DEPLOYMENT_ONLY_FIELDS}
    if kafka_config:
        kafka = spec.setdefault("kafka", {})
        kafka["config"] = {**kafka_config, **(kafka.get("config") or {})}
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def pipeline_yaml(body: Mapping[str, Any], kafka_config: Mapping[str, str] | None = None) -> str:
    # Every pass renders it twice (ConfigMap, checksum): PyYAML's emitter is slow enough to
    # matter at a thousand pipelines, the JSON key of the same document is not.
    return _yaml_of(json.dumps(pipeline_document(body, kafka_config), sort_keys=True))


@functools.lru_cache(maxsize=4096)
def _yaml_of(document: str) -> str:
    # sort_keys: the same spec must always give the same text, hence the same checksum.
    return yaml.safe_dump(json.loads(document), sort_keys=True, default_flow_style=False)


def render_configmap(
    body: Mapping[str, Any], kafka_config: Mapping[str, str] | None = None
) -> JSON:
    pipeline, _ = meta(body)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": child_metadata(body, names.configmap_name(pipeline), "config"),
        "data": {names.CONFIG_KEY: pipeline_yaml(body, kafka_config)},
    }
