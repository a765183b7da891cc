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
        cp.kubectl("get", "namespaces")
        print(cp.kubeconfig)            # a self-contained kubeconfig file (admin token)
"""

from __future__ import annotations

import argparse
import atexit
import base64
import contextlib
import ctypes
import fcntl
import json
import os
import re
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml

from ._cache import cache_dir
from ._service import Service

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
    "install_control_plane",
    "install_helm",
    "trim_go_caches",
]

#: Kubernetes release built by default (staging modules are published as v0.34.4).
KUBE_VERSION = "v1.34.4"
#: etcd release; ``None`` passed to :func:`install_control_plane` means "the one kubernetes pins".
ETCD_VERSION = "v3.6.4"
#: helm release (3.19 is the line whose client libraries match Kubernetes 1.34).
HELM_VERSION = "v3.19.5"

# Bump when the build recipe changes so that cached installs are rebuilt.
_RECIPE = 1
_MARKER = ".installed.json"
_COMPONENTS = ("kube-apiserver", "kube-controller-manager", "kubectl")
_LOG_TAIL_LINES = 40


class KubeBuildError(RuntimeError):
    """Building or installing a binary failed; the message ends with the tail of the log."""


class ControlPlaneError(RuntimeError):
    """The control plane failed to start or to become ready; the message includes log tails."""


class KubectlError(RuntimeError):
    """``kubectl`` (or, as :class:`HelmError`, ``helm``) exited non-zero."""

    tool = "kubectl"

    def __init__(self, args: Sequence[str], result: subprocess.CompletedProcess[str]) -> None:
        self.result = result
        super().__init__(
            f"{self.tool} {' '.join(args)} exited {result.returncode}\n"
            f"stderr: {result.stderr.strip()}\nstdout: {result.stdout.strip()}"
        )


class HelmError(KubectlError):
    """``helm`` exited non-zero."""

    tool = "helm"


@dataclass(frozen=True)
class Paths:
    """Where the installed control-plane binaries are."""

    version: str
    etcd_version: str
    bin_dir: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kubectl: Path
    etcd: Path


# --------------------------------------------------------------------------------------------
# Building


def _tail(text: str, lines: int = _LOG_TAIL_LINES) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _file_tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        return _tail(path.read_text(errors="replace"), lines)
    except FileNotFoundError:
        return "(no log)"


def _go_binary() -> str:
    go = shutil.which("go") or next(
        (p for p in ("/usr/local/go/bin/go", "/usr/lib/go/bin/go") if os.access(p, os.X_OK)), None
    )
    if go is None:
        raise KubeBuildError(
            "the Go toolchain (go >= 1.24) is needed to build the Kubernetes test bed from "
            "source, but `go` is not on PATH"
        )
    return go


def _go_env() -> dict[str, str]:
    """The environment for every go command: caches inside the Offtake cache, static builds."""
    env = dict(os.environ)
    env.update(
        GOMODCACHE=str(cache_dir("go", "mod")),
        GOCACHE=str(cache_dir("go", "build")),
        GOPATH=str(cache_dir("go", "path")),
        GOTOOLCHAIN="local",
        GOFLAGS="-trimpath -buildvcs=false -mod=mod",
        CGO_ENABLED="0",
        GOWORK="off",
    )
    env.pop("GOBIN", None)
    return env


def _run_go(
    args: Sequence[str],
    *,
    cwd: Path,
    log: Path,
    what: str,
    extra_env: Mapping[str, str] | None = None,
) -> str:
    """Run one go command, appending its output to ``log``; raise with the log's tail on failure."""
    env = _go_env()
    if extra_env:
        env.update(extra_env)
    cmd = [_go_binary(), *args]
    with log.open("a") as out:
        out.write(f"\n$ (cd {cwd} && {' '.join(cmd)})\n")
        out.flush()
        proc = subprocess.run(
            cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=out, text=True, check=False
        )
        out.write(proc.stdout)
    if proc.returncode != 0:
        raise KubeBuildError(
            f"{what} failed (go {' '.join(args)} exited {proc.returncode}); full log: {log}\n"
            f"--- last lines ---\n{_file_tail(log)}"
        )
    return proc.stdout


