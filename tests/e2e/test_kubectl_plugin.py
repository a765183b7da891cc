"""``kubectl offtake`` against the real kube-apiserver, the operator and the real Kafka broker.

The plugin runs in this process (its ``main``, with the test bed's kubeconfig passed as a user
would pass it), workers run as local processes from the pod template (``LocalKubelet``), and
each command's output is checked against what the broker and the API server hold.
"""

from __future__ import annotations

import datetime
import io
import json
import os
import signal
import subprocess
import sys
import threading
import zipfile
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from support.kube import wait_for
from support.schemas import order, serializer
from support.workers import WorkerProcess, wait_caught_up, write_manifest
from support.workers import produce as produce_values
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
from test_operator_redrive import POISON, produce, run_job_pod

from offtake_operator import names
from offtake_operator.context import OperatorContext
from offtake_operator.kubectl import cli, logs, report
from offtake_testbed.apicurio import ApicurioRegistry
from offtake_testbed.kube import ControlPlane, install_control_plane
from offtake_testbed.pytest_plugin import TopicFactory
from offtake_testbed.pytest_plugin_kube import Kubectl, _kube_version

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

COMMANDS = ["status", "dlq", "logs", "report", "pause", "resume", "scale", "rewind", "redrive"]


def run(cp: ControlPlane, ns: str, *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main([*args, "--kubeconfig", str(cp.kubeconfig), "-n", ns], out=out, err=err)
    # The session as a terminal shows it: pytest prints it with a failure (and with -s).
    print(f"$ kubectl offtake {' '.join(args)}\n{out.getvalue()}{err.getvalue()}[exit {code}]")
    return code, out.getvalue(), err.getvalue()


def test_help_of_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["--help"])
    assert done.value.code == 0
    top = capsys.readouterr().out
    assert top.startswith("usage: kubectl offtake")
    for command in COMMANDS:
        assert f"    {command} " in top
        with pytest.raises(SystemExit) as done:
            cli.main([command, "--help"])
        assert done.value.code == 0
        text = capsys.readouterr().out
        assert text.startswith(f"usage: kubectl offtake {command}"), text
        assert "--kubeconfig" in text and "--namespace" in text
    with pytest.raises(SystemExit) as done:
        cli.main(["dlq", "x", "--since", "yesterday"])
    assert done.value.code == 2
    assert "--since 'yesterday': expected a duration" in capsys.readouterr().err


