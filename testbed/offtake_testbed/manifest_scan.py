"""Scan what Offtake puts in a cluster with kubeconform, kube-score and checkov.

What is scanned (written to one folder, a file per source, then scanned as files):

- the chart, ``helm template`` with its CRDs, at its defaults and with two operator replicas
  (the PodDisruptionBudget and the anti-affinity exist only then);
- every child the operator renders for each ``examples/*.yaml``, through the operator's own
  render functions: ConfigMap, Deployment, Service, PodDisruptionBudget, an HPA, the redrive Job;
  for ``mode: inject`` the example workload (``examples/inject/deployment.yaml``) with the
  worker injected as the admission webhook would.

The findings we accept on purpose are listed, each with its reason, in ``scripts/scan/``
(checkov's config file, kube-score's ignored tests): a new finding fails the scan.

::

    python -m offtake_testbed.manifest_scan [--out DIR]    # scripts/lint.sh runs it
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from offtake.config import parse_pipeline
from offtake.config.redrive import dlq_topic_of, parse_redrive
from offtake_operator import inject, render
from offtake_operator.operator_spec import parse_operator_spec
from offtake_operator.reconcile import worker_manifest
from offtake_operator.render.worker_network_policy import worker_network_policies
from offtake_operator.settings import OperatorConfig

from . import kube, scanners

__all__ = ["ScanResult", "render_chart", "render_children", "scan", "scan_folder"]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "offtake"
EXAMPLES = ROOT / "examples"
#: The deliberate exceptions, each with its reason (see the files).
CHECKOV_CONFIG = ROOT / "scripts" / "scan" / "checkov.yaml"
KUBE_SCORE_IGNORES = ROOT / "scripts" / "scan" / "kube-score-ignore.txt"
#: The example workload of examples/inject.yaml.
INJECT_WORKLOAD = EXAMPLES / "inject" / "deployment.yaml"

#: Kinds of other projects' CRDs the chart and the operator make when the cluster serves them
#: (Prometheus operator, KEDA, Kubeflow Spark, kopf): kubeconform has no schema for them, and
#: they carry no pods, which is what kube-score and checkov look at.
FOREIGN_KINDS = (
    "ServiceMonitor",
    "PodMonitor",
    "PrometheusRule",
    "ScaledObject",
    "TriggerAuthentication",
    "SparkConnect",
    "KopfPeering",
    "ClusterKopfPeering",
)

JSON = dict[str, Any]
#: The chart is installed in a namespace of its own (checkov refuses the default namespace).
NAMESPACE = ("--namespace", "offtake-system")


def _dump(docs: Iterable[Mapping[str, Any]]) -> str:
    return yaml.safe_dump_all(list(docs), sort_keys=False, default_flow_style=False)


def render_chart(out: Path, *, helm: Path | None = None) -> list[Path]:
    """``helm template`` of the chart (CRDs included) at its defaults and with two replicas.

    No ``--kube-version``: the test bed's helm carries a released helm's version flags
    (:func:`offtake_testbed.kube.install_helm`), so the chart's ``kubeVersion`` floor passes.
    """
    binary = helm or kube.install_helm()
    variants = {"chart.yaml": (), "chart-replicas-2.yaml": ("--set", "operator.replicas=2")}
    paths = []
    for name, extra in variants.items():
        result = subprocess.run(
            [str(binary), "template", "offtake", str(CHART), "--include-crds", *NAMESPACE, *extra],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"helm template {' '.join(extra)} failed:\n{result.stderr}")
        path = out / name
        path.write_text(result.stdout)
        paths.append(path)
    return paths


def _example_body(path: Path) -> JSON:
    body: JSON = yaml.safe_load(path.read_text())
    body["metadata"].setdefault("namespace", "shop")
    body["metadata"]["uid"] = "00000000-0000-0000-0000-000000000001"
    return body


def _children(body: JSON, config: OperatorConfig) -> list[JSON]:
    """What the operator's reconcile makes for ``body``, rendered by the same functions."""
    pipeline = parse_pipeline(worker_manifest(body))
    extras = parse_operator_spec(body["spec"])
    docs = [render.render_configmap(body), render.render_service(body, pipeline)]
    if pipeline.mode == "inject":
        workload: JSON = yaml.safe_load(INJECT_WORKLOAD.read_text())
        workload["metadata"]["namespace"] = body["metadata"]["namespace"]
        template = workload["spec"]["template"]
        pod, _ = inject.injected_pod(template, body, pipeline, config)
        workload["spec"]["template"] = pod
        return [*docs, workload]
    docs.append(
        render.render_deployment(body, pipeline, config, replicas=max(int(pipeline.replicas), 1))
    )
    docs.append(render.render_pdb(body))
    # Every example gets an HPA (none of them enables autoscaling): it is a child too.
    autoscaling = dataclasses.replace(extras.autoscaling, enabled=True)
    docs.append(render.render_hpa(body, autoscaling, partitions=None))
    if render.uses_spark_connect(pipeline):
        docs.append(render.render_spark_connect(body, pipeline))
        docs.append(render.render_spark_connect_token(body, "scan"))
        docs.extend(render.render_spark_network_policies(body))
    # The workers' NetworkPolicy (on wherever the chart's networkPolicy.enabled is).
    docs.extend(
        worker_network_policies(
            body, pipeline, dataclasses.replace(config, worker_network_policy=True)
        )
    )
    dlq = dlq_topic_of(body["spec"])
    until = "2026-05-01T12:00:00Z"
    request = parse_redrive({"id": "scan", "from": dlq or "dlq", "until": until}, dlq)
    assert request is not None
    docs.append(render.render_redrive_job(body, pipeline, config, request, "scan-redrive"))
    return docs


