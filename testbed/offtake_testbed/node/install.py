"""Building (once) the test bed node's binaries from the Go module proxy, and the images it
imports (see :mod:`offtake_testbed.node`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from .. import kube
from .._cache import cache_dir, cache_lock, installed, mark_installed
from ..gobuild import go_build, init_module, run_go, write_tools
from ..kube.install import kube_version_ldflags
from ..prometheus_adapter import install_prometheus_adapter

__all__ = [
    "BASE_IMAGE",
    "CNI_VERSION",
    "CONTAINERD_VERSION",
    "PAUSE_IMAGE",
    "RUNC_VERSION",
    "NodeError",
    "NodePaths",
    "image_archive",
    "install_node",
]

CONTAINERD_VERSION = "v2.2.9"
RUNC_VERSION = "v1.3.3"
CNI_VERSION = "v1.9.1"
#: The pod sandbox image, made from the project's base image (see module docstring).
PAUSE_IMAGE = "localhost/offtake-pause:0.1.0"
BASE_IMAGE = "localhost/offtake-base:bookworm"

_RECIPE = 1
_CNI_PLUGINS = ("main/bridge", "ipam/host-local", "main/loopback", "meta/portmap")


class NodeError(RuntimeError):
    """The node failed to build, start or become Ready; the message includes log tails."""


@dataclass(frozen=True)
class NodePaths:
    bin_dir: Path

    def __getitem__(self, name: str) -> Path:
        return self.bin_dir / name


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
    return installed(bin_dir, {"recipe": _RECIPE, "kubernetes": kube.KUBE_VERSION}) is not None


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
        mark_installed(bin_dir, marker)
        say(f"done in {timings['total']} s: {bin_dir}")


def buildah_command() -> list[str]:
    """buildah on scripts/build-image.sh's storage, from which the node imports images."""
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
    proc = subprocess.run([*buildah_command(), *args], capture_output=True, text=True, check=False)
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
        [*buildah_command(), "inspect", "--type", "image", image], capture_output=True, check=False
    )
    return proc.returncode == 0
