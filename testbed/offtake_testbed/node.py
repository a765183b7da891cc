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
Prometheus) listens there. Only one node can run per machine (the cgroup tree and the bridge are
machine-wide), so a node holds a lock for its lifetime.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from . import kube
from ._cache import cache_dir, cache_lock
from ._service import Service
from .gobuild import KubeBuildError, go_build, init_module, run_go, write_tools
from .kube.install import kube_version_ldflags
from .process import die_with_parent, file_tail, free_port, terminate
from .prometheus_adapter import install_prometheus_adapter

__all__ = [
    "CONTAINERD_VERSION",
    "GATEWAY_IP",
    "Node",
    "NodeError",
    "NodePaths",
    "image_archive",
    "install_node",
]

CONTAINERD_VERSION = "v2.2.9"
RUNC_VERSION = "v1.3.3"
CNI_VERSION = "v1.9.1"
#: The bridge's address: pods reach the host (and what listens there) through it.
GATEWAY_IP = "10.88.0.1"
POD_SUBNET = "10.88.0.0/16"
BRIDGE = "offtake0"
NODE_NAME = "offtake-node"
#: The pod sandbox image, made from the project's base image (see module docstring).
PAUSE_IMAGE = "localhost/offtake-pause:0.1.0"
BASE_IMAGE = "localhost/offtake-base:bookworm"

_RECIPE = 1
_MARKER = ".installed.json"
_CNI_PLUGINS = ("main/bridge", "ipam/host-local", "main/loopback", "meta/portmap")


class NodeError(RuntimeError):
    """The node failed to build, start or become Ready; the message includes log tails."""


@dataclass(frozen=True)
class NodePaths:
    bin_dir: Path

    def __getitem__(self, name: str) -> Path:
        return self.bin_dir / name


# --------------------------------------------------------------------------------------------
# Building


def _go(args: Sequence[str], *, cwd: Path, log: Path, what: str, **env: str) -> str:
    return run_go(args, cwd=cwd, log=log, what=what, extra_env=env)


def _missing_runc_build_deps() -> list[str]:
    """Debian packages runc's cgo build with seccomp needs that this machine lacks:
    libseccomp-golang finds the library through ``pkg-config libseccomp``."""
    missing = []
    if shutil.which("gcc") is None:
        missing.append("gcc")
    if shutil.which("pkg-config") is None:
        missing.append("pkg-config")
    if not Path("/usr/include/seccomp.h").exists():
        missing.append("libseccomp-dev")
    return missing


def _ensure_runc_build_deps(log: Path) -> None:
    """Install what runc's build needs with apt-get (as root, or sudo without a password), as
    set-up does for Prometheus and PostgreSQL; else say which command installs it."""
    missing = _missing_runc_build_deps()
    if not missing:
        return
    command = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing]
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    prefix = "sudo " if sudo else ""
    hint = (
        f"runc is built with cgo and seccomp and needs {', '.join(missing)}: "
        f"run `{prefix}{' '.join(command)}`"
    )
    if shutil.which("apt-get") is None or (sudo and shutil.which("sudo") is None):
        raise NodeError(hint)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in ([*sudo, "apt-get", "update", "-qq"], [*sudo, *command]):
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        with log.open("a") as out:
            out.write(f"\n$ {' '.join(cmd)}\n{proc.stdout}{proc.stderr}")
        if proc.returncode != 0:
            raise NodeError(f"{hint} (`{' '.join(cmd)}` failed: {proc.stderr.strip()[-500:]})")
    if _missing_runc_build_deps():
        raise NodeError(f"{hint} (apt-get ran, still missing: {_missing_runc_build_deps()})")


