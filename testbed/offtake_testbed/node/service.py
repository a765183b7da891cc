"""A running test bed node: containerd, kubelet and kube-scheduler on the control plane, pods
on the bridge :data:`BRIDGE` (see :mod:`offtake_testbed.node`)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from .. import kube
from .._cache import cache_lock
from .._service import Service
from ..process import descendants, die_with_parent, file_tail, free_port, terminate
from .install import PAUSE_IMAGE, NodeError, NodePaths, image_archive, install_node

__all__ = ["BRIDGE", "GATEWAY_IP", "NODE_NAME", "POD_SUBNET", "Node", "ensure_bridge"]

#: The bridge's address: pods reach the host (and what listens there) through it.
GATEWAY_IP = "10.88.0.1"
POD_SUBNET = "10.88.0.0/16"
BRIDGE = "offtake0"
NODE_NAME = "offtake-node"
#: Where every container on the node sees the node's shared folder (:attr:`Node.shared_dir`).
SHARED_MOUNT = "/offtake-shared"


def _containerd_config(work: Path, paths: NodePaths) -> str:
    cri = 'plugins."io.containerd.cri.v1.runtime"'
    return f"""version = 3
root = "{work}/containerd/root"
state = "{work}/containerd/state"
[grpc]
  address = "{work}/containerd.sock"
[ttrpc]
  address = "{work}/containerd.sock.ttrpc"
