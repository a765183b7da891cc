"""pytest fixtures for the real Kubernetes control plane (see :mod:`offtake_testbed.kube`).

Register with ``pytest_plugins = ["offtake_testbed.pytest_plugin_kube"]`` in a conftest.

- ``control_plane`` (session): a started :class:`~offtake_testbed.kube.ControlPlane`. If building
  or starting fails, every test using it *fails* with the reason and the relevant log tail.
  It never skips.
- ``kubectl``: ``kubectl(*args, check=True, input=None, timeout=120.0) -> CompletedProcess``.
- ``kube_namespace``: a fresh namespace for one test, deleted afterwards.
- ``helm``: ``helm(*args, check=True, timeout=300.0) -> CompletedProcess`` against the control
  plane (helm is built with ``go install`` on first use).
- ``kube_node`` (session): a real node on the control plane, :class:`~offtake_testbed.node.Node`
  (kubelet + containerd + runc + CNI bridge + kube-scheduler), with the worker image
  (``OFFTAKE_NODE_IMAGES``, default ``localhost/offtake-worker:0.1.0``, built by
  scripts/build-image.sh) imported. Opt-in: only tests that ask for it start it.

The binaries are built during collection when a selected test uses these fixtures, so a cold
build (10-25 minutes on two cores) does not count against any test's timeout.

Environment: ``OFFTAKE_KUBE_VERSION`` picks another Kubernetes release;
``OFFTAKE_KEEP_KUBE_WORKDIR=1`` keeps the control plane's folder (logs, etcd data) after the
session and prints where it is.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Protocol

import pytest

from .kube import (
    KUBE_VERSION,
    ControlPlane,
    ControlPlaneError,
    KubeBuildError,
    install_control_plane,
    install_helm,
)
from .node import Node, NodeError, install_node

__all__ = ["Helm", "Kubectl", "control_plane", "helm", "kube_namespace", "kube_node", "kubectl"]


class Kubectl(Protocol):
    """The type of the ``kubectl`` fixture (``ControlPlane.kubectl``)."""

    def __call__(
        self,
        *args: str,
        check: bool = ...,
        input: str | None = ...,
        timeout: float = ...,
    ) -> subprocess.CompletedProcess[str]: ...


_BUILD_ERROR = pytest.StashKey[str]()
_HELM_BUILD_ERROR = pytest.StashKey[str]()


def _kube_version() -> str:
    return os.environ.get("OFFTAKE_KUBE_VERSION", KUBE_VERSION)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Build the binaries before any test starts, so the build is not charged to a test's timeout.

    Only when a selected test uses the fixtures; a failure is reported by the fixture.
    """
    if config.option.collectonly:
        return
    used: set[str] = set()
    for item in items:
        used.update(getattr(item, "fixturenames", ()))
    if used & {"control_plane", "kubectl", "kube_namespace", "helm"}:
        try:
            install_control_plane(_kube_version(), progress=sys.stderr)
        except KubeBuildError as exc:
            config.stash[_BUILD_ERROR] = str(exc)
    if "helm" in used:
        try:
            install_helm(progress=sys.stderr)
        except KubeBuildError as exc:
            config.stash[_HELM_BUILD_ERROR] = str(exc)


@pytest.fixture(scope="session")
def control_plane(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    version = _kube_version()
    error = request.config.stash.get(_BUILD_ERROR, None)
    if error is not None:
        pytest.fail(f"could not build the Kubernetes {version} test bed: {error}", pytrace=False)
    try:
        paths = install_control_plane(version, progress=sys.stderr)
    except KubeBuildError as exc:
        pytest.fail(f"could not build the Kubernetes {version} test bed: {exc}", pytrace=False)
    keep = os.environ.get("OFFTAKE_KEEP_KUBE_WORKDIR", "") not in ("", "0")
    cp = ControlPlane(paths, keep_workdir=keep)
    try:
        cp.start()
    except ControlPlaneError as exc:
        pytest.fail(f"could not start the Kubernetes {version} control plane: {exc}", pytrace=False)
    workdir = cp.workdir
    try:
        yield cp
    finally:
        cp.stop()
        if keep:
            print(f"\nkept the control plane's work folder: {workdir}", file=sys.stderr)


class Helm(Protocol):
    """The type of the ``helm`` fixture (``ControlPlane.helm``)."""

    def __call__(
        self, *args: str, check: bool = ..., timeout: float = ...
    ) -> subprocess.CompletedProcess[str]: ...


@pytest.fixture
def kubectl(control_plane: ControlPlane) -> Kubectl:
    return control_plane.kubectl


@pytest.fixture
def helm(request: pytest.FixtureRequest, control_plane: ControlPlane) -> Helm:
    error = request.config.stash.get(_HELM_BUILD_ERROR, None)
    if error is not None:
        pytest.fail(f"could not build helm: {error}", pytrace=False)
    try:
        install_helm()
    except KubeBuildError as exc:
        pytest.fail(f"could not build helm: {exc}", pytrace=False)
    return control_plane.helm


@pytest.fixture
def kube_namespace(control_plane: ControlPlane) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    control_plane.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        control_plane.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="session")
def kube_node(control_plane: ControlPlane) -> Iterator[Node]:
    images = os.environ.get("OFFTAKE_NODE_IMAGES", "localhost/offtake-worker:0.1.0").split()
    try:
        paths = install_node(progress=sys.stderr)
        node = Node(control_plane, images, paths=paths).start()
    except (NodeError, KubeBuildError) as exc:
        pytest.fail(f"could not start the test bed's node: {exc}", pytrace=False)
    try:
        yield node
    finally:
        node.stop()
