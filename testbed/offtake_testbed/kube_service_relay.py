"""The ``kubernetes`` Service's address, reachable from the test bed node's pods.

A pod that calls the Kubernetes API (Spark's driver, which creates its executor pods) finds it
at KUBERNETES_SERVICE_HOST:PORT, the ``kubernetes`` Service's cluster IP (10.0.0.1:443 here),
and checks the apiserver's certificate against that address (the test bed's certificate names
10.0.0.1). The test bed's node has no kube-proxy and the apiserver listens on loopback only, so
this puts 10.0.0.1 on the pods' bridge (the pods' default route leads to this host) and relays
TCP from 10.0.0.1:443 to the apiserver, bytes unchanged (TLS end to end): what kube-proxy's
rules would do for that one Service. No other Service IP is routed.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import threading
from typing import Self

from ._service import Service

__all__ = ["SERVICE_IP", "SERVICE_PORT", "KubernetesServiceRelay"]

SERVICE_IP = "10.0.0.1"
SERVICE_PORT = 443
_BRIDGE = "offtake0"


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        # One side is done: end both directions (the other thread's recv returns), and each
        # thread closes the socket it read from.
        for sock in (dst, src):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        src.close()


class KubernetesServiceRelay(Service):
    """Relays :data:`SERVICE_IP`:`SERVICE_PORT` on the node's bridge to ``127.0.0.1:port``."""

    def __init__(self, apiserver_port: int) -> None:
        self.apiserver_port = apiserver_port
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._added_address = False

    def start(self) -> Self:
        ip = shutil.which("ip") or "/usr/sbin/ip"
        added = subprocess.run(
            [ip, "addr", "add", f"{SERVICE_IP}/32", "dev", _BRIDGE],
            capture_output=True,
            text=True,
            check=False,
        )
        # "File exists" (older iproute2) or "Address already assigned": a previous run that was
        # killed before stop() left it; it is ours either way.
        left_over = "exists" in added.stderr or "already assigned" in added.stderr
        if added.returncode != 0 and not left_over:
            raise RuntimeError(f"ip addr add {SERVICE_IP}/32 dev {_BRIDGE}: {added.stderr}")
        self._added_address = added.returncode == 0
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((SERVICE_IP, SERVICE_PORT))
        listener.listen(64)
        self._listener = listener
        self._thread = threading.Thread(target=self._accept, name="kube-service-relay", daemon=True)
        self._thread.start()
        return self

    def _accept(self) -> None:
        # Its own reference: stop() sets self._listener to None as it closes it, and reading
        # the attribute again here raised AttributeError in this thread instead of returning.
        listener = self._listener
        assert listener is not None
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed by stop()
            try:
                upstream = socket.create_connection(("127.0.0.1", self.apiserver_port), timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pipe, args=(a, b), daemon=True).start()

    def stop(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self._added_address:
            ip = shutil.which("ip") or "/usr/sbin/ip"
            subprocess.run(
                [ip, "addr", "del", f"{SERVICE_IP}/32", "dev", _BRIDGE],
                capture_output=True,
                check=False,
            )
            self._added_address = False
