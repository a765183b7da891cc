"""The Spark Connect server that ships in the pyspark wheel, on a free loopback port.

Started with spark-submit and the server's class name (the wheel has its jar), in the
foreground of a child process this helper owns, so stop() ends exactly that process group.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from offtake.sinks.spark.cache import ivy_settings
from offtake_testbed.process import free_port

CONNECT_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


class ConnectServer:
    def __init__(
        self,
        master: str = "local[1]",
        conf: dict[str, str] | None = None,
        packages: tuple[str, ...] = (),
        home: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.master, self.conf, self.packages = master, dict(conf or {}), packages
        self.env = dict(env or {})  # e.g. SPARK_CONNECT_AUTHENTICATE_TOKEN
        self.home = home or spark_home()
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = Path(tempfile.mkstemp(prefix="offtake-connect-", suffix=".log")[1])
        self.started_seconds = 0.0

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    def start(self, timeout: float = 180.0) -> ConnectServer:
        # Started again after kill(): the same port, as a restarted pod behind its Service.
        self.port = self.port or free_port()
        cmd = [
            str(self.home / "bin" / "spark-submit"),
            "--class",
            CONNECT_CLASS,
            "--master",
            self.master,
            "--name",
            "offtake-test-connect",
            "--conf",
            f"spark.connect.grpc.binding.port={self.port}",
            "--conf",
            "spark.connect.grpc.binding.address=127.0.0.1",
            "--conf",
            "spark.ui.enabled=false",
        ]
        for k, v in self.conf.items():
            cmd += ["--conf", f"{k}={v}"]
        if self.packages:
            # Maven Central only, as the worker's sessions resolve (session.base_conf).
            cmd += ["--conf", f"spark.jars.ivySettings={ivy_settings()}"]
            cmd += ["--packages", ",".join(self.packages)]
        cmd.append("spark-internal")
        env = {**os.environ, "SPARK_HOME": str(self.home)}
        env.pop("SPARK_REMOTE", None)
        env.pop("SPARK_CONNECT_AUTHENTICATE_TOKEN", None)
        env.update(self.env)
        began = time.monotonic()
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        deadline = began + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"Spark Connect server exited: {self.tail()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    self.started_seconds = time.monotonic() - began
                    return self
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"Spark Connect server did not listen within {timeout}s: {self.tail()}")

    def tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def kill(self) -> None:
        """SIGKILL the server's process group (the JVM dies without a word to its clients)."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.proc = None
