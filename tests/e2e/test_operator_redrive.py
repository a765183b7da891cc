"""spec.redrive end to end: operator, kube-apiserver + kube-controller-manager, real Kafka.

Nothing runs containers here, so the test plays kubelet: worker pods run as local processes
from the Deployment's pod template (``LocalKubelet`` of test_operator_e2e), and the redrive
Job's pod runs its container's command locally; its exit is reported on the Pod object the
Job controller created, as a kubelet would, so the Job controller completes the Job and the
operator records the redrive.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from support.kube import get, patch, wait_for, wait_for_passes
from test_operator_e2e import (  # noqa: F401  (operator, pipelines_crd: fixtures)
    ROOT,
    LocalKubelet,
    apply,
    operator,
    pipeline,
    pipelines_crd,
    read_values,
    status,
)

from offtake_operator import names
from offtake_operator.context import OperatorContext
from offtake_testbed.pytest_plugin import TopicFactory
from offtake_testbed.pytest_plugin_kube import Kubectl

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

POISON = {3, 8, 13, 21, 34}


def produce(bootstrap: str, topic: str, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(count):
        value = {"id": i, "poison": i in POISON}
        producer.produce(
            topic,
            key=str(i).encode(),
            value=json.dumps(value).encode(),
            headers=[("trace", f"t{i}".encode())],
        )
    assert producer.flush(30) == 0


def run_job_pod(
    kubectl: Kubectl, ns: str, job: str, redrive_id: str, workdir: Path
) -> dict[str, Any]:
    """Run the Job's pod as a kubelet would: its container's command with the ConfigMap
    mounted, then its exit on the Pod's status. Returns the summary the command printed."""

    def find() -> dict[str, Any] | None:
        for pod in get(kubectl, "pods", "-n", ns, "-l", f"job-name={job}")["items"]:
            annotations = pod["metadata"].get("annotations") or {}
            if annotations.get(names.REDRIVE_ID_ANNOTATION) == redrive_id:
                return dict(pod)
        return None

    pod = wait_for(find, timeout=60, what=f"the pod of Job {job} for {redrive_id}")
    spec = pod["spec"]
    (container,) = spec["containers"]
    assert names.PIPELINE_LABEL not in pod["metadata"]["labels"], "not a worker pod"
    cm_name = next(v["configMap"]["name"] for v in spec["volumes"] if v["name"] == "pipeline")
    cm = get(kubectl, "configmap", cm_name, "-n", ns)
    config = workdir / "redrive-pipeline.yaml"
    config.write_text(cm["data"][names.CONFIG_KEY])
    program = container["command"][0]
    command = [shutil.which(program) or program, *container["command"][1:]]
    args = [str(config) if a == names.PIPELINE_PATH else a for a in container["args"]]
    env = {**os.environ, **{e["name"]: e.get("value", "") for e in container.get("env", [])}}
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    done = subprocess.run(
        [*command, *args], env=env, capture_output=True, text=True, timeout=300, cwd=workdir
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    finished = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    terminated = {
        "exitCode": 0,
        "reason": "Completed",
        "message": json.dumps(summary),
        "startedAt": started,
        "finishedAt": finished,
    }
    patch = {
        "status": {
            "phase": "Succeeded",
            "conditions": [
                {"type": "Ready", "status": "False", "reason": "PodCompleted"},
                {"type": "ContainersReady", "status": "False", "reason": "PodCompleted"},
            ],
            "containerStatuses": [
                {
                    "name": container["name"],
                    "image": container["image"],
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "started": False,
                    "state": {"terminated": terminated},
                    "lastState": {},
                }
            ],
        }
    }
    kubectl(
        "patch",
        "pod",
        pod["metadata"]["name"],
        "-n",
        ns,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(patch),
    )
    return dict(summary)


def test_redrive_replays_dead_letters_through_the_pipeline_once(
    kubectl: Kubectl,
    kube_namespace: str,
    operator: OperatorContext,  # noqa: F811
    kafka_broker: Any,
    topic_factory: TopicFactory,
    tmp_path: Path,
) -> None:
    ns = kube_namespace
    source, output, dlq = topic_factory(partitions=3), topic_factory(1), topic_factory(1)
    produce(kafka_broker.bootstrap, source, 40)
    fixed = tmp_path / "fixed"
    env = [
        {"name": "PYTHONPATH", "value": str(ROOT / "tests")},
        {"name": "OFFTAKE_TEST_FIXED_FILE", "value": str(fixed)},
    ]
    apply(
        kubectl,
        ns,
        pipeline(
            "rd",
            replicas=1,
            kafka={"bootstrapServers": kafka_broker.bootstrap},
            source={"topics": [source], "groupId": f"{ns}.{source}", "format": "json"},
            processor={"function": "support.processors:poison_until_fixed"},
            sink={"kafka": {"topic": output}},
            errors={"policy": "dlq", "maxRetries": 0, "dlq": {"topic": dlq}},
            shutdown={"drainTimeoutSeconds": 5},
            template={"spec": {"env": env}},
        ),
    )
    with LocalKubelet(kubectl, ns, "rd", tmp_path) as kubelet:
        wait_for(lambda: status(kubectl, ns, "rd").get("lag") == 0, timeout=120, what="lag 0")
        first = read_values(kafka_broker.bootstrap, output)
        assert sorted(v["id"] for v in first) == [i for i in range(40) if i not in POISON]
        dead = read_values(kafka_broker.bootstrap, dlq)
        assert sorted(v["id"] for v in dead) == sorted(POISON)

        # The bug is fixed; dead letters from before now are to go through again.
        fixed.touch()
        until = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        time.sleep(1.1)  # anything dead-lettered from here on is newer than until
        patch(kubectl, ns, "cpl/rd", {"spec": {"redrive": {"id": "fix-1", "until": until}}})
        job = names.redrive_job_name("rd")
        wait_for(
            lambda: status(kubectl, ns, "rd").get("redrive", {}).get("activeId") == "fix-1",
            timeout=60,
            what="redrive in progress",
        )
        summary = run_job_pod(kubectl, ns, job, "fix-1", tmp_path)
        assert (summary["replayed"], summary["left"], summary["skipped"]) == (len(POISON), 0, 0)

        recorded = wait_for(
            lambda: (
                (s := status(kubectl, ns, "rd").get("redrive", {})).get("lastId") == "fix-1" and s
            ),
            timeout=120,
            what="redrive recorded (the Job controller completes the Job)",
        )
        assert recorded["replayed"] == len(POISON)
        assert recorded["from"] == dlq and recorded["until"] == until
        assert recorded["completedAt"] and "activeId" not in recorded
        # The workers consumed the replayed records: every id is in the output, once.
        wait_for(
            lambda: len(read_values(kafka_broker.bootstrap, output, quiet=1.0)) >= 40,
            timeout=120,
            what="the replayed records processed",
        )
        values = read_values(kafka_broker.bootstrap, output)
        assert sorted(v["id"] for v in values) == list(range(40)), "each record once"
        assert {v["id"] for v in values if v.get("fixed")} == POISON
        assert len(read_values(kafka_broker.bootstrap, dlq)) == len(POISON), "no new failures"
        reasons = {
            e["reason"]
            for e in get(kubectl, "events", "-n", ns)["items"]
            if e["involvedObject"]["name"] == "rd"
        }
        assert {"RedriveStarted", "RedriveCompleted"} <= reasons
        job_obj = get(kubectl, "job", job, "-n", ns)
        assert job_obj["metadata"]["ownerReferences"][0]["name"] == "rd"
        assert job_obj["spec"]["ttlSecondsAfterFinished"] == names.REDRIVE_JOB_TTL_SECONDS
        # Resyncs (every 3 s) do not run it again: one Job, one pod.
        wait_for_passes(operator, ns, "rd", 2)
        assert get(kubectl, "job", job, "-n", ns)["metadata"]["uid"] == job_obj["metadata"]["uid"]
        assert len(get(kubectl, "pods", "-n", ns, "-l", f"job-name={job}")["items"]) == 1

        # A second redrive: the first one's Job goes (in the foreground, pods first), the new
        # one starts where the first stopped, so nothing is replayed twice.
        until2 = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        patch(kubectl, ns, "cpl/rd", {"spec": {"redrive": {"id": "fix-2", "until": until2}}})
        summary2 = run_job_pod(kubectl, ns, job, "fix-2", tmp_path)
        assert (summary2["replayed"], summary2["left"], summary2["skipped"]) == (0, 0, 0)
        wait_for(
            lambda: status(kubectl, ns, "rd").get("redrive", {}).get("lastId") == "fix-2",
            timeout=120,
            what="the second redrive recorded",
        )
        assert status(kubectl, ns, "rd")["redrive"]["replayed"] == 0
        assert get(kubectl, "job", job, "-n", ns)["metadata"]["uid"] != job_obj["metadata"]["uid"]
        values = read_values(kafka_broker.bootstrap, output)
        assert sorted(v["id"] for v in values) == list(range(40)), "still each record once"
    assert not kubelet.errors, kubelet.errors
