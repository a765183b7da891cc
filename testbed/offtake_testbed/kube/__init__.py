"""A real Kubernetes control plane for end-to-end tests: etcd, apiserver, controller-manager.

Everything is built from source through the Go module proxy (no release downloads, no Docker)
and cached under ``cache_dir("kube")``; the Go module and build caches live under
``cache_dir("go")`` so that a fresh machine reproduces the whole thing with one command::

    python -m offtake_testbed.kube install          # or scripts/install-kube.sh
    python -m offtake_testbed.kube run              # start one and print its kubeconfig

``k8s.io/kubernetes`` cannot be ``go install``-ed because its go.mod replaces the ``k8s.io/*``
staging modules with local paths. We therefore build inside a throwaway module that requires
``k8s.io/kubernetes vX.Y.Z`` and replaces every staging module with its published
``v0.Y.Z`` counterpart (the list is read from kubernetes' own go.mod). etcd's server module
has local replace directives too, so it gets the same treatment; helm is a plain
``go install``.

There is no kubelet here: by default nothing runs a container. The controller-manager still
turns Deployments into ReplicaSets and Pod objects, and its garbage collector follows owner
references, which is all most of the operator's end-to-end tests need. Tests that need pods to
run add a real node (kubelet, containerd, runc, kube-scheduler): :mod:`offtake_testbed.node`.

In Python::

    from offtake_testbed.kube import ControlPlane

    with ControlPlane() as cp:          # builds on first use, then < 1 s to find the binaries
        cp.kubectl("get", "namespace

The modules: :mod:`.install` (building and caching the binaries, with
:mod:`offtake_testbed.gobuild`), :mod:`.control_plane` (the service), :mod:`.cli`.
"""

from ..gobuild import KubeBuildError
from .control_plane import ControlPlane, ControlPlaneError, HelmError, KubectlError
from .install import (
    ETCD_VERSION,
    HELM_VERSION,
    KUBE_VERSION,
    Paths,
    control_plane_installed,
    install_control_plane,
    install_helm,
    trim_go_caches,
    wait_for_build,
)

__all__ = [
    "ETCD_VERSION",
    "HELM_VERSION",
    "KUBE_VERSION",
    "ControlPlane",
    "ControlPlaneError",
    "HelmError",
    "KubeBuildError",
    "KubectlError",
    "Paths",
    "control_plane_installed",
    "install_control_plane",
    "install_helm",
    "trim_go_caches",
    "wait_for_build",
]
