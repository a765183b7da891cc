"""The Kubeflow Spark operator's SparkConnect CRD, from its Go module on the Go module proxy.

The operator's ``submit.mode: kubernetes`` makes a SparkConnect per pipeline; the e2e tier
installs the real CRD into its real kube-apiserver so the API server validates what the
operator renders against the Spark operator's own schema. ``go mod download`` fetches the
module zip (config/crd/bases holds the CRDs); the CRD is kept in the Offtake cache.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from offtake_testbed._cache import cache_dir, cache_lock
from offtake_testbed.gobuild import run_go

MODULE = "github.com/kubeflow/spark-operator/v2"
VERSION = "v2.3.0"
CRD_FILE = "sparkoperator.k8s.io_sparkconnects.yaml"
CRD_NAME = "sparkconnects.sparkoperator.k8s.io"


def spark_connect_crd(version: str = VERSION) -> Path:
    """The SparkConnect CRD yaml of spark-operator ``version`` (downloaded once, cached)."""
    home = cache_dir("spark-operator", version)
    crd = home / CRD_FILE
    if crd.exists():
        return crd
    with cache_lock(f"spark-operator-{version}"):
        if crd.exists():
            return crd
        out = run_go(
            ["mod", "download", "-json", f"{MODULE}@{version}"],
            cwd=home,
            log=home / "download.log",
            what=f"downloading {MODULE}@{version} from the Go module proxy",
            extra_env={"GOFLAGS": "-modcacherw"},
        )
        module_dir = Path(json.loads(out)["Dir"])
        shutil.copyfile(module_dir / "config" / "crd" / "bases" / CRD_FILE, crd)
    return crd