def test_errors_a_person_can_act_on(
    control_plane: ControlPlane,
    kubectl: Kubectl,
    kube_namespace: str,
    operator: OperatorContext,  # noqa: F811
    tmp_path: Path,
) -> None:
    ns = kube_namespace
    # No such pipeline: one line, exit 5, for every command that names one.
    for args in (["status", "nope"], ["dlq", "nope"], ["pause", "nope"], ["scale", "nope", "2"]):
        code, out, err = run(control_plane, ns, *args)
        assert code == 5, (args, err)
        assert err == (
            f"kubectl offtake {args[0]}: no ConsumerPipeline 'nope' in namespace {ns} "
            "(kubectl get cpl lists them; -n picks another namespace)\n"
        )
        assert out == ""
    code, out, err = run(control_plane, ns, "status")
    assert (code, out) == (0, f"no ConsumerPipelines in namespace {ns}\n")

    # No cluster: a kubeconfig whose server does not answer.
    config = yaml.safe_load(control_plane.kubeconfig.read_text())
    config["clusters"][0]["cluster"]["server"] = "https://127.0.0.1:1"
    dead = tmp_path / "dead-kubeconfig"
    dead.write_text(yaml.safe_dump(config))
    out_io, err_io = io.StringIO(), io.StringIO()
    code = cli.main(["status", "--kubeconfig", str(dead)], out=out_io, err=err_io)
    assert code == 3
    assert err_io.getvalue().startswith(
        "kubectl offtake status: cannot reach the cluster at https://127.0.0.1:1"
    )
    assert len(err_io.getvalue().splitlines()) == 1 and "Traceback" not in err_io.getvalue()
    code = cli.main(["status", "--kubeconfig", str(tmp_path / "none")], out=out_io, err=err_io)
    assert code == 3 and "no cluster configured" in err_io.getvalue()

    # Which namespace, as kubectl picks it: the context's (here a second context, chosen with
    # --context, then the current one read from $KUBECONFIG), else default.
    config = yaml.safe_load(control_plane.kubeconfig.read_text())
    (context,) = config["contexts"]
    other = {"name": "other", "context": {**context["context"], "namespace": ns}}
    config["contexts"].append(other)
    mine = tmp_path / "kubeconfig"
    mine.write_text(yaml.safe_dump(config))
    out_io, err_io = io.StringIO(), io.StringIO()
    code = cli.main(["--context", "other", "status", "--kubeconfig", str(mine)], out=out_io)
    assert (code, out_io.getvalue()) == (0, f"no ConsumerPipelines in namespace {ns}\n")
    config["current-context"] = "other"
    mine.write_text(yaml.safe_dump(config))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KUBECONFIG", f"{tmp_path / 'absent'}:{mine}")
        out_io = io.StringIO()
        assert cli.main(["status"], out=out_io) == 0
    assert out_io.getvalue() == f"no ConsumerPipelines in namespace {ns}\n"

    # Kafka not reachable from here: status says so and still shows what the API server knows.
    apply(
        kubectl,
        ns,
        pipeline(
            "far",
            kafka={"bootstrapServers": "127.0.0.1:1"},
            errors={"policy": "dlq", "dlq": {"topic": "far-dlq"}},
        ),
    )
    apply(kubectl, ns, pipeline("nodlq", kafka={"bootstrapServers": "127.0.0.1:1"}))
    wait_for(lambda: status(kubectl, ns, "far").get("phase"), timeout=60, what="a phase")
    code, out, err = run(control_plane, ns, "status", "far")
    assert code == 6
    assert err.startswith("kubectl offtake: Kafka at 127.0.0.1:1 is not reachable from here")
    assert len(err.splitlines()) == 1
    assert f"ConsumerPipeline {ns}/far: " in out
    assert "conditions:\n  Ready" in out
    assert "committed offsets, log ends and the DLQ size need Kafka" in out
    # Its pods have no IP (no kubelet runs them here): their metrics are named as unread.
    assert "metrics: not read from far-" in out and ": no pod IP yet" in out
    # dlq needs Kafka: it says so, and which commands work without it.
    code, out, err = run(control_plane, ns, "dlq", "far")
    assert (code, out) == (6, "")
    assert err.startswith("kubectl offtake dlq: Kafka at 127.0.0.1:1 is not reachable from here")
    assert err.endswith(
        "; dead letters need Kafka (status, pause, resume, scale, rewind and redrive work "
        "through the API server)\n"
    )
    code, out, err = run(control_plane, ns, "dlq", "nodlq")
    assert code == 1 and "has no dead-letter topic (spec.errors.dlq.topic)" in err
    code, out, err = run(control_plane, ns, "status")
    assert code == 0 and out.splitlines()[1].startswith("far ")
    # ... and a change goes through the API server all the same.
    code, out, err = run(control_plane, ns, "scale", "far", "0", "--no-wait")
    assert (code, err) == (0, "")
    assert out == "consumerpipeline/far patched: waiting until scaled to 0 workers\n"

    # --watch refreshes until Ctrl-C, which ends it without a word.
    command = ["status", "-w", "--interval", "0.2", "-n", ns]
    watch = subprocess.Popen(
        [sys.executable, "-m", "offtake_operator.kubectl", *command],
        env={**os.environ, "KUBECONFIG": str(control_plane.kubeconfig)},
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    assert watch.stdout is not None
    for line in watch.stdout:
        lines.append(line)
        if sum(1 for seen in lines if seen.startswith("NAME ")) >= 2:
            break
    watch.send_signal(signal.SIGINT)
    _, rest = watch.communicate(timeout=30)
    assert watch.returncode == 0, rest
    assert lines[0].startswith("--- ") and "Traceback" not in rest


def test_a_cluster_without_the_crd(tmp_path: Path) -> None:
    """A real API server of its own that was never given the CRD: every command says so."""
    with ControlPlane(install_control_plane(_kube_version()), wait_for_controllers=False) as cp:
        for args in (["status"], ["status", "p"], ["dlq", "p"], ["pause", "p"], ["logs", "p"]):
            code, out, err = run(cp, "default", *args)
            assert (code, out) == (4, ""), err
            assert err == (
                f"kubectl offtake {args[0]}: the cluster does not serve "
                "consumerpipelines.offtake.dev/v1alpha1 (is the Offtake CRD installed? "
                "helm install offtake helm/offtake, or kubectl apply -f crds/)\n"
            )


def test_a_session_on_kafka(
    control_plane: ControlPlane,
    kubectl: Kubectl,
    kube_namespace: str,
    operator: OperatorContext,  # noqa: F811
    kafka_broker: Any,
    topic_factory: TopicFactory,
    tmp_path: Path,
) -> None:
    ns = kube_namespace
    source, output, dlq = topic_factory(partitions=2), topic_factory(1), topic_factory(1)
    produce(kafka_broker.bootstrap, source, 40)
    fixed = tmp_path / "fixed"
    env = [
        # The checkout's worker (not whichever the environment installed) and the test processors.
        {
            "name": "PYTHONPATH",
            "value": os.pathsep.join(str(ROOT / d) for d in ("worker", "tests")),
        },
        {"name": "OFFTAKE_TEST_FIXED_FILE", "value": str(fixed)},
    ]
    apply(
        kubectl,
        ns,
        pipeline(
            "kp",
            replicas=1,
            kafka={"bootstrapServers": kafka_broker.bootstrap},
            source={"topics": [source], "groupId": f"{ns}.{source}", "format": "json"},
            processor={"function": "support.processors:poison_until_fixed"},
            sink={"kafka": {"topic": output}},
            errors={"policy": "dlq", "maxRetries": 0, "dlq": {"topic": dlq}},
            shutdown={"drainTimeoutSeconds": 5},
            template={"spec": {"env": env}},
            slo={"maxLagSeconds": 60, "maxErrorRatio": 0.01, "maxTimeSinceLastCommitSeconds": 300},
        ),
    )
    with LocalKubelet(kubectl, ns, "kp", tmp_path) as kubelet:
        wait_for(
            lambda: (
                status(kubectl, ns, "kp").get("lag") == 0
                and status(kubectl, ns, "kp").get("phase") == "Running"
            ),
            timeout=120,
            what="lag 0",
        )
        dead = read_values(kafka_broker.bootstrap, dlq)
        assert sorted(v["id"] for v in dead) == sorted(POISON)

        # status NAME: the operator's view, and the broker's per partition.
        code, out, err = run(control_plane, ns, "status", "kp", "-o", "json")
        assert (code, err) == (0, "")
        report = json.loads(out)
        assert report["phase"] == "Running" and report["kafkaError"] is None
        parts = report["partitions"]
        assert [(p["topic"], p["partition"]) for p in parts] == [(source, 0), (source, 1)]
        assert sum(p["committed"] for p in parts) == 40
        assert all(p["committed"] == p["logEnd"] and p["lag"] == 0 for p in parts)
        (pod,) = report["pods"]
        assert [p["owner"] for p in parts] == [pod["name"]] * 2, "the worker holds both"
        assert pod["ready"] and pod["restarts"] == 0 and pod["currentConfig"] is True
        # The worker's own /metrics, through the API server's pod proxy: the lag's trend over
        # the last minute (caught up from 40 records behind: shrinking, or flat at 0) and the
        # error budget's burn (5 poison records of 40 in the DLQ against a 1 % budget).
        assert report["metrics"]["read"] == [pod["name"]], report["metrics"]
        assert report["metrics"]["unreadable"] == {}
        assert all(p["trend"] is not None and p["trend"] <= 0 for p in parts), parts
        slo = report["slo"]
        assert (slo["lag"]["objectiveSeconds"], slo["lag"]["burn"]) == (60, 0.0)
        errors = {k: slo["errors"][k] for k in ("errors", "done", "ratio", "burn")}
        assert errors == {"errors": len(POISON), "done": 40, "ratio": 0.125, "burn": 12.5}
        assert slo["commits"]["burn"] is None and "OfftakeSLONoCommit" in slo["commits"]["basis"]
        assert report["dlq"] == {"topic": dlq, "records": len(POISON)}
        assert "Running" in {e["reason"] for e in report["events"]}
        assert {c["type"] for c in report["conditions"]} >= {"Ready", "Degraded"}
        code, text, _ = run(control_plane, ns, "status", "kp")
        assert code == 0
        assert text.startswith(f"ConsumerPipeline {ns}/kp: Running (WorkersReady)")
        assert f"dead letters: {len(POISON)} in {dlq}" in text
        row = next(line for line in text.splitlines() if line.split()[:2] == [source, "0"])
        assert row.split()[-3:] == ["0", "0.0", f"{parts[0]['trend']:+.1f}/s"], row
        assert "TREND(1m)" in text and "metrics: not read" not in text
        assert (
            "  errors     12.50x  5 of 40 records in dlq/skipped/failed since the workers " in text
        )
        assert "  lag         0.00x  worst 0.0 s now, objective 60 s" in text
        assert f"  {pod['name']}" in text and "ready" in text
        code, out, _ = run(control_plane, ns, "status", "-o", "yaml")
        (summary,) = yaml.safe_load(out)["pipelines"]
        assert (summary["name"], summary["phase"], summary["lag"]) == ("kp", "Running", 0)

        # dlq: newest first, decoded, with origin and error.
        code, out, err = run(control_plane, ns, "dlq", "kp", "-o", "json")
        assert (code, err) == (0, "")
        letters = json.loads(out)
        assert sorted(d["value"]["id"] for d in letters) == sorted(POISON)
        times = [d["timestamp"] for d in letters]
        assert times == sorted(times, reverse=True)
        for d in letters:
            assert d["value"]["poison"] is True and d["key"] == str(d["value"]["id"])
            assert d["origin"]["topic"] == source and d["origin"]["partition"] in (0, 1)
            assert d["error"]["class"] and d["error"]["message"] and d["attempts"] >= 1
        code, out, _ = run(control_plane, ns, "dlq", "kp", "--limit", "1", "-o", "json")
        assert [d["offset"] for d in json.loads(out)] == [letters[0]["offset"]]
        code, out, _ = run(control_plane, ns, "dlq", "kp", "--grep", '"id": 8,', "-o", "json")
        assert [d["value"]["id"] for d in json.loads(out)] == [8]
        code, text, _ = run(control_plane, ns, "dlq", "kp", "--since", "1h")
        assert text.endswith(f"{len(POISON)} dead letter(s) from {dlq}, newest first\n")
        first = letters[0]
        origin = f"{source}[{first['origin']['partition']}]@{first['origin']['offset']}"
        assert text.splitlines()[0].split()[1] == origin
        assert f"  value: {json.dumps(first['value'])}" in text
        future = (datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)).isoformat()
        code, text, _ = run(control_plane, ns, "dlq", "kp", "--since", future)
        assert (code, text) == (0, f"no dead letters in {dlq} match\n")

        # logs: no node runs the pods here, so the command says so per pod; the
        # merging is checked on the workers' own log lines (what the kubelet would serve).
        code, out, err = run(control_plane, ns, "logs", "kp")
        assert code == 1 and out == ""
        assert err == f"kubectl offtake logs: pod '{pod['name']}' is on no node yet: no log\n"
        assert len(err.splitlines()) == 1
        worker_log = (tmp_path / f"{pod['name']}.log").read_text().splitlines()
        merged = logs.merge({pod["name"]: worker_log, "other": worker_log[:3]}, "INFO")
        stamps = [e["timestamp"] for e in merged]
        assert stamps == sorted(stamps) and {e["pod"] for e in merged} == {pod["name"], "other"}
        assert all(e["level"] != "DEBUG" for e in merged)
        shown = logs.render(merged).splitlines()
        print("(the workers' own log lines, merged as logs shows them)", *shown[:12], sep="\n")
        assert any(f" {pod['name']} INFO " in line for line in shown)

        # report: a bundle of what the API server and Kafka know, checked file by file.
        code, out, err = run(control_plane, ns, "report", "kp", "-f", str(tmp_path / "r.zip"))
        assert code == 0 and out.startswith(f"wrote {tmp_path / 'r.zip'} ("), err
        with zipfile.ZipFile(tmp_path / "r.zip") as bundle:
            files = {n: bundle.read(n).decode() for n in bundle.namelist()}
        assert yaml.safe_load(files["kp/pipeline.yaml"])["metadata"]["name"] == "kp"
        assert "managedFields" not in files["kp/pipeline.yaml"]
        assert json.loads(files["kp/status.json"])["dlq"] == {"topic": dlq, "records": len(POISON)}
        (deployment,) = yaml.safe_load(files["kp/children/Deployment.yaml"])
        assert deployment["metadata"]["name"] == "kp"
        (config_map,) = yaml.safe_load(files["kp/children/ConfigMap.yaml"])
        assert source in config_map["data"][names.CONFIG_KEY]
        assert "Running" in files["kp/events.yaml"]
        assert files["kp/secrets.txt"] == "the spec names no Secret\n"
        sample = text_string_to_metric_families(files[f"kp/metrics/{pod['name']}.txt"])
        processed = {
            (s.labels["topic"], s.labels["outcome"]): s.value
            for family in sample
            for s in family.samples
            if s.name == "offtake_messages_processed_total"
        }
        assert processed[(source, "dlq")] == len(POISON)
        unavailable = files[f"kp/logs/{pod['name']}.unavailable.txt"]
        assert unavailable == f"pod {pod['name']!r} is on no node yet: no log\n"

        # pause, resume, scale: the spec changes and the operator's progress is followed.
        code, out, err = run(control_plane, ns, "pause", "kp", "--timeout", "90")
        assert code == 0, err + out
        assert out.splitlines()[0] == "consumerpipeline/kp patched: waiting until paused: " + (
            "every worker drained, committed and left"
        )
        assert out.endswith("done: paused: every worker drained, committed and left\n")
        assert get_spec(kubectl, ns)["paused"] is True
        assert status(kubectl, ns, "kp")["phase"] == "Paused"
        code, out, err = run(control_plane, ns, "resume", "kp", "--timeout", "90")
        assert code == 0 and out.endswith("done: running: 1 workers ready\n"), err + out
        code, out, err = run(control_plane, ns, "scale", "kp", "2", "--timeout", "90")
        assert code == 0 and out.endswith("done: running: 2 workers ready\n"), err + out
        assert get_spec(kubectl, ns)["replicas"] == 2
        assert status(kubectl, ns, "kp")["readyReplicas"] == 2

        # redrive: followed while the Job's pod runs (this test plays its kubelet too).
        fixed.touch()
        until = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        followed: dict[str, Any] = {}

        def redrive() -> None:
            followed["result"] = run(
                control_plane, ns, "redrive", "kp", "--id", "fix-1", "--until", until
            )

        thread = threading.Thread(target=redrive)
        thread.start()
        summary = run_job_pod(kubectl, ns, names.redrive_job_name("kp"), "fix-1", tmp_path)
        thread.join(150)
        assert summary["replayed"] == len(POISON)
        code, out, err = followed["result"]
        assert code == 0, err + out
        assert (
            out.splitlines()[0] == "consumerpipeline/kp patched: waiting until redrive fix-1 done"
        )
        assert f"Running, 2/2 ready: redrive fix-1 of {dlq} until {until}: Job kp-redrive" in out
        assert f"replayed {len(POISON)} dead letter(s), left 0 newer than until" in out
        assert out.endswith("done: redrive fix-1 done\n")
        assert status(kubectl, ns, "kp")["redrive"]["replayed"] == len(POISON)

        # rewind: the operator stops the workers, resets the group, starts them again.
        code, out, err = run(
            control_plane, ns, "rewind", "kp", "--to", "latest", "--id", "r1", "--timeout", "120"
        )
        assert code == 0 and out.endswith("done: rewind r1 done\n"), err + out
        assert f"rewind r1: reset 2 partition(s) of group {ns}.{source} to latest" in out
        assert status(kubectl, ns, "kp")["rewind"]["lastId"] == "r1"
    assert not kubelet.errors, kubelet.errors


