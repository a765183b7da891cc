"""The manifest scanners scripts/lint.sh runs on the chart and the operator's children.

- kube-score and kubeconform, built with ``go install`` from the Go module proxy into the cache
  (``cache_dir("scanners")``), with the Go caches the Kubernetes test bed uses;
- kubeconform's schemas, made from the OpenAPI document of the Kubernetes release the test bed
  builds (``api/openapi-spec/swagger.json`` of the ``k8s.io/kubernetes`` module): kubeconform
  downloads its schemas from GitHub by default, which no machine of this project reaches;
- checkov from PyPI, in a virtual environment of its own: checkov 3.3 pins ``packaging<24``
  and ``python-dateutil<3``, while the project's pytest needs ``packaging>=24`` and its
  kubernetes client ``python-dateutil>=3``, so it cannot share ``.venv``.

::

    python -m offtake_testbed.scanners install     # scripts/setup.sh --all runs it
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from ._cache import Progress, cache_dir, cache_lock, installed, mark_installed
from .gobuild import KubeBuildError, run_go
from .kube.install import KUBE_VERSION

__all__ = [
    "CHECKOV_VERSION",
    "KUBECONFORM_VERSION",
    "KUBE_SCORE_VERSION",
    "ScannerPaths",
    "install_checkov",
    "install_kube_score",
    "install_kubeconform",
    "install_scanners",
    "kubernetes_schemas",
]

#: github.com/zegl/kube-score: the newest release the Go module proxy serves.
KUBE_SCORE_VERSION = "v1.20.0"
#: github.com/yannh/kubeconform: v0.7.0 needs Go 1.24, the project's floor (v0.8.0 needs 1.26).
KUBECONFORM_VERSION = "v0.7.0"
#: checkov on PyPI.
CHECKOV_VERSION = "3.3.30"

# Bump when a recipe below changes, so that cached installs are redone.
_RECIPE = 2


@dataclass(frozen=True)
class ScannerPaths:
    kube_score: Path
    kubeconform: Path
    #: A folder of ``<kind>-<group>-<version>.json`` schemas (kubeconform's -schema-location).
    schemas: Path
    checkov: Path


def _installed(folder: Path, key: str, version: str, artefact: Path) -> bool:
    return installed(folder, {key: version, "recipe": _RECIPE}, artefact) is not None


def _cached(
    name: str,
    version: str,
    artefact: Callable[[Path], Path],
    build: Callable[[Path, Path], None],
    progress: IO[str] | None,
) -> Path:
    """The artefact of ``name`` ``version`` in the cache, built once (under a lock) if missing."""
    folder = cache_dir("scanners", name, version)
    path = artefact(folder)
    say = Progress("scanners", progress)
    if _installed(folder, name, version, path):
        say.cached(f"{name} {version}", path)
        return path
    with cache_lock(f"scanners-{name}-{version}"):
        if _installed(folder, name, version, path):
            return path
        log = folder / "build.log"
        log.write_text(f"installing {name} {version}\n")
        started = time.monotonic()
        with say.timed(f"installing {name} {version} (log: {log})"):
            build(folder, log)
        marker = {"recipe": _RECIPE, name: version, "seconds": round(time.monotonic() - started)}
        mark_installed(folder, marker)
    return path


def _go_install(package: str, version: str, folder: Path, log: Path) -> None:
    run_go(
        ["install", "-ldflags=-s -w", f"{package}@{version}"],
        cwd=folder,
        log=log,
        what=f"go install {package}@{version}",
        # go install pkg@version ignores any module around it: no -mod=mod.
        extra_env={"GOBIN": str(folder / "bin"), "GOFLAGS": "-trimpath -buildvcs=false"},
    )


def install_kube_score(
    version: str = KUBE_SCORE_VERSION, *, progress: IO[str] | None = None
) -> Path:
    return _cached(
        "kube-score",
        version,
        lambda folder: folder / "bin" / "kube-score",
        lambda folder, log: _go_install(
            "github.com/zegl/kube-score/cmd/kube-score", version, folder, log
        ),
        progress,
    )


def install_kubeconform(
    version: str = KUBECONFORM_VERSION, *, progress: IO[str] | None = None
) -> Path:
    return _cached(
        "kubeconform",
        version,
        lambda folder: folder / "bin" / "kubeconform",
        lambda folder, log: _go_install(
            "github.com/yannh/kubeconform/cmd/kubeconform", version, folder, log
        ),
        progress,
    )


def install_checkov(version: str = CHECKOV_VERSION, *, progress: IO[str] | None = None) -> Path:
    def build(folder: Path, log: Path) -> None:
        venv = folder / "venv"
        shutil.rmtree(venv, ignore_errors=True)
        _run([sys.executable, "-m", "venv", str(venv)], log, "python -m venv (checkov)")
        python = str(venv / "bin" / "python")
        # uv (in .venv when scripts/setup.sh made it) resolves checkov's ~80 packages in
        # seconds; pip is the fallback.
        uv = Path(sys.executable).with_name("uv")
        if uv.exists():
            cmd = [str(uv), "pip", "install", "--python", python, f"checkov=={version}"]
        else:
            cmd = [python, "-m", "pip", "install", "-q", f"checkov=={version}"]
        _run(cmd, log, f"installing checkov {version} from PyPI")

    return _cached(
        "checkov", version, lambda folder: folder / "venv" / "bin" / "checkov", build, progress
    )


def _run(cmd: list[str], log: Path, what: str) -> None:
    with log.open("a") as out:
        out.write(f"\n$ {' '.join(cmd)}\n")
        out.flush()
        code = subprocess.run(cmd, stdout=out, stderr=out, check=False).returncode
    if code != 0:
        raise KubeBuildError(f"{what} failed (exit {code}); log: {log}")


# --------------------------------------------------------------------------------------------
# kubeconform's schemas from the release's own OpenAPI document

_INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
_QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"


def _strict(schema: Any) -> Any:
    """A copy of an OpenAPI v2 schema as a strict JSON schema: unknown fields refused.

    The same changes kubernetes-json-schema's "-strict" schemas have: an object with listed
    properties allows no others; OpenAPI's ``x-kubernetes-*`` extensions are dropped from the
    schemas (not from ``properties``: the CRD's own schema type has fields of those names).
    """
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key.startswith("x-kubernetes-"):
            continue
        if key in ("properties", "definitions") and isinstance(value, dict):
            out[key] = {name: _strict(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not"):
            out[key] = _strict(value)
        elif key in ("allOf", "anyOf", "oneOf") and isinstance(value, list):
            out[key] = [_strict(sub) for sub in value]
        else:
            out[key] = value
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def _reachable(definitions: Mapping[str, Any], start: str) -> Iterator[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        name = todo.pop()
        if name in seen or name not in definitions:
            continue
        seen.add(name)
        yield name
        todo += [r.rsplit("/", 1)[-1] for r in _refs(definitions[name])]


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str):
            yield ref
        for value in node.values():
            yield from _refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item)


def write_schemas(swagger: Mapping[str, Any], folder: Path) -> int:
    """One strict schema per kind of ``swagger`` in ``folder``; return how many."""
    definitions = {k: _strict(v) for k, v in swagger["definitions"].items()}
    # Quantities and int-or-strings are written as numbers or strings in YAML (cpu: 1).
    definitions[_INT_OR_STRING] = {"type": ["string", "integer"]}
    definitions[_QUANTITY] = {"type": ["string", "number"]}
    count = 0
    for name, original in swagger["definitions"].items():
        for gvk in original.get("x-kubernetes-group-version-kind") or []:
            group = str(gvk["group"]).split(".")[0]
            suffix = f"-{group}" if group else ""
            schema = {
                "$schema": "http://json-schema.org/draft-04/schema#",
                "$ref": f"#/definitions/{name}",
                "definitions": {d: definitions[d] for d in _reachable(definitions, name)},
            }
            path = folder / f"{str(gvk['kind']).lower()}{suffix}-{gvk['version']}.json"
            path.write_text(json.dumps(schema))
            count += 1
    return count


def kubernetes_schemas(version: str = KUBE_VERSION, *, progress: IO[str] | None = None) -> Path:
    """kubeconform schemas of Kubernetes ``version``, made once from its swagger.json."""

    def build(folder: Path, log: Path) -> None:
        info = json.loads(
            run_go(
                ["mod", "download", "-json", f"k8s.io/kubernetes@{version}"],
                cwd=folder,
                log=log,
                what=f"downloading k8s.io/kubernetes@{version}",
                extra_env={"GOFLAGS": "-trimpath -buildvcs=false"},
            )
        )
        swagger = json.loads((Path(info["Dir"]) / "api/openapi-spec/swagger.json").read_text())
        out = folder / "schemas"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        count = write_schemas(swagger, out)
        with log.open("a") as handle:
            handle.write(f"wrote {count} schemas to {out}\n")

    return _cached(
        "kubernetes-schemas", version, lambda folder: folder / "schemas", build, progress
    )


def install_scanners(*, progress: IO[str] | None = None) -> ScannerPaths:
    return ScannerPaths(
        kube_score=install_kube_score(progress=progress),
        kubeconform=install_kubeconform(progress=progress),
        schemas=kubernetes_schemas(progress=progress),
        checkov=install_checkov(progress=progress),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m offtake_testbed.scanners",
        description="Install kube-score, kubeconform (+ schemas) and checkov into the cache.",
    )
    parser.add_argument("command", choices=["install"])
    parser.parse_args(argv)
    try:
        paths = install_scanners(progress=sys.stderr)
    except KubeBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({k: str(v) for k, v in asdict(paths).items()}, indent=2))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
