"""Building Go programs from the Go module proxy into the test bed's cache: the Kubernetes
control plane and node, helm, prometheus-adapter, the Spark operator's CRDs and the scanners.
The Go module and build caches live under ``cache_dir("go")``."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from ._cache import cache_dir
from .process import file_tail

__all__ = [
    "KubeBuildError",
    "go_build",
    "init_module",
    "required_version",
    "run_go",
    "write_tools",
]

_LOG_TAIL_LINES = 40


class KubeBuildError(RuntimeError):
    """Building or installing a binary failed; the message ends with the tail of the log."""


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


def run_go(
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
            f"--- last lines ---\n{file_tail(log, _LOG_TAIL_LINES)}"
        )
    return proc.stdout


def required_version(go_mod: str, module: str) -> str | None:
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", go_mod, re.M)
    return match.group(1) if match else None


def init_module(src: Path, name: str, log: Path) -> None:
    for stale in ("go.mod", "go.sum", "tools.go"):
        (src / stale).unlink(missing_ok=True)
    run_go(["mod", "init", name], cwd=src, log=log, what="go mod init")


def write_tools(src: Path, packages: Sequence[str]) -> None:
    imports = "\n".join(f'\t_ "{p}"' for p in packages)
    (src / "tools.go").write_text(
        f"//go:build tools\n\n// Pins the packages built from this module.\npackage tools\n\n"
        f"import (\n{imports}\n)\n"
    )


def go_build(src: Path, package: str, dest: Path, log: Path, ldflags: Sequence[str] = ()) -> float:
    """Build one main package to ``dest`` atomically; return the seconds it took."""
    tmp = dest.with_name(f".{dest.name}.tmp")
    started = time.monotonic()
    run_go(
        ["build", f"-ldflags={' '.join(['-s', '-w', *ldflags])}", "-o", str(tmp), package],
        cwd=src,
        log=log,
        what=f"building {dest.name} ({package})",
    )
    os.replace(tmp, dest)
    return round(time.monotonic() - started, 1)
