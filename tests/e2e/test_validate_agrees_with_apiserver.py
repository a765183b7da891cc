"""`offtake validate`'s CRD check and the real kube-apiserver agree on a corpus of manifests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from support.manifest_corpus import NAMED, corpus

from offtake.config.crd_check import crd_problems
from offtake_testbed.kube import ControlPlane
from offtake_testbed.pytest_plugin_kube import Kubectl

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

CRD = Path(__file__).resolve().parents[2] / "crds" / "consumerpipeline.yaml"


@pytest.fixture(scope="module")
def pipelines_crd(control_plane: ControlPlane) -> None:
    control_plane.kubectl("apply", "-f", str(CRD))
    control_plane.kubectl(
        "wait", "--for=condition=Established", "crd/consumerpipelines.offtake.dev", "--timeout=60s"
    )


@pytest.mark.parametrize(("case", "doc"), corpus(), ids=[c for c, _ in corpus()])
def test_validate_and_the_api_server_agree(
    kubectl: Kubectl, kube_namespace: str, pipelines_crd: None, case: str, doc: dict[str, Any]
) -> None:
    server = kubectl(
        "apply",
        "--dry-run=server",
        "-n",
        kube_namespace,
        "-f",
        "-",
        input=yaml.safe_dump(doc),
        check=False,
    )
    problems = crd_problems(doc)
    assert (server.returncode == 0) == (problems == []), (
        f"{case}: server {'accepted' if server.returncode == 0 else 'rejected'} "
        f"({server.stderr.strip()}); validate found {problems}"
    )
    if case in NAMED:
        assert NAMED[case] in server.stderr, server.stderr
        assert any(NAMED[case] in p for p in problems), problems