def get_spec(kubectl: Kubectl, ns: str) -> dict[str, Any]:
    done = kubectl("get", "cpl", "kp", "-n", ns, "-o", "json")
    return dict(json.loads(done.stdout)["spec"])


def test_report_holds_no_secret_value(
    control_plane: ControlPlane,
    kubectl: Kubectl,
    kube_namespace: str,
    operator: OperatorContext,  # noqa: F811
    tmp_path: Path,
) -> None:
    ns = kube_namespace
    # An umlaut, a quote and a backslash: each has an escape in YAML or JSON that a scrub of
    # the serialised text missed; and a value of 2 characters, which it never scrubbed.
    password = 's3cr3t-Pä"ss\\w0rd-kubectl'
    user = "al"
    kubectl(
        "create",
        "secret",
        "generic",
        "kafka-creds",
        "-n",
        ns,
        f"--from-literal=sasl.username={user}",
        f"--from-literal=sasl.password={password}",
        "--from-literal=sasl.mechanism=SCRAM-SHA-512",
        "--from-literal=security.protocol=SASL_PLAINTEXT",
    )
    manifest = pipeline(
        "sec", kafka={"bootstrapServers": "127.0.0.1:1", "secretRef": {"name": "kafka-creds"}}
    )
    # Someone pasted the password where it does not belong: the bundle must not carry it.
    manifest["metadata"]["annotations"] = {"note": f"the password is {password}, user {user}"}
    apply(kubectl, ns, manifest)
    wait_for(lambda: status(kubectl, ns, "sec").get("phase"), timeout=60, what="a phase")
    code, out, err = run(control_plane, ns, "report", "sec", "-f", str(tmp_path / "s.zip"))
    assert code == 0 and out.startswith(f"wrote {tmp_path / 's.zip'} ("), err
    raw = (tmp_path / "s.zip").read_bytes()
    with zipfile.ZipFile(tmp_path / "s.zip") as bundle:
        files = {n: bundle.read(n).decode() for n in bundle.namelist()}
    spellings = report._forms(password)
    for name, text in files.items():
        for form in spellings:
            assert form not in text, (name, form)
    assert password.encode() not in raw
    note = yaml.safe_load(files["sec/pipeline.yaml"])["metadata"]["annotations"]["note"]
    assert note == (
        "the password is <redacted: Secret kafka-creds key sasl.password>, "
        "user <redacted: Secret kafka-creds key sasl.username>"
    )
    assert files["sec/secrets.txt"] == (
        "spec.kafka.secretRef: Secret kafka-creds (values not included)\n"
    )
    assert "kafka-creds" in files["sec/children/Deployment.yaml"], "the mount, by name"
    assert json.loads(files["sec/status.json"])["kafkaError"].startswith("Kafka at 127.0.0.1:1")


