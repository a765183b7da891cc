"""Building (once) and caching the Kubernetes control plane's binaries and helm, from source
through the Go module proxy (see :mod:`offtake_testbed.kube`)."""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from .._cache import cache_dir, cache_lock, installed, mark_installed
from ..gobuild import KubeBuildError, go_build, init_module, required_version, run_go, write_tools

__all__ = [
    "ETCD_VERSION",
    "HELM_VERSION",
    "KUBE_VERSION",
    "Paths",
    "control_plane_installed",
    "install_control_plane",
    "install_helm",
    "kube_version_ldflags",
    "trim_go_caches",
    "wait_for_build",
]

#: Kubernetes release built by default (staging modules are published as v0.34.4).
KUBE_VERSION = "v1.34.4"
#: etcd release; ``None`` passed to :func:`install_control_plane` means "the one kubernetes pins".
ETCD_VERSION = "v3.6.4"
#: helm release (3.19 is the line whose client libraries match Kubernetes 1.34).
HELM_VERSION = "v3.19.5"

# Bump when the build recipe changes so that cached installs are rebuilt.
_RECIPE = 1
_COMPONENTS = ("kube-apiserver", "kube-controller-manager", "kubectl")


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
    expected: dict[str, object] = {"recipe": _RECIPE, "kubernetes": version}
    if etcd_version is not None:
        expected["etcd"] = etcd_version
    marker = installed(bin_dir, expected)
    if marker is None:
        return None
    paths = _paths(version, str(marker["etcd"]), bin_dir)
    binaries = (paths.kube_apiserver, paths.kube_controller_manager, paths.kubectl, paths.etcd)
    if all(os.access(b, os.X_OK) for b in binaries):
        return paths
    return None


def control_plane_installed(version: str = KUBE_VERSION, etcd_version: str = ETCD_VERSION) -> bool:
    """Whether :func:`install_control_plane` would return at once (built and cached)."""
    return _installed(cache_dir("kube", version, "bin"), version, etcd_version) is not None


def background_build_log() -> Path:
    """Where ``scripts/setup.sh --tests`` writes the output of the control plane's background
    build (and where scripts/test.sh points the tests' fixture at): one spelling of it."""
    return cache_dir("kube") / "background-build.log"


def wait_for_build(version: str = KUBE_VERSION) -> None:
    """Block while another process builds the control plane ``version`` (it holds the lock
    :func:`install_control_plane` builds under), e.g. ``scripts/setup.sh --tests``' background
    build; return at once when none does."""
    with cache_lock(f"kube-{version}"):
        pass


def _staging_modules(kubernetes_go_mod: str) -> list[str]:
    """The ``k8s.io/*`` modules that kubernetes' go.mod replaces with ``./staging`` paths."""
    return sorted(
        set(re.findall(r"^\s*(k8s\.io/[\w.\-/]+)\s+=>\s+\./staging/", kubernetes_go_mod, re.M))
    )


