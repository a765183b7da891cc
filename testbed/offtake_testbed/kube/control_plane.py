"""A running control plane: etcd, kube-apiserver and kube-controller-manager on loopback, with
an admin kubeconfig (see :mod:`offtake_testbed.kube`)."""

from __future__ import annotations

import atexit
import base64
import json
import os
import secrets
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .._service import Service
from ..process import die_with_parent, file_tail, free_port, tail, terminate
from .install import Paths, install_control_plane, install_helm

__all__ = ["ControlPlane", "ControlPlaneError", "HelmError", "KubectlError"]

_LOG_TAIL_LINES = 40


class ControlPlaneError(RuntimeError):
    """The control plane failed to start or to become ready; the message includes log tails."""


class KubectlError(RuntimeError):
    """``kubectl`` (or, as :class:`HelmError`, ``helm``) exited non-zero."""

    tool = "kubectl"

    def __init__(self, args: Sequence[str], result: subprocess.CompletedProcess[str]) -> None:
        self.result = result
        super().__init__(
            f"{self.tool} {' '.join(args)} exited {result.returncode}\n"
            f"stderr: {result.stderr.strip()}\nstdout: {result.stdout.strip()}"
        )


class HelmError(KubectlError):
    """``helm`` exited non-zero."""

    tool = "helm"


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ControlPlaneError(
            f"openssl {' '.join(args)} failed:\n{tail(proc.stderr, _LOG_TAIL_LINES)}"
        )


def _make_pki_openssl(pki: Path) -> None:
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl(
        "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "3650",
        "-subj", "/CN=offtake-testbed-ca", cwd=pki,
    )  # fmt: skip
    _openssl(
        "req", *ec, "-keyout", "apiserver.key", "-out", "apiserver.csr",
        "-subj", "/CN=kube-apiserver", cwd=pki,
    )  # fmt: skip
    (pki / "apiserver.ext").write_text(
        "basicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature\n"
        "extendedKeyUsage=serverAuth\n"
        "subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,"
        "DNS:kubernetes.default,DNS:kubernetes.default.svc,"
        "DNS:kubernetes.default.svc.cluster.local\n"
    )
    _openssl(
        "x509", "-req", "-in", "apiserver.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "apiserver.crt", "-days", "365",
        "-extfile", "apiserver.ext", cwd=pki,
    )  # fmt: skip
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)