def test_dlq_decodes_avro_through_the_schema_registry(
    control_plane: ControlPlane,
    kubectl: Kubectl,
    kube_namespace: str,
    pipelines_crd: None,  # noqa: F811
    kafka_broker: Any,
    schema_registry: ApicurioRegistry,
    topic_factory: TopicFactory,
    tmp_path: Path,
) -> None:
    """Dead letters of an avro pipeline, written by a real worker, read back by ``dlq`` with
    the writer's schema from the pipeline's registry (Apicurio): a refused record decoded, a
    record that never was avro shown raw with the decoder's reason."""
    ns = kube_namespace
    source, output, dlq = topic_factory(1), topic_factory(1), topic_factory(1)
    encode = serializer("avro", schema_registry.url, source)
    not_avro = b'{"id": 99, "note": "JSON, not avro"}'
    produce_values(
        kafka_broker.bootstrap, source, [*(encode(order(i)) for i in range(10)), not_avro]
    )
    doc = pipeline(
        "avro",
        kafka={"bootstrapServers": kafka_broker.bootstrap},
        source={
            "topics": [source],
            "groupId": f"{ns}.{source}",
            "format": "avro",
            "schemaRegistry": {"url": schema_registry.url},
        },
        processor={"function": "support.processors:refuse_ids"},
        sink={"kafka": {"topic": output}},
        errors={"policy": "dlq", "maxRetries": 0, "dlq": {"topic": dlq}},
    )
    worker = WorkerProcess(
        write_manifest(tmp_path / "avro.yaml", doc),
        tmp_path / "worker.log",
        env={"OFFTAKE_TEST_REFUSED_IDS": "7"},
    ).start()
    wait_caught_up(kafka_broker.bootstrap, f"{ns}.{source}", source, 1)
    assert worker.terminate() == 0, worker.output()[-3000:]
    apply(kubectl, ns, doc)

    code, out, err = run(control_plane, ns, "dlq", "avro", "-o", "json")
    assert (code, err) == (0, "")
    letters = {d["origin"]["offset"]: d for d in json.loads(out)}
    assert sorted(letters) == [7, 10]
    refused, undecodable = letters[7], letters[10]
    assert refused["value"] == order(7), "decoded with the writer's schema from the registry"
    assert refused["origin"] == {"topic": source, "partition": 0, "offset": 7}
    assert refused["error"]["class"] == "builtins.ValueError"
    assert refused["error"]["message"] == "ValueError: order 7 refused"
    assert undecodable["error"]["stage"] == "decode"
    assert undecodable["value"]["raw"] == not_avro.decode()
    assert undecodable["value"]["undecodable"].startswith("not valid avro: ")
    code, text, _ = run(control_plane, ns, "dlq", "avro", "--grep", "refused")
    assert code == 0
    assert f"  value: {json.dumps(order(7))}" in text
    assert text.endswith(f"1 dead letter(s) from {dlq}, newest first\n")