def render_children(out: Path, config: OperatorConfig | None = None) -> list[Path]:
    """The children of every examples/*.yaml, one file per example in ``out``."""
    config = config or OperatorConfig()
    paths = []
    for example in sorted(EXAMPLES.glob("*.yaml")):
        path = out / f"children-{example.stem}.yaml"
        path.write_text(_dump(_children(_example_body(example), copy.deepcopy(config))))
        paths.append(path)
    return paths


@dataclass(frozen=True)
class ScanResult:
    #: (scanner, exit code, its report) per scanner run.
    runs: tuple[tuple[str, int, str], ...]

    @property
    def failed(self) -> list[str]:
        return [name for name, code, _ in self.runs if code != 0]

    def report(self) -> str:
        return "\n".join(
            f"--- {name}: {'ok' if code == 0 else f'exit {code}'}\n{text.strip()}"
            for name, code, text in self.runs
        )


def _run(cmd: Sequence[str]) -> tuple[int, str]:
    result = subprocess.run(list(cmd), capture_output=True, text=True, check=False)
    return result.returncode, (result.stdout + result.stderr)


def kube_score_ignores(path: Path = KUBE_SCORE_IGNORES) -> list[str]:
    """kube-score arguments from ``path``: a line is a test id (``--ignore-test`` it) or a flag
    of ``kube-score score``; ``#`` starts a comment (the reason)."""
    args = []
    for line in path.read_text().splitlines():
        entry = line.split("#", 1)[0].strip()
        if entry.startswith("--"):
            args.append(entry)
        elif entry:
            args += ["--ignore-test", entry]
    return args


SCANNERS = ("kubeconform", "kube-score", "checkov")


def _commands(
    paths: Sequence[str], tools: scanners.ScannerPaths, checkov_config: Path
) -> dict[str, list[str]]:
    schema = f"{tools.schemas}/{{{{ .ResourceKind }}}}{{{{ .KindSuffix }}}}.json"
    return {
        # -strict: unknown fields and keys given twice are errors.
        "kubeconform": [
            str(tools.kubeconform),
            *("-strict", "-summary", "-output", "text", "-schema-location", schema),
            *("-skip", ",".join(FOREIGN_KINDS)),
            *paths,
        ],
        # Warnings fail too: kube-score's "warning" is a real finding here.
        "kube-score": [
            str(tools.kube_score),
            *("score", "--output-format", "ci", "--exit-one-on-warning"),
            *kube_score_ignores(),
            *paths,
        ],
        "checkov": [
            str(tools.checkov),
            *("--config-file", str(checkov_config), "--framework", "kubernetes"),
            *("--quiet", "--compact", "--skip-download"),
            *(arg for p in paths for arg in ("--file", p)),
        ],
    }


def scan_folder(
    files: Sequence[Path],
    tools: scanners.ScannerPaths,
    *,
    only: Sequence[str] = SCANNERS,
    checkov_config: Path = CHECKOV_CONFIG,
) -> ScanResult:
    """Run the scanners (all three unless ``only``) on ``files``, YAML manifests."""
    commands = _commands([str(f) for f in files], tools, checkov_config)
    runs = []
    for name in only:
        code, text = _run(commands[name])
        if name == "kube-score":
            # The ci format prints every check, [OK] ones too: the report keeps the others.
            text = "\n".join(line for line in text.splitlines() if not line.startswith("[OK]"))
        runs.append((name, code, text))
    return ScanResult(tuple(runs))


def scan(out: Path) -> ScanResult:
    tools = scanners.install_scanners(progress=sys.stderr)
    files = render_chart(out) + render_children(out)
    return scan_folder(files, tools)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m offtake_testbed.manifest_scan",
        description="Render the chart and the operator's children of examples/ and scan them.",
    )
    parser.add_argument("--out", type=Path, help="keep the rendered manifests in this folder")
    args = parser.parse_args(argv)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        result = scan(args.out)
    else:
        with tempfile.TemporaryDirectory(prefix="offtake-scan-") as tmp:
            result = scan(Path(tmp))
    print(result.report())
    if result.failed:
        print(f"manifest scan: findings from {', '.join(result.failed)}", file=sys.stderr)
        return 1
    print("manifest scan: kubeconform, kube-score and checkov found nothing")
    return 0


if __name__ == "__main__":
    sys.exit(main())
