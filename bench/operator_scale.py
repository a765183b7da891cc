"""The operator at N pipelines: ``offtake-operator`` as its own process on the test bed's real
kube-apiserver (+ kube-controller-manager), its lag read from the test bed's real Kafka broker.

One command (docs/bench.md, "The operator at scale")::

    python bench/operator_scale.py               # 1,000 pipelines, about 6 minutes
    python bench/operator_scale.py --quick       # 200 pipelines

What it does, in one run:

1. starts a Kafka broker and a control plane (etcd, kube-apiserver, kube-controller-manager),
   makes ``--topics`` topics of ``--partitions`` partitions with ``--backlog`` records each
   (every pipeline reads from the earliest offset: each has lag, and its age is probed);
2. starts the operator (production defaults: resync 30 s, lag every 15 s) on one namespace;
3. anchor: ``--single`` pipelines created one at a time, apply -> Deployment (watch);
4. creates N pipelines back to back (``--create-threads`` clients in parallel) and reports how
   long the creates took, apply -> Deployment p50/p99 (the Deployments' watch), the time from
   the first create until ALL Deployments exist and until EVERY pipeline has a status with a
   phase and a lag;
5. at rest for ``--rest-seconds``: the operator's CPU (% of one core, from /proc/<pid>/stat)
   and RSS, and the kube-apiserver's CPU over the same window (the anchor of what the
   operator costs the API server);
6. writes everything to ``bench/results/operator-scale-<date>[-quick].json`` (``--json``).

Goals (issue 27 item 6): all Deployments within 60 s of the first create, every status within
90 s, at rest at most 25% of a core and 512 MiB.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for part in ("worker", "operator", "testbed"):
    sys.path.insert(0, str(ROOT / part))

from confluent_kafka import Producer  # noqa: E402
from kubernetes import client, config, watch  # noqa: E402

from offtake_testbed.kafka import KafkaBroker  # noqa: E402
from offtake_testbed.kube import KUBE_VERSION, ControlPlane, install_control_plane  # noqa: E402
from offtake_testbed.process import terminate  # noqa: E402

GROUP, VERSION, PLURAL = "offtake.dev", "v1alpha1", "consumerpipelines"
CRD = ROOT / "crds" / "consumerpipeline.yaml"
GOALS = {"all_deployments_s": 60.0, "all_statuses_s": 90.0, "rest_cpu_pct": 25.0, "rss_mib": 512.0}
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, in seconds (/proc/<pid>/stat fields 14 and 15)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def pipeline(name: str, bootstrap: str, topic: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ConsumerPipeline",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "kafka": {"bootstrapServers": bootstrap},
            "source": {"topics": [topic], "startFrom": "earliest"},
            "sink": {"log": {}},
        },
    }


class Watcher:
    """First time each object of a kind was seen (Deployments), or first had a status with a
    phase and a lag (pipelines), from a watch in a thread of its own."""

    def __init__(self, list_call: Callable[..., Any], namespace: str, ready: Callable[[Any], bool]):
        self.seen: dict[str, float] = {}
        self._list_call = list_call
        self._namespace = namespace
        self._ready = ready
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            w = watch.Watch()
            try:
                for event in w.stream(self._list_call, self._namespace, timeout_seconds=10):
                    obj = event["object"]
                    name = obj["metadata"]["name"] if isinstance(obj, dict) else obj.metadata.name
                    if name not in self.seen and self._ready(obj):
                        self.seen[name] = time.monotonic()
                    if self._stop.is_set():
                        w.stop()
            except Exception as exc:  # a dropped watch: start again, the bench goes on
                print(f"watch restarted: {exc!r}", file=sys.stderr)
                time.sleep(0.5)

    def wait(self, names: list[str], timeout: float) -> float | None:
        """Seconds until every name was seen (None: not within ``timeout``)."""
        began = time.monotonic()
        while time.monotonic() - began < timeout:
            if all(n in self.seen for n in names):
                return time.monotonic() - began
            time.sleep(0.05)
        return None

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)


def has_status(obj: Any) -> bool:
    status = obj.get("status") or {}
    return bool(status.get("phase")) and status.get("lag") is not None


def make_backlog(broker: KafkaBroker, topics: list[str], partitions: int, records: int) -> None:
    for topic in topics:
        broker.create_topic(topic, partitions)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 20})
    for topic in topics:
        for i in range(records):
            producer.produce(topic, value=b"x" * 100, key=str(i).encode())
            if i % 10_000 == 0:
                producer.poll(0)
    producer.flush(60)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(q * len(ordered)) - 1))]


def run(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "pipelines": args.pipelines,
        "goals": GOALS,
        "load_before": os.getloadavg(),
        "git": subprocess.run(
            ["git", "-C", str(ROOT), "log", "-1", "--format=%h %s"],
            capture_output=True,
            text=True,
        ).stdout.strip()[:120],
    }
    broker = KafkaBroker().start()
    control_plane: ControlPlane | None = None
    operator: subprocess.Popen[bytes] | None = None
    watchers: list[Watcher] = []
    try:
        topics = [f"scale-{i:02d}" for i in range(args.topics)]
        make_backlog(broker, topics, args.partitions, args.backlog)
        control_plane = ControlPlane(install_control_plane(KUBE_VERSION, progress=sys.stderr))
        control_plane.start()
        control_plane.kubectl("apply", "-f", str(CRD))
        for _ in range(60):  # kubectl wait fails while the CRD has no conditions at all yet
            waited = control_plane.kubectl(
                "wait",
                "--for=condition=Established",
                f"crd/{PLURAL}.{GROUP}",
                "--timeout=60s",
                check=False,
            )
            if waited.returncode == 0:
                break
            time.sleep(1)
        ns = "scale"
        control_plane.kubectl("create", "namespace", ns)
        apiserver = next(
            p.popen.pid
            for p in control_plane._processes  # the bench's anchor: its own process
            if p.name == "kube-apiserver" and p.popen is not None
        )
        log_path = Path(args.log)
        env = {
            **os.environ,
            "KUBECONFIG": str(control_plane.kubeconfig),
            "OFFTAKE_NAMESPACES": ns,
            "OFFTAKE_LIVENESS_ENDPOINT": "",
            "PYTHONPATH": os.pathsep.join(str(ROOT / p) for p in ("worker", "operator")),
        }
        with log_path.open("wb") as log:
            operator = subprocess.Popen(
                [sys.executable, "-m", "offtake_operator.main"],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        api = config.new_client_from_config(config_file=str(control_plane.kubeconfig))
        custom = client.CustomObjectsApi(api)
        apps = client.AppsV1Api(api)

        def list_pipelines(namespace: str, **kw: Any) -> Any:
            return custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, **kw)

        list_pipelines.__doc__ = custom.list_namespaced_custom_object.__doc__
        deployments = Watcher(apps.list_namespaced_deployment, ns, lambda _: True)
        statuses = Watcher(list_pipelines, ns, has_status)
        watchers = [deployments, statuses]
        time.sleep(5)  # the watches and the operator have started
        if operator.poll() is not None:
            raise RuntimeError(f"the operator exited; see {log_path}")

        def create(name: str, index: int) -> float:
            body = pipeline(name, broker.bootstrap, topics[index % len(topics)])
            custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)
            return time.monotonic()

        single: list[float] = []
        for i in range(args.single):
            name = f"single-{i}"
            began = time.monotonic()
            create(name, i)
            waited = deployments.wait([name], 30)
            if waited is not None:
                single.append(deployments.seen[name] - began)
        single_status = statuses.wait([f"single-{i}" for i in range(args.single)], 60)
        result["single"] = {
            "count": args.single,
            "apply_to_deployment_p50_ms": round(statistics.median(single) * 1000),
            "apply_to_deployment_max_ms": round(max(single) * 1000),
            "all_statuses_s": single_status,
        }
        print(f"anchor, one at a time: {result['single']}", flush=True)

        names = [f"p-{i:04d}" for i in range(args.pipelines)]
        cpu_before = cpu_seconds(operator.pid)
        first = time.monotonic()
        with ThreadPoolExecutor(args.create_threads) as pool:
            created = dict(zip(names, pool.map(create, names, range(len(names))), strict=True))
        creates_s = time.monotonic() - first
        print(f"{len(names)} creates took {creates_s:.1f} s", flush=True)
        timeout = args.timeout
        all_deployments = deployments.wait(names, timeout)
        all_deployments_s = (
            None if all_deployments is None else max(deployments.seen[n] for n in names) - first
        )
        missing_status = statuses.wait(names, max(1.0, timeout - (time.monotonic() - first)))
        all_statuses_s = (
            None if missing_status is None else max(statuses.seen[n] for n in names) - first
        )
        burst_cpu = cpu_seconds(operator.pid) - cpu_before
        burst_wall = time.monotonic() - first
        latencies = [deployments.seen[n] - created[n] for n in names if n in deployments.seen]
        result["burst"] = {
            "creates_s": round(creates_s, 1),
            "create_threads": args.create_threads,
            "deployments_seen": len(latencies),
            "statuses_seen": sum(1 for n in names if n in statuses.seen),
            "apply_to_deployment_p50_s": round(statistics.median(latencies), 2),
            "apply_to_deployment_p99_s": round(percentile(latencies, 0.99), 2),
            "all_deployments_s": None if all_deployments_s is None else round(all_deployments_s, 1),
            "all_statuses_s": None if all_statuses_s is None else round(all_statuses_s, 1),
            "operator_cpu_pct_during": round(100 * burst_cpu / burst_wall, 1),
            # The figure a busy machine does not change much: the operator's own work per
            # pipeline created (CPU time, not wall time).
            "operator_cpu_ms_per_pipeline": round(1000 * burst_cpu / len(names), 1),
            "load_average": os.getloadavg()[0],
        }
        print(f"burst: {result['burst']}", flush=True)

        # At rest: every pipeline has its Deployment and status; what remains is the resync
        # and the lag measurements. A few ticks first so the burst's tail is not counted.
        time.sleep(args.settle_seconds)
        op0, api0, t0 = cpu_seconds(operator.pid), cpu_seconds(apiserver), time.monotonic()
        rss_samples = []
        while time.monotonic() - t0 < args.rest_seconds:
            time.sleep(5)
            rss_samples.append(rss_mib(operator.pid))
        wall = time.monotonic() - t0
        result["rest"] = {
            "seconds": round(wall, 1),
            "operator_cpu_pct": round(100 * (cpu_seconds(operator.pid) - op0) / wall, 1),
            "operator_rss_mib": round(max(rss_samples), 1),
            "apiserver_cpu_pct": round(100 * (cpu_seconds(apiserver) - api0) / wall, 1),
        }
        print(f"at rest: {result['rest']}", flush=True)
        if operator.poll() is not None:
            raise RuntimeError(f"the operator exited; see {log_path}")
        burst, rest = result["burst"], result["rest"]
        result["met"] = {
            "all_deployments_s": (burst["all_deployments_s"] or 1e9) <= GOALS["all_deployments_s"],
            "all_statuses_s": (burst["all_statuses_s"] or 1e9) <= GOALS["all_statuses_s"],
            "rest_cpu_pct": rest["operator_cpu_pct"] <= GOALS["rest_cpu_pct"],
            "rss_mib": rest["operator_rss_mib"] <= GOALS["rss_mib"],
        }
        result["load_after"] = os.getloadavg()
        return result
    finally:
        for w in watchers:
            w.stop()
        if operator is not None:
            terminate(operator, 30)
        if control_plane is not None:
            control_plane.stop()
        broker.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pipelines", type=int, default=None, help="default 1000, --quick 200")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--single", type=int, default=5, help="anchor pipelines, one at a time")
    parser.add_argument("--topics", type=int, default=10)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--backlog", type=int, default=3000, help="records per topic")
    parser.add_argument("--create-threads", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--settle-seconds", type=float, default=20.0)
    parser.add_argument("--rest-seconds", type=float, default=60.0)
    parser.add_argument("--log", default="/tmp/offtake-operator-scale.log")
    parser.add_argument("--json", default=None, help="default bench/results/operator-scale-...")
    args = parser.parse_args(argv)
    # SIGTERM stops the components as Ctrl-C does (the finally blocks), not leaves them running.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.pipelines is None:
        args.pipelines = 200 if args.quick else 1000
    result = run(args)
    day = datetime.date.today().isoformat()
    suffix = "-quick" if args.quick else ""
    out = Path(args.json or ROOT / "bench" / "results" / f"operator-scale-{day}{suffix}.json")
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(f"written to {out}")
    return 0 if all(result["met"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
