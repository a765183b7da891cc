"""Short variant of chaos scenario 4 (the long one: ``python bench/chaos.py``): the operator
SIGKILLed while it reconciles pipelines on the real kube-apiserver, then restarted; all
converge, with no child duplicated or orphaned."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.chaos import operator_kills
from support.kube import wait_for
from support.reports import report

from offtake_testbed.kube import ControlPlane

pytestmark = [pytest.mark.chaos, pytest.mark.e2e]


def test_an_operator_killed_mid_reconcile_converges_without_duplicates_or_orphans(
    control_plane: ControlPlane, kube_namespace: str, tmp_path: Path
) -> None:
    crd = Path(__file__).parents[2] / "crds" / "consumerpipeline.yaml"
    control_plane.kubectl("apply", "-f", str(crd))
    # Right after apply the CRD may have no status.conditions yet, and kubectl wait then
    # fails at once ("accessor error") instead of waiting: ask again until it answers.
    wait_for(
        lambda: (
            control_plane.kubectl(
                "wait",
                "--for=condition=Established",
                "crd/consumerpipelines.offtake.dev",
                "--timeout=10s",
                check=False,
            ).returncode
            == 0
        ),
        timeout=90,
        what="the ConsumerPipeline CRD to be established",
    )
    outcome = operator_kills(
        control_plane, kube_namespace, tmp_path, pipelines=20, kills=1, every=1.5
    )
    report("chaos-operator-kills", **vars(outcome))
    assert outcome.lost == 0 and outcome.duplicated == 0, outcome