def _build_runc(bin_dir: Path, log: Path) -> None:
    """runc in a throwaway module: its go.mod replaces selinux with a folder the module zip
    does not ship, so the published selinux release stands in (as for kubernetes' staging)."""
    _ensure_runc_build_deps(log)
    src = cache_dir("kube", "node", "src", f"runc-{RUNC_VERSION}")
    init_module(src, "offtake.local/runcbuild", log)
    module = "github.com/opencontainers/runc"
    _go(["mod", "edit", f"-require={module}@{RUNC_VERSION}"], cwd=src, log=log, what="runc mod")
    write_tools(src, [module])
    _go(["mod", "tidy"], cwd=src, log=log, what="go mod tidy (runc)")
    _go(
        ["build", "-tags", "seccomp", "-o", str(bin_dir / "runc"), module],
        cwd=src,
        log=log,
        what="building runc",
        CGO_ENABLED="1",
    )


def _installed(bin_dir: Path) -> bool:
    try:
        marker = json.loads((bin_dir / _MARKER).read_text())
    except (FileNotFoundError, ValueError):
        return False
    return bool(marker.get("recipe") == _RECIPE and marker.get("kubernetes") == kube.KUBE_VERSION)


def install_node(*, progress: IO[str] | None = None) -> NodePaths:
    """Build (once) kubelet, kube-scheduler, containerd, runc, the CNI plugins and
    prometheus-adapter (:mod:`offtake_testbed.prometheus_adapter`)."""
    bin_dir = cache_dir("kube", kube.KUBE_VERSION, "node", "bin")
    paths = NodePaths(bin_dir)

    def say(message: str) -> None:
        if progress is not None:
            print(f"[offtake node] {message}", file=progress, flush=True)

    if _installed(bin_dir):
        say(f"found kubelet, containerd, runc and CNI plugins in the cache: {bin_dir}")
    else:
        _build_node(bin_dir, progress, say)
    # The autoscaling tier's HPA reads external metrics through it.
    install_prometheus_adapter(progress=progress)
    return paths