@contextlib.contextmanager
def _lock(name: str) -> Iterator[None]:
    """An exclusive inter-process lock, so parallel test runs do not build the same thing twice."""
    path = cache_dir("locks") / f"{name}.lock"
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _read_marker(bin_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((bin_dir / _MARKER).read_text())
    except (FileNotFoundError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("recipe") == _RECIPE else None


def _paths(version: str, etcd_version: str, bin_dir: Path) -> Paths:
    return Paths(
        version=version,
        etcd_version=etcd_version,
        bin_dir=bin_dir,
        kube_apiserver=bin_dir / "kube-apiserver",
        kube_controller_manager=bin_dir / "kube-controller-manager",
        kubectl=bin_dir / "kubectl",
        etcd=bin_dir / "etcd",
    )


def _installed(bin_dir: Path, version: str, etcd_version: str | None) -> Paths | None:
    marker = _read_marker(bin_dir)
    if marker is None or marker.get("kubernetes") != version:
        return None
    if etcd_version is not None and marker.get("etcd") != etcd_version:
        return None
    paths = _paths(version, str(marker["etcd"]), bin_dir)
    binaries = (paths.kube_apiserver, paths.kube_controller_manager, paths.kubectl, paths.etcd)
    if all(os.access(b, os.X_OK) for b in binaries):
        return paths
    return None


def _staging_modules(kubernetes_go_mod: str) -> list[str]:
    """The ``k8s.io/*`` modules that kubernetes' go.mod replaces with ``./staging`` paths."""
    return sorted(
        set(re.findall(r"^\s*(k8s\.io/[\w.\-/]+)\s+=>\s+\./staging/", kubernetes_go_mod, re.M))
    )


def _required_version(go_mod: str, module: str) -> str | None:
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", go_mod, re.M)
    return match.group(1) if match else None


def _init_module(src: Path, name: str, log: Path) -> None:
    for stale in ("go.mod", "go.sum", "tools.go"):
        (src / stale).unlink(missing_ok=True)
    _run_go(["mod", "init", name], cwd=src, log=log, what="go mod init")


def _write_tools(src: Path, packages: Sequence[str]) -> None:
    imports = "\n".join(f'\t_ "{p}"' for p in packages)
    (src / "tools.go").write_text(
        f"//go:build tools\n\n// Pins the packages built from this module.\npackage tools\n\n"
        f"import (\n{imports}\n)\n"
    )


def _kube_version_ldflags(version: str, build_date: str) -> list[str]:
    """The ``-X`` flags hack/lib/version.sh sets, so the binaries report ``version``.

    Without them ``kubectl version`` and ``/version`` say ``v0.0.0-master``, which trips
    helm's and charts' ``kubeVersion`` checks.
    """
    major, minor = version.removeprefix("v").split(".")[:2]
    values = {
        "gitVersion": version,
        "gitMajor": major,
        "gitMinor": minor,
        "buildDate": build_date,
    }
    return [
        f"-X '{package}.{key}={value}'"
        for key, value in values.items()
        for package in ("k8s.io/client-go/pkg/version", "k8s.io/component-base/version")
    ]


def _go_build(src: Path, package: str, dest: Path, log: Path, ldflags: Sequence[str] = ()) -> float:
    """Build one main package to ``dest`` atomically; return the seconds it took."""
    tmp = dest.with_name(f".{dest.name}.tmp")
    started = time.monotonic()
    _run_go(
        ["build", f"-ldflags={' '.join(['-s', '-w', *ldflags])}", "-o", str(tmp), package],
        cwd=src,
        log=log,
        what=f"building {dest.name} ({package})",
    )
    os.replace(tmp, dest)
    return round(time.monotonic() - started, 1)


def install_control_plane(
    version: str = KUBE_VERSION,
    *,
    etcd_version: str | None = ETCD_VERSION,
    progress: IO[str] | None = None,
) -> Paths:
    """Build (once) and return kube-apiserver, kube-controller-manager, kubectl and etcd.

    Idempotent: a marker file in the bin folder makes cached calls return in milliseconds. The
    first call downloads modules and compiles for 10-25 minutes on two cores. ``etcd_version``
    ``None`` means the etcd version kubernetes' own go.mod pins. Progress lines go to
    ``progress`` (e.g. ``sys.stderr``) if given. Raises :class:`KubeBuildError` on failure.
    """
    if not re.fullmatch(r"v1\.\d+\.\d+", version):
        raise ValueError(f"expected a Kubernetes release like v1.34.4, got {version!r}")
    bin_dir = cache_dir("kube", version, "bin")

    def say(message: str) -> None:
        if progress is not None:
            print(f"[offtake kube] {message}", file=progress, flush=True)

    found = _installed(bin_dir, version, etcd_version)
    if found is not None:
        say(f"found Kubernetes {version} (kube-apiserver, etcd, ...) in the cache: {bin_dir}")
        return found

    with _lock(f"kube-{version}"):
        found = _installed(bin_dir, version, etcd_version)
        if found is not None:
            return found
        started = time.monotonic()
        logs = cache_dir("kube", version, "logs")
        log = logs / "build.log"
        log.write_text(f"building Kubernetes {version} test bed\n")
        timings: dict[str, float] = {}
        say(f"building Kubernetes {version} from the Go module proxy (log: {log})")

        # 1. kubernetes itself, in a throwaway module replacing the staging modules.
        src = cache_dir("kube", version, "src", "kubernetes")
        info = json.loads(
            _run_go(
                ["mod", "download", "-json", f"k8s.io/kubernetes@{version}"],
                cwd=src,
                log=log,
                what=f"downloading k8s.io/kubernetes@{version}",
            )
        )
        kube_go_mod = Path(info["GoMod"]).read_text()
        staging = _staging_modules(kube_go_mod)
        if not staging:
            raise KubeBuildError(f"found no staging replace directives in {info['GoMod']}")
        staging_version = "v0." + version.removeprefix("v1.")
        _init_module(src, "offtake.local/kubebuild", log)
        edits = [f"-require=k8s.io/kubernetes@{version}"]
        edits += [f"-replace={m}={m}@{staging_version}" for m in staging]
        _run_go(["mod", "edit", *edits], cwd=src, log=log, what="go mod edit")
        packages = [f"k8s.io/kubernetes/cmd/{c}" for c in _COMPONENTS]
        _write_tools(src, packages)
        say(f"resolving modules ({len(staging)} staging modules replaced by {staging_version})")
        _run_go(["mod", "tidy"], cwd=src, log=log, what="go mod tidy (kubernetes)")
        timings["download"] = round(time.monotonic() - started, 1)
        # The release time (from the proxy's .info) as build date keeps builds reproducible.
        build_date = str(json.loads(Path(info["Info"]).read_text())["Time"])
        ldflags = _kube_version_ldflags(version, build_date)
        for component, package in zip(_COMPONENTS, packages, strict=True):
            say(f"building {component} ...")
            timings[component] = _go_build(src, package, bin_dir / component, log, ldflags)
            say(f"built {component} in {timings[component]} s")

        # 2. etcd: server/v3 has local replace directives, so again a throwaway module.
        if etcd_version is None:
            etcd_version = _required_version(kube_go_mod, "go.etcd.io/etcd/server/v3")
            if etcd_version is None:
                raise KubeBuildError("kubernetes' go.mod does not pin go.etcd.io/etcd/server/v3")
        etcd_src = cache_dir("kube", version, "src", f"etcd-{etcd_version}")
        _init_module(etcd_src, "offtake.local/etcdbuild", log)
        _run_go(
            ["mod", "edit", f"-require=go.etcd.io/etcd/server/v3@{etcd_version}"],
            cwd=etcd_src,
            log=log,
            what="go mod edit (etcd)",
        )
        _write_tools(etcd_src, ["go.etcd.io/etcd/server/v3"])
        _run_go(["mod", "tidy"], cwd=etcd_src, log=log, what="go mod tidy (etcd)")
        say(f"building etcd {etcd_version} ...")
        timings["etcd"] = _go_build(etcd_src, "go.etcd.io/etcd/server/v3", bin_dir / "etcd", log)
        say(f"built etcd in {timings['etcd']} s")

        timings["total"] = round(time.monotonic() - started, 1)
        marker = {
            "recipe": _RECIPE,
            "kubernetes": version,
            "etcd": etcd_version,
            "go": _run_go(["env", "GOVERSION"], cwd=src, log=log, what="go env").strip(),
            "build_seconds": timings,
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        (bin_dir / _MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        say(f"done in {timings['total']} s: {bin_dir}")
        return _paths(version, etcd_version, bin_dir)


# Bump when helm's build recipe changes, so that a cached helm built the old way is rebuilt.
# 2: the version ldflags of helm's Makefile (a released helm's); before them helm took every
# cluster for v1.20 and refused charts with a higher ``kubeVersion`` floor without
# ``--kube-version``, and checkov's helm scan, run with that helm, silently checked nothing.
_HELM_RECIPE = 2


def _helm_ldflags(version: str, helm_go_mod: str) -> list[str]:
    """The ``-X`` flags helm's Makefile sets for a release build of ``version``.

    ``internal/version.version`` is what ``helm version`` prints; the ``k8sVersionMajor/Minor``
    pair of ``pkg/chartutil`` (and of ``pkg/lint/rules``) is the Kubernetes version helm assumes
    without a cluster (``helm template``): the Makefile derives it from the client-go helm is
    built with (v0.34.x -> 1.34). Left unset, both default to 1.20.
    """
    client_go = _required_version(helm_go_mod, "k8s.io/client-go")
    if client_go is None:
        raise KubeBuildError(f"helm {version}'s go.mod does not require k8s.io/client-go")
    major = str(int(client_go.removeprefix("v").split(".")[0]) + 1)
    minor = client_go.split(".")[1]
    flags = [
        f"-X helm.sh/helm/v3/internal/version.version={version}",
        "-X helm.sh/helm/v3/internal/version.gitTreeState=clean",
    ]
    for package in ("helm.sh/helm/v3/pkg/lint/rules", "helm.sh/helm/v3/pkg/chartutil"):
        flags += [f"-X {package}.k8sVersionMajor={major}", f"-X {package}.k8sVersionMinor={minor}"]
    return flags


def install_helm(version: str = HELM_VERSION, *, progress: IO[str] | None = None) -> Path:
    """Build (once) helm with ``go install`` into the cache and return the binary's path.

    Built with the ldflags of helm's Makefile (:func:`_helm_ldflags`), so it reports its
    version and the Kubernetes version of its client libraries as a released helm does.
    """
    bin_dir = cache_dir("helm", version, "bin")
    helm = bin_dir / "helm"
    marker = bin_dir / _MARKER

    def done() -> bool:
        try:
            found = json.loads(marker.read_text())
        except (FileNotFoundError, ValueError):
            return False
        return (
            found.get("helm") == version
            and found.get("recipe") == _HELM_RECIPE
            and os.access(helm, os.X_OK)
        )

    if done():
        if progress is not None:
            print(f"[offtake kube] found helm {version} in the cache: {helm}", file=progress)
        return helm
    with _lock(f"helm-{version}"):
        if done():
            return helm
        log = cache_dir("helm", version) / "build.log"
        log.write_text(f"building helm {version}\n")
        if progress is not None:
            print(f"[offtake kube] building helm {version} (log: {log})", file=progress, flush=True)
        started = time.monotonic()
        info = json.loads(
            _run_go(
                ["mod", "download", "-json", f"helm.sh/helm/v3@{version}"],
                cwd=bin_dir,
                log=log,
                what=f"downloading helm.sh/helm/v3@{version}",
                extra_env={"GOFLAGS": "-trimpath -buildvcs=false"},
            )
        )
        ldflags = " ".join(["-s", "-w", *_helm_ldflags(version, Path(info["GoMod"]).read_text())])
        _run_go(
            ["install", f"-ldflags={ldflags}", f"helm.sh/helm/v3/cmd/helm@{version}"],
            cwd=bin_dir,
            log=log,
            what=f"go install helm {version}",
            extra_env={"GOBIN": str(bin_dir), "GOFLAGS": "-trimpath -buildvcs=false"},
        )
        seconds = round(time.monotonic() - started, 1)
        marker.write_text(
            json.dumps({"helm": version, "recipe": _HELM_RECIPE, "build_seconds": seconds}) + "\n"
        )
        if progress is not None:
            print(f"[offtake kube] built helm in {seconds} s", file=progress, flush=True)
        return helm


def trim_go_caches() -> None:
    """Delete the Go build and module caches the builds filled; the installed binaries stay."""
    log = cache_dir("go") / "trim.log"
    log.write_text("")
    _run_go(["clean", "-cache", "-modcache"], cwd=cache_dir("go"), log=log, what="go clean")


# --------------------------------------------------------------------------------------------
# Running


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ControlPlaneError(f"openssl {' '.join(args)} failed:\n{_tail(proc.stderr)}")


def _make_pki_openssl(pki: Path) -> None:
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl(
        "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "3650",
        "-subj", "/CN=offtake-testbed-ca", cwd=pki,
    )  # fmt: skip
    _openssl(
        "req", *ec, "-keyout", "apiserver.key", "-out", "apiserver.csr",
        "-subj", "/CN=kube-apiserver", cwd=pki,
    )  # fmt: skip
    (pki / "apiserver.ext").write_text(
        "basicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature\n"
        "extendedKeyUsage=serverAuth\n"
        "subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,"
        "DNS:kubernetes.default,DNS:kubernetes.default.svc,"
        "DNS:kubernetes.default.svc.cluster.local\n"
    )
    _openssl(
        "x509", "-req", "-in", "apiserver.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "apiserver.crt", "-days", "365",
        "-extfile", "apiserver.ext", cwd=pki,
    )  # fmt: skip
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)


def _make_pki_cryptography(pki: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    from offtake_testbed._pki import CertificateAuthority

    ca = CertificateAuthority(days=3650)
    apiserver = ca.server(
        "kube-apiserver",
        hosts=(
            "127.0.0.1",
            "10.0.0.1",
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ),
    )
    sa_key = rsa.generate_private_key(65537, 2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    (pki / "ca.key").write_text(ca.key_pem)
    (pki / "ca.crt").write_text(ca.cert_pem)
    (pki / "apiserver.key").write_text(apiserver.key_pem)
    (pki / "apiserver.crt").write_text(apiserver.cert_pem)
    (pki / "sa.key").write_bytes(sa_key)


def _make_pki(pki: Path) -> None:
    """A CA, a serving certificate for 127.0.0.1 and a service-account signing key."""
    pki.mkdir(parents=True, exist_ok=True)
    if shutil.which("openssl"):
        _make_pki_openssl(pki)
        return
    try:
        _make_pki_cryptography(pki)
    except ImportError as exc:
        raise ControlPlaneError(
            "generating the test bed's certificates needs either the `openssl` command "
            "(apt-get install openssl) or the `cryptography` Python package"
        ) from exc


def _set_parent_death_signal() -> None:
    """In the child: get SIGTERM when the parent dies, so a killed test run leaves no servers."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class _Process:
    name: str
    args: list[str]
    log: Path
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)


class ControlPlane(Service):
    """etcd + kube-apiserver + kube-controller-manager on loopback, with an admin kubeconfig.

    Use as a context manager, or call :meth:`start` and :meth:`stop`. Each instance gets its own
    temporary folder (data, certificates, logs, kubeconfig), removed by :meth:`stop` unless
    ``keep_workdir`` is true. The admin user authenticates with a static bearer token and is in
    ``system:masters``; authorization is RBAC.
    """

    def __init__(
        self,
        paths: Paths | None = None,
        *,
        workdir: Path | None = None,
        keep_workdir: bool = False,
        start_timeout: float = 120.0,
        wait_for_controllers: bool = True,
        extra_apiserver_args: Sequence[str] = (),
        extra_controller_manager_args: Sequence[str] = (),
    ) -> None:
        self._paths = paths
        self._given_workdir = workdir
        self._keep_workdir = keep_workdir
        self._start_timeout = start_timeout
        self._wait_for_controllers = wait_for_controllers
        self._extra_apiserver_args = list(extra_apiserver_args)
        self._extra_kcm_args = list(extra_controller_manager_args)
        self._processes: list[_Process] = []
        self._workdir: Path | None = None
        self._kubeconfig: Path | None = None
        self.token = secrets.token_hex(16)
        self.apiserver_port = 0
        self.etcd_port = 0
        self.controller_manager_port = 0
        self.start_seconds: float | None = None

    # -- properties ---------------------------------------------------------------------------

    @property
    def paths(self) -> Paths:
        if self._paths is None:
            self._paths = install_control_plane()
        return self._paths

    @property
    def workdir(self) -> Path:
        if self._workdir is None:
            raise ControlPlaneError("the control plane is not started")
        return self._workdir

    @property
    def kubeconfig(self) -> Path:
        """Path of a self-contained kubeconfig (CA data and admin token embedded)."""
        if self._kubeconfig is None:
            raise ControlPlaneError("the control plane is not started")
        return self._kubeconfig

    @property
    def server(self) -> str:
        """The apiserver's URL, ``https://127.0.0.1:<port>``."""
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def ca_file(self) -> Path:
        return self.workdir / "pki" / "ca.crt"

    @property
    def running(self) -> bool:
        return bool(self._processes) and all(
            p.popen is not None and p.popen.poll() is None for p in self._processes
        )

    def env(self) -> dict[str, str]:
        """``os.environ`` plus ``KUBECONFIG`` and the kubectl folder first on ``PATH``."""
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["PATH"] = f"{self.paths.bin_dir}{os.pathsep}{env.get('PATH', '')}"
        return env

    def log_file(self, component: str) -> Path:
        """The log of ``etcd``, ``kube-apiserver`` or ``kube-controller-manager``."""
        return self.workdir / "logs" / f"{component}.log"

    def log_tail(self, component: str, lines: int = _LOG_TAIL_LINES) -> str:
        return _file_tail(self.log_file(component), lines)

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> ControlPlane:
        """Start etcd, kube-apiserver and kube-controller-manager and wait until all are ready."""
        if self._processes:
            raise ControlPlaneError("the control plane is already started")
        paths = self.paths
        started = time.monotonic()
        deadline = started + self._start_timeout
        if self._given_workdir is not None:
            self._given_workdir.mkdir(parents=True, exist_ok=True)
            self._workdir = self._given_workdir
        else:
            self._workdir = Path(tempfile.mkdtemp(prefix="offtake-kube-"))
        work = self._workdir
        atexit.register(self.stop)
        try:
            (work / "logs").mkdir(exist_ok=True)
            pki = work / "pki"
            _make_pki(pki)
            (pki / "tokens.csv").write_text(
                f'{self.token},offtake-admin,offtake-admin,"system:masters"\n'
            )
            self._kubeconfig = work / "kubeconfig"

            self.etcd_port = _free_port()
            peer_port = _free_port()
            etcd_url = f"http://127.0.0.1:{self.etcd_port}"
            peer_url = f"http://127.0.0.1:{peer_port}"
            self._spawn(
                "etcd",
                [
                    str(paths.etcd),
                    "--name=offtake",
                    f"--data-dir={work / 'etcd'}",
                    f"--listen-client-urls={etcd_url}",
                    f"--advertise-client-urls={etcd_url}",
                    f"--listen-peer-urls={peer_url}",
                    f"--initial-advertise-peer-urls={peer_url}",
                    f"--initial-cluster=offtake={peer_url}",
                    "--unsafe-no-fsync",
                    "--log-level=warn",
                ],
            )
            self._wait("etcd", deadline, lambda: self._http_ok(f"{etcd_url}/health"))

            self.apiserver_port = _free_port()
            self._write_kubeconfig()
            self._spawn(
                "kube-apiserver",
                [
                    str(paths.kube_apiserver),
                    f"--etcd-servers={etcd_url}",
                    "--bind-address=127.0.0.1",
                    "--advertise-address=127.0.0.1",
                    f"--secure-port={self.apiserver_port}",
                    f"--cert-dir={work / 'apiserver-certs'}",
                    f"--tls-cert-file={pki / 'apiserver.crt'}",
                    f"--tls-private-key-file={pki / 'apiserver.key'}",
                    f"--client-ca-file={pki / 'ca.crt'}",
                    f"--token-auth-file={pki / 'tokens.csv'}",
                    f"--service-account-key-file={pki / 'sa.key'}",
                    f"--service-account-signing-key-file={pki / 'sa.key'}",
                    "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                    "--service-cluster-ip-range=10.0.0.0/24",
                    "--authorization-mode=RBAC",
                    "--allow-privileged=true",
                    "--profiling=false",
                    # The test bed's node (offtake_testbed.node) has no DNS name: reach its
                    # kubelet (logs, exec) at its InternalIP.
                    "--kubelet-preferred-address-types=InternalIP,Hostname",
                    # An aggregated API (a metrics adapter) is reached at its endpoint's address:
                    # no kube-proxy routes service IPs here.
                    "--enable-aggregator-routing=true",
                    # Endpoints may not point at loopback, so the reconciler would only log
                    # errors; nothing here runs pods that would use the kubernetes service.
                    "--endpoint-reconciler-type=none",
                    *self._extra_apiserver_args,
                ],
            )
            self._wait("kube-apiserver", deadline, lambda: self._api_ok("/readyz"))

            self.controller_manager_port = _free_port()
            self._spawn(
                "kube-controller-manager",
                [
                    str(paths.kube_controller_manager),
                    f"--kubeconfig={self.kubeconfig}",
                    f"--authentication-kubeconfig={self.kubeconfig}",
                    f"--authorization-kubeconfig={self.kubeconfig}",
                    "--bind-address=127.0.0.1",
                    f"--secure-port={self.controller_manager_port}",
                    f"--cert-dir={work / 'controller-manager-certs'}",
                    "--leader-elect=false",
                    f"--service-account-private-key-file={pki / 'sa.key'}",
                    f"--root-ca-file={pki / 'ca.crt'}",
                    "--profiling=false",
                    # Its default is under /usr/libexec, which it would create.
                    f"--flex-volume-plugin-dir={work / 'flexvolume'}",
                    *self._extra_kcm_args,
                ],
            )
            kcm_url = f"https://127.0.0.1:{self.controller_manager_port}/healthz"
            self._wait(
                "kube-controller-manager", deadline, lambda: self._http_ok(kcm_url, verify=False)
            )
            if self._wait_for_controllers:
                # The service-account controller creating "default" proves the controllers run
                # (and pods created before it exists would be rejected by admission).
                self._wait(
                    "kube-controller-manager",
                    deadline,
                    lambda: self._api_ok("/api/v1/namespaces/default/serviceaccounts/default"),
                    what="to create the default service account",
                )
        except BaseException:
            # Keep the folder: the error message points at the logs in it.
            self.stop(keep_workdir=True)
            raise
        self.start_seconds = round(time.monotonic() - started, 2)
        return self

    def stop(self, *, keep_workdir: bool | None = None) -> None:
        """Stop all three servers (controller-manager first) and remove the work folder.

        ``keep_workdir`` overrides the constructor's choice of keeping the folder.
        """
        if keep_workdir is None:
            keep_workdir = self._keep_workdir
        atexit.unregister(self.stop)
        for proc in reversed(self._processes):
            if proc.popen is None or proc.popen.poll() is not None:
                continue
            proc.popen.terminate()
            try:
                proc.popen.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                proc.popen.wait(timeout=15)
        self._processes.clear()
        if self._workdir is not None and not keep_workdir:
            shutil.rmtree(self._workdir, ignore_errors=True)
        self._workdir = None
        self._kubeconfig = None

    # -- clients ------------------------------------------------------------------------------

    def kubectl(
        self,
        *args: str,
        check: bool = True,
        input: str | None = None,
        timeout: float = 120.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this control plane; raise :class:`KubectlError` if ``check``."""
        cmd = [str(self.paths.kubectl), f"--kubeconfig={self.kubeconfig}", *args]
        result = subprocess.run(
            cmd, input=input, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and result.returncode != 0:
            raise KubectlError(args, result)
        return result

    def apply(self, manifest: str | Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> str:
        """``kubectl apply -f -`` for YAML text, one object or a list of objects."""
        if isinstance(manifest, str):
            text = manifest
        elif isinstance(manifest, Mapping):
            text = yaml.safe_dump(dict(manifest))
        else:
            text = yaml.safe_dump_all([dict(m) for m in manifest])
        return self.kubectl("apply", "-f", "-", input=text).stdout

    def get_json(self, *args: str) -> Any:
        """``kubectl get <args> -o json``, parsed."""
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def helm(
        self, *args: str, check: bool = True, timeout: float = 300.0
    ) -> subprocess.CompletedProcess[str]:
        """Run helm (built on first use) against this control plane; raise :class:`HelmError`."""
        cmd = [str(install_helm()), f"--kubeconfig={self.kubeconfig}", *args]
        result = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, check=False, env=self.env()
        )
        if check and result.returncode != 0:
            raise HelmError(args, result)
        return result

    # -- internals ----------------------------------------------------------------------------

    def _write_kubeconfig(self) -> None:
        ca = base64.b64encode(self.ca_file.read_bytes()).decode()
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "offtake-testbed",
                    "cluster": {"server": self.server, "certificate-authority-data": ca},
                }
            ],
            "users": [{"name": "offtake-admin", "user": {"token": self.token}}],
            "contexts": [
                {
                    "name": "offtake-testbed",
                    "context": {"cluster": "offtake-testbed", "user": "offtake-admin"},
                }
            ],
            "current-context": "offtake-testbed",
            "preferences": {},
        }
        self.kubeconfig.write_text(yaml.safe_dump(config, sort_keys=False))
        self.kubeconfig.chmod(0o600)

    def _spawn(self, name: str, args: list[str]) -> None:
        proc = _Process(name=name, args=args, log=self.log_file(name))
        in_main_thread = threading.current_thread() is threading.main_thread()
        with proc.log.open("ab") as log:
            proc.popen = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                start_new_session=True,
                # PDEATHSIG fires when the *thread* that forked exits: only safe from main.
                preexec_fn=_set_parent_death_signal if in_main_thread else None,
            )
        self._processes.append(proc)

    def _ssl_context(self, verify: bool = True) -> ssl.SSLContext:
        if verify:
            return ssl.create_default_context(cafile=str(self.ca_file))
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context

    def _http_ok(self, url: str, *, verify: bool = True, token: bool = False) -> bool:
        request = urllib.request.Request(url)
        if token:
            request.add_header("Authorization", f"Bearer {self.token}")
        context = self._ssl_context(verify) if url.startswith("https") else None
        try:
            with urllib.request.urlopen(request, timeout=5, context=context) as response:
                return 200 <= int(response.status) < 300
        except (urllib.error.URLError, OSError, ssl.SSLError):
            return False

    def _api_ok(self, path: str) -> bool:
        return self._http_ok(f"{self.server}{path}", token=True)

    def _wait(
        self,
        name: str,
        deadline: float,
        ready: Callable[[], bool],
        *,
        what: str = "to become ready",
    ) -> None:
        proc = next(p for p in self._processes if p.name == name)
        assert proc.popen is not None
        delay = 0.05
        while True:
            code = proc.popen.poll()
            if code is not None:
                raise ControlPlaneError(
                    f"{name} exited with code {code} during start-up; log {proc.log}:\n"
                    f"{_file_tail(proc.log)}"
                )
            if ready():
                return
            if time.monotonic() > deadline:
                raise ControlPlaneError(
                    f"timed out after {self._start_timeout:.0f} s waiting for {name} {what}; "
                    f"log {proc.log}:\n{_file_tail(proc.log)}"
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)


# --------------------------------------------------------------------------------------------
# Command line


def _dir_size(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += (Path(root) / name).lstat().st_size
    return total


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m offtake_testbed.kube",
        description="Build, cache and run the Offtake Kubernetes test bed.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    install = sub.add_parser("install", help="build kube-apiserver, controller-manager, etc.")
    install.add_argument("--version", default=KUBE_VERSION, help="Kubernetes release")
    install.add_argument("--etcd-version", default=ETCD_VERSION)
    install.add_argument("--helm-version", default=HELM_VERSION)
    install.add_argument("--no-helm", action="store_true", help="do not build helm")
    install.add_argument("--sizes", action="store_true", help="also report the cache's size")
    run = sub.add_parser("run", help="start a control plane and wait for Ctrl-C")
    run.add_argument("--version", default=KUBE_VERSION, help="Kubernetes release")
    run.add_argument("--kubeconfig", type=Path, help="also copy the kubeconfig here")
    sub.add_parser(
        "trim",
        help="delete the Go build and module caches (~5 GB); installed binaries stay, "
        "but building another version starts cold",
    )
    args = parser.parse_args(argv)

    try:
        if args.command == "install":
            started = time.monotonic()
            paths = install_control_plane(
                args.version, etcd_version=args.etcd_version, progress=sys.stderr
            )
            report: dict[str, Any] = {k: str(v) for k, v in asdict(paths).items()}
            if not args.no_helm:
                report["helm"] = str(install_helm(args.helm_version, progress=sys.stderr))
            report["seconds"] = round(time.monotonic() - started, 2)
            if args.sizes:
                report["cache_bytes"] = {
                    "kube": _dir_size(cache_dir("kube")),
                    "helm": _dir_size(cache_dir("helm")),
                    "go": _dir_size(cache_dir("go")),
                }
            print(json.dumps(report, indent=2))
            return 0
        if args.command == "trim":
            trim_go_caches()
            return 0
        paths = install_control_plane(args.version, progress=sys.stderr)
        with ControlPlane(paths) as cp:
            if args.kubeconfig is not None:
                shutil.copyfile(cp.kubeconfig, args.kubeconfig)
            print(f"control plane ready in {cp.start_seconds} s at {cp.server}", file=sys.stderr)
            print(f"export KUBECONFIG={args.kubeconfig or cp.kubeconfig}", flush=True)
            stop = threading.Event()
            signal.signal(signal.SIGTERM, lambda *_: stop.set())
            with contextlib.suppress(KeyboardInterrupt):
                stop.wait()
        return 0
    except (KubeBuildError, ControlPlaneError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
