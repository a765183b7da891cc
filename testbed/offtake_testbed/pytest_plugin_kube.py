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
build (10-25 minutes on two cores) does not count against any test's timeout. Unless
``$OFFTAKE_KUBE_BUILDING`` is set (by scripts/test.sh, to the log of the build that
``scripts/setup.sh --tests`` left in the background): then collection does not wait for the
build; the files that need the control plane are handed out last, and their first fixture
waits for the build outside the tests' timeouts, so the rest of the suite runs meanwhile.

Environment: ``OFFTAKE_KUBE_VERSION`` picks another Kubernetes release;
``OFFTAKE_KEEP_KUBE_WORKDIR=1`` keeps the control plane's folder (logs, etcd data) after the
session and prints where it is.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import pytest

from .kube import (
    KUBE_VERSION,
    ControlPlane,
    ControlPlaneError,
    KubeBuildError,
    control_plane_installed,
    install_control_plane,
    install_helm,
    wait_for_build,
)
from .node import Node, NodeError, install_node
from .process import file_tail

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
_CONTROL_PLANE_FIXTURES = frozenset({"control_plane", "kubectl", "kube_namespace", "kube_node"})
# Set by scripts/test.sh to the log of the control plane's background build (setup.sh --tests).
_BUILDING_ENV = "OFFTAKE_KUBE_BUILDING"


def _kube_version() -> str:
    return os.environ.get("OFFTAKE_KUBE_VERSION", KUBE_VERSION)


def _needs_control_plane(item: pytest.Item) -> bool:
    """A test that starts a control plane: through the fixtures, or itself (marker e2e)."""
    fixtures = set(getattr(item, "fixturenames", ()))
    return bool(fixtures & _CONTROL_PLANE_FIXTURES) or item.get_closest_marker("e2e") is not None


def _after_the_build(items: list[pytest.Item]) -> None:
    """The control plane is building in the background: hand out the files that need it last
    (a stable sort: the order of the rest, Spark's files first, stays), and let their tests'
    timeouts cover the test alone, not the fixture that waits for the build (pytest-timeout's
    ``func_only``, the test's own timeout kept)."""
    files = {item.path for item in items if _needs_control_plane(item)}
    items.sort(key=lambda item: item.path in files)
    for item in items:
        if item.path not in files:
            continue
        own = item.get_closest_marker("timeout")
        args, kwargs = (own.args, dict(own.kwargs)) if own is not None else ((), {})
        kwargs["func_only"] = True
        item.add_marker(pytest.mark.timeout(*args, **kwargs), append=False)


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
    if os.environ.get(_BUILDING_ENV):
        _after_the_build(items)
    elif used & {"control_plane", "kubectl", "kube_namespace", "helm"}:
        try:
            install_control_plane(_kube_version(), progress=sys.stderr)
        except KubeBuildError as exc:
            config.stash[_BUILD_ERROR] = str(exc)
    if "helm" in used:
        try:
            install_helm(progress=sys.stderr)
        except KubeBuildError as exc:
            config.stash[_HELM_BUILD_ERROR] = str(exc)


def _wait_for_the_background_build(version: str) -> None:
    """Wait for the build scripts/setup.sh --tests started, if any; fail naming its log if it
    ended without the binaries (rather than building again here for as long)."""
    log = os.environ.get(_BUILDING_ENV)
    if not log or control_plane_installed(version):
        return
    print(f"\nwaiting for the control plane's background build (log: {log})", file=sys.stderr)
    began = time.monotonic()
    wait_for_build(version)
    if not control_plane_installed(version):
        pytest.fail(
            f"the background build of the Kubernetes {version} test bed failed; {log} ends:\n"
            f"{file_tail(Path(log), 40)}",
            pytrace=False,
        )
    print(f"the control plane was built {time.monotonic() - began:.0f} s later", file=sys.stderr)


@pytest.fixture(scope="session")
def control_plane(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    version = _kube_version()
    error = request.config.stash.get(_BUILD_ERROR, None)
    if error is not None:
        pytest.fail(f"could not build the Kubernetes {version} test bed: {error}", pytrace=False)
    _wait_for_the_background_build(version)
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
