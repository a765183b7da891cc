"""The test bed's helm build recipe: a released helm's ldflags, and a cache that rebuilds a helm
built the old way (without them, helm takes every cluster for v1.20).

The go commands are recorded, not run: the real build is the one scripts/setup.sh does, and
tests/contract/test_chart_defaults.py checks that binary's behaviour.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from offtake_testbed.kube import install as kube

HELM_GO_MOD = "module helm.sh/helm/v3\n\nrequire (\n\tk8s.io/client-go v0.34.2\n)\n"


def test_the_ldflags_are_helms_makefiles_for_its_client_go() -> None:
    flags = kube._helm_ldflags("v3.19.5", HELM_GO_MOD)
    assert "-X helm.sh/helm/v3/internal/version.version=v3.19.5" in flags
    for package in ("helm.sh/helm/v3/pkg/chartutil", "helm.sh/helm/v3/pkg/lint/rules"):
        assert f"-X {package}.k8sVersionMajor=1" in flags
        assert f"-X {package}.k8sVersionMinor=34" in flags
    with pytest.raises(kube.KubeBuildError, match=r"does not require k8s\.io/client-go"):
        kube._helm_ldflags("v3.19.5", "module helm.sh/helm/v3\n")


def test_a_helm_built_without_them_is_rebuilt_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OFFTAKE_CACHE", str(tmp_path))
    bin_dir = tmp_path / "helm" / "v3.19.5" / "bin"
    bin_dir.mkdir(parents=True)
    old = bin_dir / "helm"
    old.write_text("#!/bin/sh\n")
    old.chmod(0o755)
    # What the previous recipe wrote: no "recipe" key.
    (bin_dir / ".installed.json").write_text(json.dumps({"helm": "v3.19.5"}))
    go_mod = tmp_path / "helm.mod"
    go_mod.write_text(HELM_GO_MOD)
    calls: list[Sequence[str]] = []

    def run_go(
        args: Sequence[str],
        *,
        cwd: Path,
        log: Path,
        what: str,
        extra_env: Mapping[str, str] | None = None,
    ) -> str:
        calls.append(list(args))
        if args[0] == "mod":
            return json.dumps({"GoMod": str(go_mod)})
        assert extra_env is not None and extra_env["GOBIN"] == str(bin_dir)
        return ""

    monkeypatch.setattr(kube, "run_go", run_go)
    assert kube.install_helm("v3.19.5") == old
    (download, install) = calls
    assert download[:3] == ["mod", "download", "-json"]
    ldflags: Any = next(a for a in install if a.startswith("-ldflags="))
    assert "internal/version.version=v3.19.5" in ldflags
    assert "chartutil.k8sVersionMinor=34" in ldflags
    marker = json.loads((bin_dir / ".installed.json").read_text())
    assert marker["recipe"] == kube._HELM_RECIPE and marker["helm"] == "v3.19.5"
    # Built with the recipe: the cache answers from now on.
    assert kube.install_helm("v3.19.5") == old
    assert len(calls) == 2