def _build_node(bin_dir: Path, progress: IO[str] | None, say: Callable[[str], None]) -> None:
    control = kube.install_control_plane(progress=progress)
    with cache_lock(f"node-{kube.KUBE_VERSION}"):
        if _installed(bin_dir):
            return
        log = cache_dir("kube", kube.KUBE_VERSION, "logs") / "node-build.log"
        log.write_text("building the test bed's node\n")
        started = time.monotonic()
        timings: dict[str, float] = {}
        say(f"building kubelet, kube-scheduler, containerd, runc, CNI plugins (log: {log})")
        # kubelet and scheduler in a copy of the control plane's module (same pins).
        src = cache_dir("kube", kube.KUBE_VERSION, "node", "src", "kubernetes")
        control_src = cache_dir("kube", kube.KUBE_VERSION, "src", "kubernetes")
        for name in ("go.mod", "go.sum"):
            shutil.copy(control_src / name, src / name)
        packages = {"kubelet": "k8s.io/kubernetes/cmd/kubelet"}
        packages["kube-scheduler"] = "k8s.io/kubernetes/cmd/kube-scheduler"
        write_tools(src, list(packages.values()))
        _go(["mod", "tidy"], cwd=src, log=log, what="go mod tidy (kubelet)")
        ldflags = kube_version_ldflags(kube.KUBE_VERSION, "1970-01-01T00:00:00Z")
        for name, package in packages.items():
            timings[name] = go_build(src, package, bin_dir / name, log, ldflags)
            say(f"built {name} in {timings[name]} s")
        gobin = {"GOBIN": str(bin_dir), "GOFLAGS": "-trimpath -buildvcs=false"}
        ctr = "github.com/containerd/containerd/v2/cmd"
        t0 = time.monotonic()
        _go(
            [
                "install",
                "-tags=no_btrfs no_devmapper no_zfs",
                f"{ctr}/containerd@{CONTAINERD_VERSION}",
                f"{ctr}/containerd-shim-runc-v2@{CONTAINERD_VERSION}",
                f"{ctr}/ctr@{CONTAINERD_VERSION}",
            ],
            cwd=bin_dir,
            log=log,
            what="go install containerd",
            **gobin,
        )
        cni = "github.com/containernetworking/plugins/plugins"
        _go(
            ["install", *(f"{cni}/{p}@{CNI_VERSION}" for p in _CNI_PLUGINS)],
            cwd=bin_dir,
            log=log,
            what="go install CNI plugins",
            **gobin,
        )
        timings["containerd+cni"] = round(time.monotonic() - t0, 1)
        t0 = time.monotonic()
        _build_runc(bin_dir, log)
        timings["runc"] = round(time.monotonic() - t0, 1)
        timings["total"] = round(time.monotonic() - started, 1)
        marker = {
            "recipe": _RECIPE,
            "kubernetes": kube.KUBE_VERSION,
            "containerd": CONTAINERD_VERSION,
            "runc": RUNC_VERSION,
            "cni": CNI_VERSION,
            "control_plane": str(control.bin_dir),
            "build_seconds": timings,
        }
        (bin_dir / _MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        say(f"done in {timings['total']} s: {bin_dir}")


def _buildah() -> list[str]:
    cache = cache_dir("containers")
    return [
        "buildah",
        "--root",
        str(cache / "storage"),
        "--runroot",
        str(cache / "run"),
        "--storage-driver",
        "vfs",
    ]


def _buildah_run(*args: str) -> str:
    proc = subprocess.run([*_buildah(), *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise NodeError(f"buildah {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout.strip()


def image_archive(image: str) -> Path:
    """An OCI archive of an image in scripts/build-image.sh's buildah storage (cached by image
    ID). The pause image is made from the base image on first use."""
    if image == PAUSE_IMAGE and not _buildah_has(PAUSE_IMAGE):
        if not _buildah_has(BASE_IMAGE):
            raise NodeError(f"{BASE_IMAGE} is missing: run scripts/build-image.sh --target worker")
        box = _buildah_run("from", BASE_IMAGE)
        _buildah_run("config", "--entrypoint", '["/bin/sleep", "infinity"]', "--cmd", "", box)
        _buildah_run("commit", "-q", box, PAUSE_IMAGE)
        _buildah_run("rm", box)
    if not _buildah_has(image):
        raise NodeError(f"{image} is not built: run scripts/build-image.sh (see README)")
    image_id = _buildah_run("inspect", "--format", "{{.FromImageID}}", image)
    out = cache_dir("kube", "node", "images") / f"{image_id}.tar"
    if not out.exists():
        tmp = out.with_suffix(".tmp")
        _buildah_run("push", "--quiet", image, f"oci-archive:{tmp}:{image}")
        os.replace(tmp, out)
    return out


def _buildah_has(image: str) -> bool:
    proc = subprocess.run(
        [*_buildah(), "inspect", "--type", "image", image], capture_output=True, check=False
    )
    return proc.returncode == 0


# --------------------------------------------------------------------------------------------
# Running


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
        self._lock_file: IO[str] | None = None

    @property
    def workdir(self) -> Path:
        assert self._work is not None, "start() the node first"
        return self._work

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
        lock = cache_dir("locks") / "kube-node.lock"
        self._lock_file = lock.open("w")
        fcntl.flock(self._lock_file, fcntl.LOCK_EX)  # one node per machine
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
        containerd: its socket is on their command line), containerd, and the mounts."""
        for name in ("scheduler", "kubelet"):
            self._terminate(name)
        if self._work is not None:
            for pid in self._shims():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
            self._terminate("containerd")
            self._unmount_all()
            shutil.rmtree(self._work, ignore_errors=True)
            self._work = None
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None

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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m offtake_testbed.node")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser(
        "install",
        help="build kubelet, kube-scheduler, containerd, runc, CNI plugins, prometheus-adapter",
    )
    args = parser.parse_args(argv)
    if args.command == "install":
        try:
            print(install_node(progress=sys.stderr).bin_dir)
        except (NodeError, KubeBuildError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