[{cri}]
  # runc cannot lower oom_score_adj below containerd's own without CAP_SYS_RESOURCE.
  restrict_oom_score_adj = true
  [{cri}.containerd]
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      # Every container starts from this spec: containerd's default plus the shared folder.
      base_runtime_spec = "{work}/base-spec.json"
      [{cri}.containerd.runtimes.runc.options]
        BinaryName = "{paths["runc"]}"
        Root = "{work}/runc"
        SystemdCgroup = false
  [{cri}.cni]
    bin_dirs = ["{paths.bin_dir}"]
    conf_dir = "{work}/cni"
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{PAUSE_IMAGE}"
"""


def _cni_config() -> str:
    return json.dumps(
        {
            "cniVersion": "1.0.0",
            "name": "offtake",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    "ipMasq": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": POD_SUBNET, "gateway": GATEWAY_IP}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }
    )


def _kubelet_config(work: Path, port: int, healthz: int) -> str:
    return json.dumps(
        {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            # The project's VMs mount cgroup v1; 1.34 still runs there when told to.
            "failCgroupV1": False,
            "failSwapOn": False,
            "cgroupDriver": "cgroupfs",
            "port": port,
            "readOnlyPort": 0,
            "healthzPort": healthz,
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "containerRuntimeEndpoint": f"unix://{work}/containerd.sock",
            "podLogsDir": str(work / "pod-logs"),
            # A shared test machine's disk is often >85 % full: no evictions, no image GC.
            "evictionHard": {},
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "enforceNodeAllocatable": [],
            "localStorageCapacityIsolation": False,
            "makeIPTablesUtilChains": False,
            "resolvConf": "/etc/resolv.conf",
            "serializeImagePulls": False,
        }
    )


def ensure_bridge() -> None:
    """Create the pods' bridge with the gateway address now, so that a service can listen on
    :data:`GATEWAY_IP` before the first pod exists (the CNI plugin reuses it)."""
    ip = shutil.which("ip") or "/usr/sbin/ip"
    subprocess.run([ip, "link", "add", BRIDGE, "type", "bridge"], capture_output=True, check=False)
    subprocess.run(
        [ip, "addr", "add", f"{GATEWAY_IP}/16", "dev", BRIDGE], capture_output=True, check=False
    )
    subprocess.run([ip, "link", "set", BRIDGE, "up"], check=True, capture_output=True)


class Node(Service):
    """containerd + kubelet (registered as :data:`NODE_NAME`) + kube-scheduler.

    ``images``: names in the buildah storage to import (the pause image is always imported).
    """

    def __init__(
        self,
        control_plane: kube.ControlPlane,
        images: Sequence[str] = (),
        *,
        paths: NodePaths | None = None,
        ready_timeout: float = 120.0,
    ) -> None:
        self._cp = control_plane
        self._images = list(images)
        self._paths = paths
        self._ready_timeout = ready_timeout
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._work: Path | None = None
        # One node per machine (the cgroup tree and the bridge are machine-wide): held from
        # start() to stop().
        self._lock = contextlib.ExitStack()

    @property
    def workdir(self) -> Path:
        assert self._work is not None, "start() the node first"
        return self._work

    @property
    def shared_dir(self) -> Path:
        """A folder of this host that every container on the node mounts at
        :data:`SHARED_MOUNT` (read-write, any uid): the shared storage a cluster's pods would
        get from a network filesystem or an object store, for what several pods must read and
        write at one path (Spark's executors, its driver and the worker on one table). It is
        the node's (containerd's base runtime spec), not the pods': no pod spec names it."""
        return self.workdir / "shared"

    def ctr(self, *args: str) -> subprocess.CompletedProcess[str]:
        paths = self._paths or install_node()
        cmd = [str(paths["ctr"]), "-a", str(self.workdir / "containerd.sock"), "-n", "k8s.io"]
        return subprocess.run([*cmd, *args], capture_output=True, text=True, check=False)

    def pod_logs(self) -> Iterator[Path]:
        yield from sorted((self.workdir / "pod-logs").rglob("*.log"))

    def _spawn(self, name: str, args: Sequence[str]) -> None:
        log = (self.workdir / f"{name}.log").open("wb")
        env = dict(os.environ, PATH=f"{self._paths_or_install().bin_dir}:{os.environ['PATH']}")
        self._procs[name] = subprocess.Popen(
            list(args),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            preexec_fn=die_with_parent(),
        )

    def _paths_or_install(self) -> NodePaths:
        if self._paths is None:
            self._paths = install_node()
        return self._paths

    def _tails(self) -> str:
        return "\n".join(
            f"--- {name}.log ---\n{file_tail(self.workdir / f'{name}.log', 15)}"
            for name in ("containerd", "kubelet", "scheduler")
        )

    def start(self) -> Node:
        paths = self._paths_or_install()
        self._lock.enter_context(cache_lock("kube-node"))
        self._work = Path(tempfile.mkdtemp(prefix="offtake-node-"))
        try:
            self._start(paths)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, paths: NodePaths) -> None:
        work = self.workdir
        (work / "cni").mkdir()
        (work / "cni" / "10-offtake.conflist").write_text(_cni_config())
        (work / "containerd.toml").write_text(_containerd_config(work, paths))
        self._write_base_spec(paths)
        ensure_bridge()
        self._spawn(
            "containerd", [str(paths["containerd"]), "--config", str(work / "containerd.toml")]
        )
        self._wait(lambda: (work / "containerd.sock").exists(), "containerd's socket", 30)
        for image in [PAUSE_IMAGE, *self._images]:
            result = self.ctr("images", "import", str(image_archive(image)))
            if result.returncode != 0:
                raise NodeError(f"importing {image} failed: {result.stderr.strip()}")
        port, healthz, sched = (free_port() for _ in range(3))
        (work / "kubelet.json").write_text(_kubelet_config(work, port, healthz))
        kc = str(self._cp.kubeconfig)
        self._spawn(
            "kubelet",
            [
                str(paths["kubelet"]),
                f"--kubeconfig={kc}",
                f"--config={work / 'kubelet.json'}",
                f"--root-dir={work / 'kubelet'}",
                f"--cert-dir={work / 'kubelet' / 'pki'}",
                f"--hostname-override={NODE_NAME}",
                # The bridge address: the kubelet refuses a loopback node IP, and the apiserver
                # reaches the kubelet (logs, exec) at the node IP.
                f"--node-ip={GATEWAY_IP}",
            ],
        )
        self._spawn(
            "scheduler",
            [
                str(paths["kube-scheduler"]),
                f"--kubeconfig={kc}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
                f"--secure-port={sched}",
                "--leader-elect=false",
            ],
        )
        self._wait(self._ready, f"node {NODE_NAME} Ready", self._ready_timeout)

    def _write_base_spec(self, paths: NodePaths) -> None:
        """containerd's default OCI spec (``ctr oci spec``) plus a bind mount of
        :attr:`shared_dir`; the CRI plugin builds every container's spec on it."""
        shared = self.shared_dir
        shared.mkdir()
        shared.chmod(0o1777)  # pods run as many uids; sticky like /tmp
        result = subprocess.run(
            [str(paths["ctr"]), "oci", "spec"], capture_output=True, text=True, check=False
        )
        if result.returncode != 0:
            raise NodeError(f"ctr oci spec failed: {result.stderr.strip()}")
        spec = json.loads(result.stdout)
        spec.setdefault("mounts", []).append(
            {
                "destination": SHARED_MOUNT,
                "type": "bind",
                "source": str(shared),
                "options": ["rbind", "rw"],
            }
        )
        (self.workdir / "base-spec.json").write_text(json.dumps(spec, indent=1))

    def _ready(self) -> bool:
        result = self._cp.kubectl("get", "node", NODE_NAME, "-o", "json", check=False)
        if result.returncode != 0:
            return False
        conditions = json.loads(result.stdout)["status"].get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def _wait(self, done: object, what: str, timeout: float) -> None:
        assert callable(done)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, proc in self._procs.items():
                if proc.poll() is not None:
                    raise NodeError(f"{name} exited {proc.returncode}\n{self._tails()}")
            if done():
                return
            time.sleep(0.5)
        raise NodeError(f"timed out after {timeout:.0f} s waiting for {what}\n{self._tails()}")

    def stop(self) -> None:
        """Stop kubelet and scheduler, then every container (their shims belong to this
        containerd: its socket is on their command line), containerd, and the mounts.

        A container's processes are killed by walking down from its shim: runc gives each
        container its own session, so killing the shim's process group alone left a worker
        running with no parent after a node test."""
        for name in ("scheduler", "kubelet"):
            self._terminate(name)
        if self._work is not None:
            shims = self._shims()
            for pid in [*descendants(shims), *shims]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self._terminate("containerd")
            self._unmount_all()
            shutil.rmtree(self._work, ignore_errors=True)
            self._work = None
        self._lock.close()

    def _terminate(self, name: str) -> None:
        proc = self._procs.pop(name, None)
        if proc is not None:
            terminate(proc, 20)

    def _shims(self) -> list[int]:
        """Shim processes serving this node's containerd (each leads its process group, with
        the containers under it)."""
        address = str(self.workdir / "containerd.sock")
        found = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                argv = (proc / "cmdline").read_bytes().split(b"\0")
                if b"containerd-shim" in argv[0] and address.encode() in argv:
                    found.append(int(proc.name))
        return found

    def _unmount_all(self) -> None:
        prefix = str(self.workdir)
        mounts = []
        with contextlib.suppress(OSError):
            for line in Path("/proc/self/mountinfo").read_text().splitlines():
                point = line.split()[4]
                if point.startswith(prefix):
                    mounts.append(point)
        for point in sorted(mounts, key=len, reverse=True):
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)
