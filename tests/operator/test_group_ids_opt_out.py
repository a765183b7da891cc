"""Group ids confined to the pipeline's namespace by default, and the cluster admin's opt-out
(issue 38 item 8, "What users expect"): the chart's ``operator.confineGroupIds`` reaches the
operator's settings as rendered, and with it off another namespace's group id is accepted.
The refusal through the operator itself (Degraded, no workers) is
tests/operator/test_operator_kmock.py::test_a_group_id_outside_the_namespace_fails_naming_the_field.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from offtake.config.loader import parse_pipeline
from offtake.contract import ConfigError
from offtake_operator import group_ids
from offtake_operator.settings import OperatorConfig
from offtake_testbed.kube.install import install_helm

CHART = Path(__file__).resolve().parents[2] / "helm" / "offtake"


def _operator_env(*values: str) -> dict[str, str]:
    """The operator container's literal env as ``helm template`` renders it."""
    args = [str(install_helm()), "template", "offtake", str(CHART), "-n", "offtake-system"]
    for v in values:
        args += ["--set", v]
    out = subprocess.run(args, capture_output=True, text=True, check=True, timeout=120).stdout
    (deployment,) = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "Deployment"]
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    return {e["name"]: e["value"] for e in env if "value" in e}


def _theirs() -> object:
    return parse_pipeline(
        {
            "apiVersion": "offtake.dev/v1alpha1",
            "kind": "ConsumerPipeline",
            "metadata": {"name": "orders", "namespace": "shop"},
            "spec": {
                "kafka": {"bootstrapServers": "kafka:9092"},
                "source": {"topics": ["orders"], "groupId": "payments.orders"},
                "sink": {"log": {}},
            },
        }
    )


def test_the_chart_confines_group_ids_by_default_and_the_admin_can_lift_it() -> None:
    confined = OperatorConfig.from_env(_operator_env())
    assert confined.confine_group_ids is True
    with pytest.raises(ConfigError, match=r"spec\.source\.groupId.*must start with 'shop\.'"):
        group_ids.check("shop", _theirs(), confined.confine_group_ids)  # type: ignore[arg-type]

    lifted = OperatorConfig.from_env(_operator_env("operator.confineGroupIds=false"))
    assert lifted.confine_group_ids is False
    group_ids.check("shop", _theirs(), lifted.confine_group_ids)  # type: ignore[arg-type]
