"""A real Kubernetes node for the test bed: kubelet + containerd + runc + CNI bridge, and the
kube-scheduler that puts pods on it. Opt-in: only tests that ask for the ``kube_node`` fixture
start it, on top of the :class:`~offtake_testbed.kube.ControlPlane`.

Everything is built from the Go module proxy, like the control plane, and cached next to it::

    python -m offtake_testbed.node install      # ~3-5 minutes on two cores, once

- kubelet and kube-scheduler from ``k8s.io/kubernetes`` (the control plane's version);
- containerd, its runc shim and ``ctr`` from ``github.com/containerd/containerd/v2`` (pure Go);
- runc from ``github.com/opencontainers/runc`` (cgo, with seccomp: needs gcc and
  libseccomp-dev, because the kubelet asks for the RuntimeDefault seccomp profile). Debian's
  crun 1.8 refuses the OCI spec version containerd 2.2 writes ("unknown version specified");
- the CNI plugins bridge, host-local, loopback and portmap;
- prometheus-adapter (:mod:`offtake_testbed.prometheus_adapter`), for the autoscaling tier.

runc's build dependencies (gcc, pkg-config, libseccomp-dev) are installed with apt-get when
missing (as root, or with passwordless sudo); otherwise the install says which command does it.

What it took on the project's machine (a Firecracker VM, root without CAP_SYS_RESOURCE, cgroup
v1): ``failCgroupV1: false`` for the kubelet, and containerd's ``restrict_oom_score_adj`` (runc
may not lower a pod's oom_score_adj below its own without CAP_SYS_RESOURCE). Images come from
the buildah storage scripts/build-image.sh fills, pushed as OCI archives and imported into
containerd's ``k8s.io`` namespace; the pod sandbox ("pause") image is the project's Debian base
with ``sleep infinity`` as entry point, as nothing may be pulled from a registry.

Pods get addresses in 10.88.0.0/16 on the bridge ``offtake0`` whose gateway is
:data:`GATEWAY_IP` (also an address of this host): a service a pod must reach (Kafka,
Prometheus) listens there. Every container also mounts the node's shared folder
(:attr:`Node.shared_dir`, at :data:`SHARED_MOUNT`; containerd's base runtime spec): the shared
storage pods of one job need (Spark's executors, driver and the worker on one table), where a
cluster would have a network filesystem or an object store. Only one node can run per machine
(the cgroup tree and the bridge are machine-wide), so a node holds a lock for its lifetime.

The modules: :mod:`.install` (the binaries and images), :mod:`.service` (the node), :mod:`.cli`.
"""

from .install import CONTAINERD_VERSION, NodeError, NodePaths, image_archive, install_node
from .service import GATEWAY_IP, NODE_NAME, POD_SUBNET, SHARED_MOUNT, Node

__all__ = [
    "CONTAINERD_VERSION",
    "GATEWAY_IP",
    "NODE_NAME",
    "POD_SUBNET",
    "SHARED_MOUNT",
    "Node",
    "NodeError",
    "NodePaths",
    "image_archive",
    "install_node",
]
