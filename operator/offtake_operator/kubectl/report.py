"""``kubectl offtake report``: a support bundle of one pipeline, as a zip file.

The pipeline, its status (with Kafka's view when reachable), the objects the operator made,
its pods, all its Events, each worker's log tail and /metrics sample. No record data and no
Secret value: the bundle names the Secrets the spec refers to, never reads them into it, and
as a last guard every value of those Secrets the user may read is replaced wherever it would
appear (a log line quoting a password, say), before the bundle's objects are serialised
(:class:`Scrubber`), as are credentials in URLs (offtake.redact).
"""

from __future__ import annotations

import base64
import datetime
import io
import json
import re
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


#: Values shorter than this are replaced where they stand alone (a whole string, or a word
#: between non-alphanumerics); longer ones wherever they occur. A 3-character value replaced
#: inside every word would blank the bundle without hiding anything more.
WORD_ONLY_BELOW = 4
_ALNUM = "A-Za-z0-9"


def _forms(value: str) -> set[str]:
    """The ways a value can be spelled in text the bundle copies without parsing it: as it is,
    JSON-escaped (ASCII-only or not: an umlaut, a quote, a backslash each have their escape),
    escaped as a Prometheus label value, and base64."""
    forms = {value, json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1]}
    forms.add(value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n"))
    forms.add(base64.b64encode(value.encode()).decode())
    return {f for f in forms if f}


class Scrubber:
    """Replaces the values of the pipeline's Secrets in the bundle BEFORE anything is
    serialised: :meth:`tree` walks the objects (keys and strings) the bundle will dump, and
    :meth:`log` each worker log line (a JSON object is scrubbed as an object, then written
    again), so a value is found as the value it is, not as some serialiser spelled it. Text
    the bundle does not parse (a traceback, /metrics) is searched for every spelling of the
    value (:func:`_forms`). Every value of every Secret the spec names is scrubbed, whatever
    its length (see WORD_ONLY_BELOW); then credentials in URLs and properties (offtake.redact).
    """

    def __init__(self, secrets: Mapping[str, Mapping[str, str]]) -> None:
        marks: dict[str, str] = {}
        for name, data in sorted(secrets.items()):
            for key, value in sorted(data.items()):
                if value:
                    marks.setdefault(value, f"<redacted: Secret {name} key {key}>")
        # Longest first: a value containing another is replaced whole.
        self._rules: list[tuple[re.Pattern[str], str]] = []
        for value in sorted(marks, key=lambda v: (-len(v), v)):
            alternatives = "|".join(re.escape(f) for f in sorted(_forms(value), key=len)[::-1])
            if len(value) < WORD_ONLY_BELOW:
                alternatives = f"(?<![{_ALNUM}])(?:{alternatives})(?![{_ALNUM}])"
            # A template for re.sub: a backslash in a Secret's or key's name stays one.
            self._rules.append((re.compile(alternatives), marks[value].replace("\\", "\\\\")))

    @classmethod
    def of(cls, cluster: Cluster, refs: list[tuple[str, str]]) -> Scrubber:
        secrets: dict[str, Mapping[str, str]] = {}
        for field, name in refs:
            try:
                secrets[name] = cluster.secret_data(name, field)
            except PluginError:
                continue  # not readable by this user: then not quotable by this bundle either
        return cls(secrets)

    def text(self, text: str) -> str:
        for rule, mark in self._rules:
            text = rule.sub(mark, text)
        return redact(text)

    def tree(self, value: Any) -> Any:
        """``value`` (dicts, lists, strings, scalars) with every string scrubbed, keys too."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, Mapping):
            return {self.tree(k): self.tree(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.tree(v) for v in value]
        return value

    def log(self, text: str) -> str:
        """A worker's log: each JSON line scrubbed as the object it is, other lines as text."""
        lines = []
        for line in text.splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                entry = None
            if isinstance(entry, dict):
                lines.append(json.dumps(self.tree(entry), ensure_ascii=False))
            else:
                lines.append(self.text(line))
        return "".join(f"{line}\n" for line in lines)


def build(cluster: Cluster, name: str) -> tuple[bytes, list[str]]:
    """The zip's bytes and the names of its files."""
    manifest = cluster.pipeline(name)
    refs = sorted(set(secret_refs(manifest.get("spec") or {})))
    scrub = Scrubber.of(cluster, refs)
    files: dict[str, str] = {}
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    files["README.txt"] = scrub.text(
        f"kubectl offtake report: ConsumerPipeline {cluster.namespace}/{name} at {now}\n"
        f"API server: {cluster.server}\n"
        "pipeline.yaml: the pipeline (spec and status); status.json: kubectl offtake status -o "
        "json; children/: the objects the operator made; pods.yaml; events.yaml; logs/: each "
        f"worker's last {LOG_TAIL} log lines; metrics/: each worker's /metrics now; "
        "secrets.txt: the Secrets the spec names.\n"
        "No record data and no Secret value is included.\n"
    )
    # Every object is scrubbed as an object, before a serialiser spells its strings.
    files["pipeline.yaml"] = yaml.safe_dump(scrub.tree(_trim(manifest)), sort_keys=False)
    report, kafka_error = status_view.collect(cluster, name)
    files["status.json"] = json.dumps(
        scrub.tree({**report, "kafkaError": kafka_error}), indent=2, default=str
    )
    for kind, listed in cluster.children(name).items():
        body = listed if isinstance(listed, str) else [_trim(o) for o in listed]
        files[f"children/{kind}.yaml"] = yaml.safe_dump(scrub.tree(body), sort_keys=False)
    pods = cluster.pods(name)
    files["pods.yaml"] = yaml.safe_dump(scrub.tree([_trim(p) for p in pods]), sort_keys=False)
    events = scrub.tree(cluster.events(name, 1000))
    files["events.yaml"] = yaml.safe_dump(events, sort_keys=False)
    files["secrets.txt"] = scrub.text(
        "".join(f"{field}: Secret {secret} (values not included)\n" for field, secret in refs)
        or "the spec names no Secret\n"
    )
    for pod in pods:
        pod_name = pod["metadata"]["name"]
        try:
            files[f"logs/{pod_name}.log"] = scrub.log(cluster.worker_log(pod, LOG_TAIL, None))
        except PluginError as exc:
            files[f"logs/{pod_name}.unavailable.txt"] = scrub.text(f"{exc}\n")
        try:
            metrics = worker_metrics.pod_metrics(cluster, pod)
            files[f"metrics/{pod_name}.txt"] = scrub.text(metrics)
        except PluginError as exc:
            files[f"metrics/{pod_name}.unavailable.txt"] = scrub.text(f"{exc}\n")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as bundle:
        for path, text in files.items():
            bundle.writestr(f"{name}/{path}", text)
    return buffer.getvalue(), sorted(files)


def write(cluster: Cluster, name: str, path: str | None) -> tuple[Path, list[str]]:
    data, listed = build(cluster, name)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M%S")
    target = Path(path or f"offtake-report-{cluster.namespace}-{name}-{stamp}.zip")
    target.write_bytes(data)
    return target, listed
