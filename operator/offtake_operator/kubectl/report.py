"""``kubectl offtake report``: a support bundle of one pipeline, as a zip file.

The pipeline, its status (with Kafka's view when reachable), the objects the operator made,
its pods, all its Events, each worker's log tail and /metrics sample. No record data and no
Secret value: the bundle names the Secrets the spec refers to, never reads them into it, and
as a last guard every value of those Secrets the user may read is replaced wherever it would
appear (a log line quoting a password, say), as are credentials in URLs (offtake.redact).
"""

from __future__ import annotations

import datetime
import io
import json
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from offtake.contract import redact

from . import status_view, worker_metrics
from .cluster import JSON, Cluster
from .errors import PluginError

LOG_TAIL = 500


def secret_refs(value: Any, path: str = "spec") -> Iterator[tuple[str, str]]:
    """(field path, Secret name) for every Secret the spec names (``...secretRef``,
    ``caSecretRef``, ``secretKeyRef`` and the like, wherever they are)."""
    if isinstance(value, Mapping):
        for key, sub in value.items():
            here = f"{path}.{key}"
            if "secret" in str(key).lower() and isinstance(sub, Mapping) and "name" in sub:
                yield here, str(sub["name"])
            yield from secret_refs(sub, here)
    elif isinstance(value, list):
        for i, sub in enumerate(value):
            yield from secret_refs(sub, f"{path}[{i}]")


def _trim(obj: JSON) -> JSON:
    meta = dict(obj.get("metadata") or {})
    meta.pop("managedFields", None)
    return {**obj, "metadata": meta}


class _Scrubber:
    """Replaces the values of the pipeline's Secrets wherever they occur in the bundle."""

    def __init__(self, cluster: Cluster, refs: list[tuple[str, str]]) -> None:
        self.values: list[tuple[str, str]] = []
        for _field, name in refs:
            try:
                data = cluster.secret_data(name, _field)
            except PluginError:
                continue  # not readable by this user: then not quotable by this bundle either
            for key, value in data.items():
                if len(value) >= 4:  # shorter values would blank ordinary words
                    self.values.append((value, f"<redacted: Secret {name} key {key}>"))
        # Longest first: a value containing another is replaced whole.
        self.values.sort(key=lambda v: -len(v[0]))

    def __call__(self, text: str) -> str:
        for value, mark in self.values:
            text = text.replace(value, mark)
        return redact(text)


def build(cluster: Cluster, name: str) -> tuple[bytes, list[str]]:
    """The zip's bytes and the names of its files."""
    manifest = cluster.pipeline(name)
    refs = sorted(set(secret_refs(manifest.get("spec") or {})))
    scrub = _Scrubber(cluster, refs)
    files: dict[str, str] = {}
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    files["README.txt"] = (
        f"kubectl offtake report: ConsumerPipeline {cluster.namespace}/{name} at {now}\n"
        f"API server: {cluster.server}\n"
        "pipeline.yaml: the pipeline (spec and status); status.json: kubectl offtake status -o "
        "json; children/: the objects the operator made; pods.yaml; events.yaml; logs/: each "
        f"worker's last {LOG_TAIL} log lines; metrics/: each worker's /metrics now; "
        "secrets.txt: the Secrets the spec names.\n"
        "No record data and no Secret value is included.\n"
    )
    files["pipeline.yaml"] = yaml.safe_dump(_trim(manifest), sort_keys=False)
    report, kafka_error = status_view.collect(cluster, name)
    files["status.json"] = json.dumps({**report, "kafkaError": kafka_error}, indent=2, default=str)
    for kind, listed in cluster.children(name).items():
        body = listed if isinstance(listed, str) else [_trim(o) for o in listed]
        files[f"children/{kind}.yaml"] = yaml.safe_dump(body, sort_keys=False)
    pods = cluster.pods(name)
    files["pods.yaml"] = yaml.safe_dump([_trim(p) for p in pods], sort_keys=False)
    files["events.yaml"] = yaml.safe_dump(cluster.events(name, 1000), sort_keys=False)
    files["secrets.txt"] = (
        "".join(f"{field}: Secret {secret} (values not included)\n" for field, secret in refs)
        or "the spec names no Secret\n"
    )
    for pod in pods:
        pod_name = pod["metadata"]["name"]
        try:
            files[f"logs/{pod_name}.log"] = cluster.worker_log(pod, LOG_TAIL, None)
        except PluginError as exc:
            files[f"logs/{pod_name}.unavailable.txt"] = f"{exc}\n"
        try:
            files[f"metrics/{pod_name}.txt"] = worker_metrics.pod_metrics(cluster, pod)
        except PluginError as exc:
            files[f"metrics/{pod_name}.unavailable.txt"] = f"{exc}\n"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as bundle:
        for path, text in files.items():
            bundle.writestr(f"{name}/{path}", scrub(text))
    return buffer.getvalue(), sorted(files)


def write(cluster: Cluster, name: str, path: str | None) -> tuple[Path, list[str]]:
    data, listed = build(cluster, name)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M%S")
    target = Path(path or f"offtake-report-{cluster.namespace}-{name}-{stamp}.zip")
    target.write_bytes(data)
    return target, listed
