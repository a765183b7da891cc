"""Chaos scenario 5, manifests: hypothesis breaks a valid ConsumerPipeline one field at a time
(a field of the CRD's schema set to any JSON value, removed, or an unknown field added) and
hands it to ``offtake validate`` and to the operator's validation. Never a traceback: exit 0,
or exit 2 with every problem naming a field; the operator's ConfigError names the field too,
never its catch-all for a loader bug ("cannot be read")."""

from __future__ import annotations

import contextlib
import copy
import io
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.manifest_corpus import ROOT, minimal

from offtake.cli import main as offtake_main
from offtake.config import ConfigError
from offtake_operator.reconcile import validate as operator_validate

pytestmark = pytest.mark.chaos
# bench/chaos.py runs these with more examples; the default suite with 150 each (~15 s).
EXAMPLES = int(os.environ.get("OFFTAKE_CHAOS_EXAMPLES", "150"))

_CRD = yaml.safe_load((ROOT / "crds" / "consumerpipeline.yaml").read_text())
_SPEC_SCHEMA = _CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
# A problem line of `offtake validate`: "  <field path>: <problem>".
_PROBLEM = re.compile(r"^  (spec|metadata|apiVersion|kind|<manifest>)(\S|'[^']*')*: \S")


def _field_paths(
    schema: dict[str, Any], prefix: tuple[str, ...], depth: int
) -> Iterator[tuple[str, ...]]:
    for name, sub in (schema.get("properties") or {}).items():
        path = (*prefix, name)
        yield path
        if depth > 1:
            yield from _field_paths(sub, path, depth - 1)
        items = sub.get("items")
        if isinstance(items, dict) and depth > 1:
            yield from _field_paths(items, (*path, "0"), depth - 1)


FIELDS = sorted(set(_field_paths(_SPEC_SCHEMA, ("spec",), 4)))
_scalars = (
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=20)
)
JSON = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)
Mutation = tuple[str, tuple[str, ...], Any]
MUTATIONS = st.one_of(
    st.tuples(st.just("set"), st.sampled_from(FIELDS), JSON),
    st.tuples(
        st.just("delete"),
        st.sampled_from(
            [
                ("spec", "kafka"),
                ("spec", "source"),
                ("spec", "sink"),
                ("spec", "kafka", "bootstrapServers"),
                ("spec", "source", "topics"),
                ("metadata", "name"),
            ]
        ),
        st.none(),
    ),
    st.tuples(st.just("unknown"), st.sampled_from([f[:-1] or ("spec",) for f in FIELDS]), JSON),
)


def mutate(doc: dict[str, Any], how: str, path: tuple[str, ...], value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    node: Any = doc
    for i, key in enumerate(path[:-1] if how != "unknown" else path):
        nxt = (node[0] if node else None) if isinstance(node, list) else node.get(key)
        if nxt is None or not isinstance(nxt, dict | list):
            nxt = [] if (i + 1 < len(path) and path[i + 1] == "0") else {}
            if isinstance(node, list):
                node[:1] = [nxt]
            else:
                node[key] = nxt
        node = nxt
    if isinstance(node, list):
        node.append(value)
    elif how == "set":
        node[path[-1]] = value
    elif how == "delete":
        node.pop(path[-1], None)
    elif isinstance(node, dict):
        node["zzUnknownField"] = value
    return doc


def run_validate(path: Path) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = offtake_main(["validate", str(path)])
    return code, out.getvalue() + err.getvalue()


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(st.lists(MUTATIONS, min_size=1, max_size=3))
def test_offtake_validate_names_the_field_of_every_problem_and_never_crashes(
    tmp_path: Path, mutations: list[Mutation]
) -> None:
    doc = minimal("fuzzed")
    for how, path, value in mutations:
        doc = mutate(doc, how, path, value)
    target = tmp_path / "pipeline.yaml"
    target.write_text(yaml.safe_dump(doc))
    code, text = run_validate(target)
    assert "Traceback" not in text
    assert code in (0, 2), text
    if code == 2:
        problems = [line for line in text.splitlines()[1:] if line.startswith("  ")]
        assert problems, text
        for line in problems:
            assert _PROBLEM.match(line), f"a problem that names no field: {line!r}\n{text}"
            assert line.isprintable(), f"a problem with control characters: {line!r}"


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.lists(MUTATIONS, min_size=1, max_size=3))
def test_the_operator_names_the_field_of_a_bad_resource_and_never_crashes(
    mutations: list[Mutation],
) -> None:
    body = minimal("fuzzed")
    body["metadata"]["namespace"] = "chaos"
    for how, path, value in mutations:
        if path[0] != "metadata":  # the API server guarantees metadata.name and namespace
            body = mutate(body, how, path, value)
    try:
        operator_validate(body)
    except ConfigError as exc:
        assert "cannot be read" not in str(exc), f"a loader bug reached the catch-all: {exc}"
        assert re.match(r"(spec|metadata)\b", exc.path), exc


@pytest.mark.parametrize(
    "text",
    [
        "",
        "- just\n- a list\n",
        "spec: [unclosed",
        "\x00\x01binary",
        "kind: ConsumerPipeline\nspec: 3\n",
        "{a: {b: {c: [1, 2, {d: e}]}}}",
    ],
)
def test_offtake_validate_refuses_what_is_not_a_manifest_with_exit_2(
    tmp_path: Path, text: str
) -> None:
    target = tmp_path / "pipeline.yaml"
    target.write_text(text)
    code, out = run_validate(target)
    assert code == 2 and "Traceback" not in out and "offtake:" in out, out


@pytest.mark.parametrize(
    ("template", "field"),
    [
        (True, "spec.template"),
        ({"spec": 3}, "spec.template.spec"),
        ({"spec": {"securityContext": "root"}}, "spec.template.spec.securityContext"),
    ],
)
def test_a_pod_template_of_the_wrong_shape_is_named_by_the_operator(
    template: Any, field: str
) -> None:
    # Found by the hypothesis test above at 1,000 examples: "template: true" reached the
    # operator's catch-all ("spec: cannot be read: AttributeError(...)").
    body = minimal("template")
    body["metadata"]["namespace"] = "chaos"
    body["spec"]["template"] = template
    with pytest.raises(ConfigError) as caught:
        operator_validate(body)
    assert caught.value.path == field