def test_dlq_writes_no_control_character_from_a_record_to_the_terminal(
    control_plane: ControlPlane,
    kubectl: Kubectl,
    kube_namespace: str,
    pipelines_crd: None,  # noqa: F811
    kafka_broker: Any,
    topic_factory: TopicFactory,
) -> None:
    """A hostile producer's dead letter on the real broker, read by ``dlq`` through the real
    API server: the window title, OSC 52 clipboard write, clear screen, C1 CSI and BEL in its
    key, value and error header reach stdout as visible escapes, never as bytes."""
    ns = kube_namespace
    source, dlq_topic = topic_factory(1), topic_factory(1)
    hostile = "\x1b]0;pwned\x07\x1b]52;c;Y3VybCBldmlsfHNo\x07\x1b[2J\x9b31m\rok\nforged: line"
    producer = confluent_kafka.Producer({"bootstrap.servers": kafka_broker.bootstrap})
    producer.produce(
        dlq_topic,
        key=hostile.encode(),
        value=json.dumps({"note": hostile}).encode(),
        headers=[("offtake.error.message", hostile.encode()), ("offtake.error.class", b"X")],
    )
    assert producer.flush(30) == 0
    doc = pipeline(
        "hostile",
        kafka={"bootstrapServers": kafka_broker.bootstrap},
        source={"topics": [source], "groupId": f"{ns}.{source}"},
        sink={"log": {}},
        errors={"policy": "dlq", "dlq": {"topic": dlq_topic}},
    )
    apply(kubectl, ns, doc)
    for output in ("text", "json"):
        code, out, err = run(control_plane, ns, "dlq", "hostile", "-o", output)
        assert code == 0, err
        for char in [*range(0x20), 0x7F, *range(0x80, 0xA0)]:
            if char != 0x0A:
                assert chr(char) not in out + err, (output, hex(char))
    code, text, _ = run(control_plane, ns, "dlq", "hostile")
    assert "  key:   \\x1b]0;pwned\\x07\\x1b]52;c;Y3VybCBldmlsfHNo\\x07\\x1b[2J\\x9b31m" in text
    assert not any(line.startswith("forged") for line in text.splitlines())
