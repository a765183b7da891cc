"""Every YAML file the project ships parses under a strict parser: no key twice in a mapping.

PyYAML (and so kubectl's and the operator's loaders) keeps the last of two equal keys without a
word; strict parsers (kubeconform, sigs.k8s.io/yaml in strict mode, ruamel) refuse the file. The
CRD had three duplicate ``description`` keys that way, and kubeconform rejected it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode

ROOT = Path(__file__).resolve().parents[2]
#: Plain YAML (helm templates are Go templates: the manifest scan checks their output).
SHIPPED = sorted(
    [
        *ROOT.glob("crds/*.yaml"),
        *ROOT.glob("helm/offtake/crds/*.yaml"),
        *ROOT.glob("helm/offtake/dashboards/*.yaml"),
        ROOT / "helm" / "offtake" / "values.yaml",
        ROOT / "helm" / "offtake" / "Chart.yaml",
        *ROOT.glob("examples/**/*.yaml"),
        *ROOT.glob("scripts/scan/*.yaml"),
    ]
)


class StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a mapping with the same key twice, naming it and both lines."""


def _mapping(loader: StrictLoader, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        line = key_node.start_mark.line + 1
        if key in seen:
            raise ConstructorError(
                None,
                None,
                f"duplicate key {key!r} (lines {seen[key]} and {line})",
                key_node.start_mark,
            )
        seen[key] = line
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_shipped_yaml_has_no_duplicate_keys(path: Path) -> None:
    try:
        docs = list(yaml.load_all(path.read_text(), Loader=StrictLoader))
    except ConstructorError as exc:
        pytest.fail(f"{path.relative_to(ROOT)}: {exc}")
    assert docs


def test_the_strict_loader_refuses_a_duplicate_key_naming_it() -> None:
    text = "properties:\n  topics:\n    description: a\n    type: array\n    description: b\n"
    with pytest.raises(ConstructorError, match=r"duplicate key 'description' \(lines 3 and 5\)"):
        yaml.load(text, Loader=StrictLoader)
    assert yaml.load("a: 1\nb: {a: 2}\n", Loader=StrictLoader) == {"a": 1, "b": {"a": 2}}


def test_the_crd_is_among_the_checked_files() -> None:
    checked = {p.relative_to(ROOT).as_posix() for p in SHIPPED}
    assert {"crds/consumerpipeline.yaml", "helm/offtake/crds/consumerpipeline.yaml"} <= checked
