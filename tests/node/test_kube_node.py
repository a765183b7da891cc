"""The test bed's node is a real one: the kubelet registers with the real apiserver, the real
scheduler binds pods to it, containerd and runc run the worker image, the CNI bridge gives the
pods addresses, and the apiserver reads their logs back from the kubelet."""

from __future__ import annotations

import ipaddress
import json

import pytest

from offtake_testbed.kube import ControlPlane
from offtake_testbed.node import NODE_NAME, POD_SUBNET, Node
from offtake_testbed.pytest_plugin_kube import Kubectl

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def test_a_deployment_of_the_worker_image_runs_on_the_node(
    control_plane: ControlPlane, kube_node: Node, kubectl: Kubectl, kube_namespace: str
) -> None:
    ns = kube_namespace
    node = json.loads(kubectl("get", "node", NODE_NAME, "-o", "json").stdout)
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://2.")
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "hello", "namespace": ns},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "hello"}},
            "template": {
                "metadata": {"labels": {"app": "hello"}},
                "spec": {
                    "containers": [
                        {
                            "name": "w",
                            "image": "localhost/offtake-worker:0.1.0",
                            "imagePullPolicy": "Never",
                            # The worker image's Python and package, in a pod of its own.
                            "command": [
                                "python",
                                "-c",
                                "import offtake, socket, time; "
                                "print('offtake in', socket.gethostname(), flush=True); "
                                "time.sleep(3600)",
                            ],
                        }
                    ]
                },
            },
        },
    }
    kubectl("apply", "-f", "-", input=json.dumps(deployment))
    kubectl("rollout", "status", "-n", ns, "deployment/hello", "--timeout=180s", timeout=200)
    pods = json.loads(kubectl("get", "pods", "-n", ns, "-l", "app=hello", "-o", "json").stdout)
    assert len(pods["items"]) == 2
    subnet = ipaddress.ip_network(POD_SUBNET)
    for pod in pods["items"]:
        assert pod["spec"]["nodeName"] == NODE_NAME
        assert pod["status"]["phase"] == "Running"
        assert ipaddress.ip_address(pod["status"]["podIP"]) in subnet
        name = pod["metadata"]["name"]
        logs = kubectl("logs", "-n", ns, name, timeout=60).stdout
        assert logs.strip() == f"offtake in {name}"
    # Deleting a pod: the ReplicaSet replaces it and the kubelet runs the new one.
    first = pods["items"][0]["metadata"]["name"]
    kubectl("delete", "pod", "-n", ns, first, "--wait=true", timeout=120)
    kubectl("rollout", "status", "-n", ns, "deployment/hello", "--timeout=180s", timeout=200)
    names = kubectl(
        "get", "pods", "-n", ns, "-l", "app=hello", "-o", "jsonpath={.items[*].metadata.name}"
    ).stdout.split()
    assert len(names) == 2 and first not in names
