"""Check a manifest offline against the ConsumerPipeline CRD itself: schema and CEL rules.

The API server enforces crds/consumerpipeline.yaml; ``offtake validate`` should say "ok" only
for what it would accept. Rather than a second copy of the rules, this reads the CRD (shipped
in this package as ``consumerpipeline.yaml``, a copy crds/generate.py writes), applies its
defaults as the server does, checks its OpenAPI schema with jsonschema and evaluates its
``x-kubernetes-validations`` CEL rules with cel-python. It reports every problem it finds.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from importlib import resources
from typing import Any

import yaml

from offtake.config._fields import field_name, with_defaults

Node = Mapping[str, Any]


@functools.cache
def crd_schema() -> dict[str, Any]:
    """The openAPIV3Schema of the CRD's (only) version."""
    text = resources.files("offtake.config").joinpath("consumerpipeline.yaml").read_text()
    crd = yaml.safe_load(text)
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert isinstance(schema, dict)
    return schema


def crd_node(*path: str) -> Node:
    """The schema of the field at ``path`` (``crd_node("spec", "autoscaling")``)."""
    node: Node = crd_schema()
    for key in path:
        node = node["properties"][key]
    return node


def crd_problems(manifest: Mapping[str, Any]) -> list[str]:
    """Every way ``manifest`` breaks the CRD, as "field.path: problem" lines; [] if none."""
    import jsonschema

    schema = crd_schema()
    out_of_range = list(_out_of_int64(manifest, ()))
    if out_of_range:
        # The API server refuses these while decoding, before any schema check, and CEL
        # cannot hold them: report them alone rather than rules that cannot be evaluated.
        return out_of_range
    doc = with_defaults(manifest, schema)
    validator = jsonschema.Draft4Validator(json_schema(schema))
    problems = [
        f"{_where(error.absolute_path)}: {error.message}"
        for error in sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
    ]
    problems += _list_map_duplicates(schema, doc, ())
    schema_ok = not problems
    for path, rule, message, value in _cel_targets(schema, doc, ()):
        holds = _cel_holds(rule, value)
        # A rule that could not be evaluated (None) may rely on what the schema guarantees
        # (types, required fields): with schema errors already reported, it adds nothing.
        if holds is False or (holds is None and schema_ok):
            problems.append(f"{_where(path)}: {message or 'breaks the rule ' + rule}")
    return problems


def _message(rule: Mapping[str, Any], value: Any) -> str:
    """A rule's messageExpression evaluated on ``value`` (e.g. naming the refused key), as the
    API server does; its static message when there is none or it cannot be evaluated."""
    static = str(rule.get("message", ""))
    expression = rule.get("messageExpression")
    if not expression:
        return static
    from celpy.adapter import json_to_cel

    try:
        text = _program(expression).evaluate({"self": json_to_cel(value)})
    except Exception:
        return static  # the server, too, falls back to message
    return str(text) if isinstance(text, str) else static


_INT64 = range(-(2**63), 2**63)


def _out_of_int64(value: Any, path: tuple[Any, ...]) -> Iterator[str]:
    if isinstance(value, int) and not isinstance(value, bool) and value not in _INT64:
        yield f"{_where(path)}: {value} is outside the 64-bit integer range"
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _out_of_int64(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _out_of_int64(item, (*path, i))


def _where(path: Iterator[Any] | Any) -> str:
    parts = [f"[{p}]" if isinstance(p, int) else field_name(p) for p in path]
    return ".".join(parts).replace(".[", "[") or "<manifest>"


def json_schema(node: Any) -> Any:
    """The CRD schema as plain JSON Schema: Kubernetes' extensions removed or translated."""
    if isinstance(node, list):
        return [json_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key.startswith("x-kubernetes-"):
            continue
        if key in ("properties", "patternProperties"):
            out[key] = {k: json_schema(v) for k, v in value.items()}
        elif key in ("default", "enum", "required", "example", "description"):
            out[key] = value
        else:
            out[key] = json_schema(value)
    if node.get("x-kubernetes-int-or-string"):
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    return out


def _list_map_duplicates(node: Node, value: Any, path: tuple[Any, ...]) -> list[str]:
    """Items of an ``x-kubernetes-list-type: map`` list that repeat their keys (the server
    refuses them as duplicate values)."""
    out: list[str] = []
    if isinstance(value, Mapping):
        for key, sub in node.get("properties", {}).items():
            if key in value:
                out += _list_map_duplicates(sub, value[key], (*path, key))
    elif isinstance(value, list) and isinstance(node.get("items"), Mapping):
        keys = node.get("x-kubernetes-list-map-keys", [])
        seen: set[tuple[Any, ...]] = set()
        for i, item in enumerate(value):
            if node.get("x-kubernetes-list-type") == "map" and isinstance(item, Mapping):
                ident = tuple(repr(item.get(k)) for k in keys)
                if ident in seen:
                    named = ", ".join(f"{k}={item.get(k)!r}" for k in keys)
                    at = (*path, i, *keys) if len(keys) == 1 else (*path, i)
                    out.append(f"{_where(at)}: duplicate value ({named})")
                seen.add(ident)
            out += _list_map_duplicates(node["items"], item, (*path, i))
    return out


def _cel_targets(
    node: Node, value: Any, path: tuple[Any, ...]
) -> Iterator[tuple[tuple[Any, ...], str, str, Any]]:
    """(path, rule, message, value) for each CEL rule of a node that has a value."""
    for rule in node.get("x-kubernetes-validations", []):
        yield path, rule["rule"], _message(rule, value), value
    if isinstance(value, Mapping):
        for key, sub in node.get("properties", {}).items():
            if key in value:
                yield from _cel_targets(sub, value[key], (*path, key))
    elif isinstance(value, list) and "items" in node:
        for i, item in enumerate(value):
            yield from _cel_targets(node["items"], item, (*path, i))


@functools.cache
def _program(rule: str) -> Any:
    import celpy
    from celpy import celtypes

    # Kubernetes adds string functions to CEL that cel-python does not know; without them a
    # rule using one fails to evaluate, and validate would refuse what the API server accepts.
    kubernetes_extensions: dict[str, Any] = {
        "lowerAscii": lambda s: celtypes.StringType(str(s).lower()),
        "upperAscii": lambda s: celtypes.StringType(str(s).upper()),
    }
    env = celpy.Environment()
    return env.program(env.compile(rule), functions=kubernetes_extensions)


def _cel_holds(rule: str, value: Any) -> bool | None:
    """The rule's verdict on ``value``; None if it could not be evaluated (the server rejects
    that too: an evaluation error fails the rule)."""
    from celpy.adapter import json_to_cel
    from celpy.celtypes import BoolType
    from celpy.evaluation import CELEvalError

    try:
        result = _program(rule).evaluate({"self": json_to_cel(value)})
    except CELEvalError:
        return None
    except Exception:
        # cel-python raises plain Python errors on values the schema already refuses (e.g.
        # "config: null" iterated by a rule: TypeError); such a rule could not be evaluated.
        return None
    if not isinstance(result, BoolType):
        return None
    return bool(result)