def kube_version_ldflags(version: str, build_date: str) -> list[str]:
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

    with cache_lock(f"kube-{version}"):
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
            run_go(
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
        init_module(src, "offtake.local/kubebuild", log)
        edits = [f"-require=k8s.io/kubernetes@{version}"]
        edits += [f"-replace={m}={m}@{staging_version}" for m in staging]
        run_go(["mod", "edit", *edits], cwd=src, log=log, what="go mod edit")
        packages = [f"k8s.io/kubernetes/cmd/{c}" for c in _COMPONENTS]
        write_tools(src, packages)
        say(f"resolving modules ({len(staging)} staging modules replaced by {staging_version})")
        run_go(["mod", "tidy"], cwd=src, log=log, what="go mod tidy (kubernetes)")
        timings["download"] = round(time.monotonic() - started, 1)
        # The release time (from the proxy's .info) as build date keeps builds reproducible.
        build_date = str(json.loads(Path(info["Info"]).read_text())["Time"])
        ldflags = kube_version_ldflags(version, build_date)
        for component, package in zip(_COMPONENTS, packages, strict=True):
            say(f"building {component} ...")
            timings[component] = go_build(src, package, bin_dir / component, log, ldflags)
            say(f"built {component} in {timings[component]} s")

        # 2. etcd: server/v3 has local replace directives, so again a throwaway module.
        if etcd_version is None:
            etcd_version = required_version(kube_go_mod, "go.etcd.io/etcd/server/v3")
            if etcd_version is None:
                raise KubeBuildError("kubernetes' go.mod does not pin go.etcd.io/etcd/server/v3")
        etcd_src = cache_dir("kube", version, "src", f"etcd-{etcd_version}")
        init_module(etcd_src, "offtake.local/etcdbuild", log)
        run_go(
            ["mod", "edit", f"-require=go.etcd.io/etcd/server/v3@{etcd_version}"],
            cwd=etcd_src,
            log=log,
            what="go mod edit (etcd)",
        )
        write_tools(etcd_src, ["go.etcd.io/etcd/server/v3"])
        run_go(["mod", "tidy"], cwd=etcd_src, log=log, what="go mod tidy (etcd)")
        say(f"building etcd {etcd_version} ...")
        timings["etcd"] = go_build(etcd_src, "go.etcd.io/etcd/server/v3", bin_dir / "etcd", log)
        say(f"built etcd in {timings['etcd']} s")

        timings["total"] = round(time.monotonic() - started, 1)
        marker = {
            "recipe": _RECIPE,
            "kubernetes": version,
            "etcd": etcd_version,
            "go": run_go(["env", "GOVERSION"], cwd=src, log=log, what="go env").strip(),
            "build_seconds": timings,
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        mark_installed(bin_dir, marker)
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
    client_go = required_version(helm_go_mod, "k8s.io/client-go")
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

    def done() -> bool:
        found = installed(bin_dir, {"helm": version, "recipe": _HELM_RECIPE})
        return found is not None and os.access(helm, os.X_OK)

    if done():
        if progress is not None:
            print(f"[offtake kube] found helm {version} in the cache: {helm}", file=progress)
        return helm
    with cache_lock(f"helm-{version}"):
        if done():
            return helm
        log = cache_dir("helm", version) / "build.log"
        log.write_text(f"building helm {version}\n")
        if progress is not None:
            print(f"[offtake kube] building helm {version} (log: {log})", file=progress, flush=True)
        started = time.monotonic()
        info = json.loads(
            run_go(
                ["mod", "download", "-json", f"helm.sh/helm/v3@{version}"],
                cwd=bin_dir,
                log=log,
                what=f"downloading helm.sh/helm/v3@{version}",
                extra_env={"GOFLAGS": "-trimpath -buildvcs=false"},
            )
        )
        ldflags = " ".join(["-s", "-w", *_helm_ldflags(version, Path(info["GoMod"]).read_text())])
        run_go(
            ["install", f"-ldflags={ldflags}", f"helm.sh/helm/v3/cmd/helm@{version}"],
            cwd=bin_dir,
            log=log,
            what=f"go install helm {version}",
            extra_env={"GOBIN": str(bin_dir), "GOFLAGS": "-trimpath -buildvcs=false"},
        )
        seconds = round(time.monotonic() - started, 1)
        mark_installed(bin_dir, {"helm": version, "recipe": _HELM_RECIPE, "build_seconds": seconds})
        if progress is not None:
            print(f"[offtake kube] built helm in {seconds} s", file=progress, flush=True)
        return helm


def trim_go_caches() -> None:
    """Delete the Go build and module caches the builds filled; the installed binaries stay."""
    log = cache_dir("go") / "trim.log"
    log.write_text("")
    run_go(["clean", "-cache", "-modcache"], cwd=cache_dir("go"), log=log, what="go clean")