def _make_pki_cryptography(pki: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    from offtake_testbed._pki import CertificateAuthority

    ca = CertificateAuthority(days=3650)
    apiserver = ca.server(
        "kube-apiserver",
        hosts=(
            "127.0.0.1",
            "10.0.0.1",
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ),
    )
    sa_key = rsa.generate_private_key(65537, 2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    (pki / "ca.key").write_text(ca.key_pem)
    (pki / "ca.crt").write_text(ca.cert_pem)
    (pki / "apiserver.key").write_text(apiserver.key_pem)
    (pki / "apiserver.crt").write_text(apiserver.cert_pem)
    (pki / "sa.key").write_bytes(sa_key)


def _make_pki(pki: Path) -> None:
    """A CA, a serving certificate for 127.0.0.1 and a service-account signing key."""
    pki.mkdir(parents=True, exist_ok=True)
    if shutil.which("openssl"):
        _make_pki_openssl(pki)
        return
    try:
        _make_pki_cryptography(pki)
    except ImportError as exc:
        raise ControlPlaneError(
            "generating the test bed's certificates needs either the `openssl` command "
            "(apt-get install openssl) or the `cryptography` Python package"
        ) from exc


@dataclass
class _Process:
    name: str
    args: list[str]
    log: Path
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)


class ControlPlane(Service):
    """etcd + kube-apiserver + kube-controller-manager on loopback, with an admin kubeconfig.

    Use as a context manager, or call :meth:`start` and :meth:`stop`. Each instance gets its own
    temporary folder (data, certificates, logs, kubeconfig), removed by :meth:`stop` unless
    ``keep_workdir`` is true. The admin user authenticates with a static bearer token and is in
    ``system:masters``; authorization is RBAC.
    """

    def __init__(
        self,
        paths: Paths | None = None,
        *,
        workdir: Path | None = None,
        keep_workdir: bool = False,
        start_timeout: float = 120.0,
        wait_for_controllers: bool = True,
        extra_apiserver_args: Sequence[str] = (),
        extra_controller_manager_args: Sequence[str] = (),
    ) -> None:
        self._paths = paths
        self._given_workdir = workdir
        self._keep_workdir = keep_workdir
        self._start_timeout = start_timeout
        self._wait_for_controllers = wait_for_controllers
        self._extra_apiserver_args = list(extra_apiserver_args)
        self._extra_kcm_args = list(extra_controller_manager_args)
        self._processes: list[_Process] = []
        self._workdir: Path | None = None
        self._kubeconfig: Path | None = None
        self.token = secrets.token_hex(16)
        self.apiserver_port = 0
        self.etcd_port = 0
        self.controller_manager_port = 0
        self.start_seconds: float | None = None

    # -- properties ---------------------------------------------------------------------------

    @property
    def paths(self) -> Paths:
        if self._paths is None:
            self._paths = install_control_plane()
        return self._paths

    @property
    def workdir(self) -> Path:
        if self._workdir is None:
            raise ControlPlaneError("the control plane is not started")
        return self._workdir

    @property
    def kubeconfig(self) -> Path:
        """Path of a self-contained kubeconfig (CA data and admin token embedded)."""
        if self._kubeconfig is None:
            raise ControlPlaneError("the control plane is not started")
        return self._kubeconfig

    @property
    def server(self) -> str:
        """The apiserver's URL, ``https://127.0.0.1:<port>``."""
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def ca_file(self) -> Path:
        return self.workdir / "pki" / "ca.crt"

    @property
    def running(self) -> bool:
        return bool(self._processes) and all(
            p.popen is not None and p.popen.poll() is None for p in self._processes
        )

    def env(self) -> dict[str, str]:
        """``os.environ`` plus ``KUBECONFIG`` and the kubectl folder first on ``PATH``."""
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["PATH"] = f"{self.paths.bin_dir}{os.pathsep}{env.get('PATH', '')}"
        return env

    def log_file(self, component: str) -> Path:
        """The log of ``etcd``, ``kube-apiserver`` or ``kube-controller-manager``."""
        return self.workdir / "logs" / f"{component}.log"

    def log_tail(self, component: str, lines: int = _LOG_TAIL_LINES) -> str:
        return file_tail(self.log_file(component), lines)

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> ControlPlane:
        """Start etcd, kube-apiserver and kube-controller-manager and wait until all are ready."""
        if self._processes:
            raise ControlPlaneError("the control plane is already started")
        paths = self.paths
        started = time.monotonic()
        deadline = started + self._start_timeout
        if self._given_workdir is not None:
            self._given_workdir.mkdir(parents=True, exist_ok=True)
            self._workdir = self._given_workdir
        else:
            self._workdir = Path(tempfile.mkdtemp(prefix="offtake-kube-"))
        work = self._workdir
        atexit.register(self.stop)
        try:
            (work / "logs").mkdir(exist_ok=True)
            pki = work / "pki"
            _make_pki(pki)
            (pki / "tokens.csv").write_text(
                f'{self.token},offtake-admin,offtake-admin,"system:masters"\n'
            )
            self._kubeconfig = work / "kubeconfig"

            self.etcd_port = free_port()
            peer_port = free_port()
            etcd_url = f"http://127.0.0.1:{self.etcd_port}"
            peer_url = f"http://127.0.0.1:{peer_port}"
            self._spawn(
                "etcd",
                [
                    str(paths.etcd),
                    "--name=offtake",
                    f"--data-dir={work / 'etcd'}",
                    f"--listen-client-urls={etcd_url}",
                    f"--advertise-client-urls={etcd_url}",
                    f"--listen-peer-urls={peer_url}",
                    f"--initial-advertise-peer-urls={peer_url}",
                    f"--initial-cluster=offtake={peer_url}",
                    "--unsafe-no-fsync",
                    "--log-level=warn",
                ],
            )
            self._wait("etcd", deadline, lambda: self._http_ok(f"{etcd_url}/health"))

            self.apiserver_port = free_port()
            self._write_kubeconfig()
            self._spawn(
                "kube-apiserver",
                [
                    str(paths.kube_apiserver),
                    f"--etcd-servers={etcd_url}",
                    "--bind-address=127.0.0.1",
                    "--advertise-address=127.0.0.1",
                    f"--secure-port={self.apiserver_port}",
                    f"--cert-dir={work / 'apiserver-certs'}",
                    f"--tls-cert-file={pki / 'apiserver.crt'}",
                    f"--tls-private-key-file={pki / 'apiserver.key'}",
                    f"--client-ca-file={pki / 'ca.crt'}",
                    f"--token-auth-file={pki / 'tokens.csv'}",
                    f"--service-account-key-file={pki / 'sa.key'}",
                    f"--service-account-signing-key-file={pki / 'sa.key'}",
                    "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                    "--service-cluster-ip-range=10.0.0.0/24",
                    "--authorization-mode=RBAC",
                    "--allow-privileged=true",
                    "--profiling=false",
                    # The test bed's node (offtake_testbed.node) has no DNS name: reach its
                    # kubelet (logs, exec) at its InternalIP.
                    "--kubelet-preferred-address-types=InternalIP,Hostname",
                    # An aggregated API (a metrics adapter) is reached at its endpoint's address:
                    # no kube-proxy routes service IPs here.
                    "--enable-aggregator-routing=true",
                    # Endpoints may not point at loopback, so the reconciler would only log
                    # errors; nothing here runs pods that would use the kubernetes service.
                    "--endpoint-reconciler-type=none",
                    *self._extra_apiserver_args,
                ],
            )
            self._wait("kube-apiserver", deadline, lambda: self._api_ok("/readyz"))

            self.controller_manager_port = free_port()
            self._spawn(
                "kube-controller-manager",
                [
                    str(paths.kube_controller_manager),
                    f"--kubeconfig={self.kubeconfig}",
                    f"--authentication-kubeconfig={self.kubeconfig}",
                    f"--authorization-kubeconfig={self.kubeconfig}",
                    "--bind-address=127.0.0.1",
                    f"--secure-port={self.controller_manager_port}",
                    f"--cert-dir={work / 'controller-manager-certs'}",
                    "--leader-elect=false",
                    f"--service-account-private-key-file={pki / 'sa.key'}",
                    f"--root-ca-file={pki / 'ca.crt'}",
                    "--profiling=false",
                    # Its default is under /usr/libexec, which it would create.
                    f"--flex-volume-plugin-dir={work / 'flexvolume'}",
                    *self._extra_kcm_args,
                ],
            )
            kcm_url = f"https://127.0.0.1:{self.controller_manager_port}/healthz"
            self._wait(
                "kube-controller-manager", deadline, lambda: self._http_ok(kcm_url, verify=False)
            )
            if self._wait_for_controllers:
                # The service-account controller creating "default" proves the controllers run
                # (and pods created before it exists would be rejected by admission).
                self._wait(
                    "kube-controller-manager",
                    deadline,
                    lambda: self._api_ok("/api/v1/namespaces/default/serviceaccounts/default"),
                    what="to create the default service account",
                )
        except BaseException:
            # Keep the folder: the error message points at the logs in it.
            self.stop(keep_workdir=True)
            raise
        self.start_seconds = round(time.monotonic() - started, 2)
        return self

    def stop(self, *, keep_workdir: bool | None = None) -> None:
        """Stop all three servers (controller-manager first) and remove the work folder.

        ``keep_workdir`` overrides the constructor's choice of keeping the folder.
        """
        if keep_workdir is None:
            keep_workdir = self._keep_workdir
        atexit.unregister(self.stop)
        for proc in reversed(self._processes):
            if proc.popen is not None:
                terminate(proc.popen, 15)
        self._processes.clear()
        if self._workdir is not None and not keep_workdir:
            shutil.rmtree(self._workdir, ignore_errors=True)
        self._workdir = None
        self._kubeconfig = None

    # -- clients ------------------------------------------------------------------------------

    def kubectl(
        self,
        *args: str,
        check: bool = True,
        input: str | None = None,
        timeout: float = 120.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this control plane; raise :class:`KubectlError` if ``check``."""
        cmd = [str(self.paths.kubectl), f"--kubeconfig={self.kubeconfig}", *args]
        result = subprocess.run(
            cmd, input=input, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and result.returncode != 0:
            raise KubectlError(args, result)
        return result

    def apply(self, manifest: str | Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> str:
        """``kubectl apply -f -`` for YAML text, one object or a list of objects."""
        if isinstance(manifest, str):
            text = manifest
        elif isinstance(manifest, Mapping):
            text = yaml.safe_dump(dict(manifest))
        else:
            text = yaml.safe_dump_all([dict(m) for m in manifest])
        return self.kubectl("apply", "-f", "-", input=text).stdout

    def get_json(self, *args: str) -> Any:
        """``kubectl get <args> -o json``, parsed."""
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def helm(
        self, *args: str, check: bool = True, timeout: float = 300.0
    ) -> subprocess.CompletedProcess[str]:
        """Run helm (built on first use) against this control plane; raise :class:`HelmError`."""
        cmd = [str(install_helm()), f"--kubeconfig={self.kubeconfig}", *args]
        result = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, check=False, env=self.env()
        )
        if check and result.returncode != 0:
            raise HelmError(args, result)
        return result

    # -- internals ----------------------------------------------------------------------------

    def _write_kubeconfig(self) -> None:
        ca = base64.b64encode(self.ca_file.read_bytes()).decode()
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "offtake-testbed",
                    "cluster": {"server": self.server, "certificate-authority-data": ca},
                }
            ],
            "users": [{"name": "offtake-admin", "user": {"token": self.token}}],
            "contexts": [
                {
                    "name": "offtake-testbed",
                    "context": {"cluster": "offtake-testbed", "user": "offtake-admin"},
                }
            ],
            "current-context": "offtake-testbed",
            "preferences": {},
        }
        self.kubeconfig.write_text(yaml.safe_dump(config, sort_keys=False))
        self.kubeconfig.chmod(0o600)

    def _spawn(self, name: str, args: list[str]) -> None:
        proc = _Process(name=name, args=args, log=self.log_file(name))
        with proc.log.open("ab") as log:
            proc.popen = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                start_new_session=True,
                preexec_fn=die_with_parent(),
            )
        self._processes.append(proc)

    def _ssl_context(self, verify: bool = True) -> ssl.SSLContext:
        if verify:
            return ssl.create_default_context(cafile=str(self.ca_file))
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context

    def _http_ok(self, url: str, *, verify: bool = True, token: bool = False) -> bool:
        request = urllib.request.Request(url)
        if token:
            request.add_header("Authorization", f"Bearer {self.token}")
        context = self._ssl_context(verify) if url.startswith("https") else None
        try:
            with urllib.request.urlopen(request, timeout=5, context=context) as response:
                return 200 <= int(response.status) < 300
        except (urllib.error.URLError, OSError, ssl.SSLError):
            return False

    def _api_ok(self, path: str) -> bool:
        return self._http_ok(f"{self.server}{path}", token=True)

    def _wait(
        self,
        name: str,
        deadline: float,
        ready: Callable[[], bool],
        *,
        what: str = "to become ready",
    ) -> None:
        proc = next(p for p in self._processes if p.name == name)
        assert proc.popen is not None
        delay = 0.05
        while True:
            code = proc.popen.poll()
            if code is not None:
                raise ControlPlaneError(
                    f"{name} exited with code {code} during start-up; log {proc.log}:\n"
                    f"{file_tail(proc.log, _LOG_TAIL_LINES)}"
                )
            if ready():
                return
            if time.monotonic() > deadline:
                raise ControlPlaneError(
                    f"timed out after {self._start_timeout:.0f} s waiting for {name} {what}; "
                    f"log {proc.log}:\n{file_tail(proc.log, _LOG_TAIL_LINES)}"
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)
