"""Short variant of chaos scenario 4 (the long one: ``python bench/chaos.py``): the operator
SIGKILLed while it reconciles pipelines on the real kube-apiserver, then restarted; all
converge, with no child duplicated or orphaned."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.chaos.s04_operator_kills import apply_crd, operator_kills
from support.reports import report

from offtake_testbed.kube import ControlPlane

pytestmark = [pytest.mark.chaos, pytest.mark.e2e]


def test_an_operator_killed_mid_reconcile_converges_without_duplicates_or_orphans(
    control_plane: ControlPlane, kube_namespace: str, tmp_path: Path
) -> None:
    apply_crd(control_plane)
    outcome = operator_kills(
        control_plane, kube_namespace, tmp_path, pipelines=20, kills=1, every=1.5
    )
    report("chaos-operator-kills", **vars(outcome))
    assert outcome.lost == 0 and outcome.duplicated == 0, outcome
