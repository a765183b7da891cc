"""A Spark standalone cluster: one master and N workers, each a JVM of its own, from the jars
that ship in the pyspark wheel (``spark-class``, as Spark's own ``sbin/start-*.sh`` run them).

Jobs submitted to it (here through a Spark Connect server whose master is this cluster) run
their tasks on executors: JVMs that the workers start for each application, apart from the
driver. That is what a user who outgrows one machine runs, and what ``local[*]`` never
exercises: tasks serialised to another JVM, executors lost mid-job and their tasks retried
elsewhere. Loopback only; the master's JSON endpoint (its web UI's ``/json/``) says when the
workers have registered and which executors an application holds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Self

from ._service import Service
from .process import descendants, file_tail, free_port, pid_alive

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


class SparkClusterError(RuntimeError):
    """The cluster did not start (a JVM exited, or the workers never registered)."""


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


class StandaloneCluster(Service):
    """``workers`` Spark workers of ``cores`` cores and ``memory`` each behind one master."""

    def __init__(
        self, workers: int = 2, cores: int = 1, memory: str = "1g", home: Path | None = None
    ) -> None:
        self.workers, self.cores, self.memory = workers, cores, memory
        self.home = home or spark_home()
        self.root = Path(tempfile.mkdtemp(prefix="offtake-spark-cluster-"))
        self.port = 0
        self.ui_port = 0
        self.procs: list[subprocess.Popen[bytes]] = []
        self.started_seconds = 0.0

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _spawn(self, name: str, cls: str, *args: str) -> None:
        env = {
            **os.environ,
            "SPARK_HOME": str(self.home),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(self.root / "logs"),
            # The worker's JVM itself needs little; executors get spark.executor.memory.
            "SPARK_DAEMON_MEMORY": "512m",
        }
        with (self.root / f"{name}.log").open("wb") as log:
            self.procs.append(
                subprocess.Popen(
                    [str(self.home / "bin" / "spark-class"), cls, *args],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                )
            )

    def start(self, timeout: float = 180.0) -> Self:
        began = time.monotonic()
        self.port, self.ui_port = free_port(), 0
        self.ui_port = free_port({self.port})
        self._spawn(
            "master",
            MASTER_CLASS,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--webui-port",
            str(self.ui_port),
        )
        taken = {self.port, self.ui_port}
        for i in range(self.workers):
            ui = free_port(taken)
            taken.add(ui)
            work = self.root / f"worker-{i}"
            work.mkdir()
            self._spawn(
                f"worker-{i}",
                WORKER_CLASS,
                "--host",
                "127.0.0.1",
                "--webui-port",
                str(ui),
                "--cores",
                str(self.cores),
                "--memory",
                self.memory,
                "--work-dir",
                str(work),
                self.master_url,
            )
        deadline = began + timeout
        while time.monotonic() < deadline:
            for i, proc in enumerate(self.procs):
                if proc.poll() is not None:
                    name = "master" if i == 0 else f"worker-{i - 1}"
                    self.stop()
                    raise SparkClusterError(
                        f"the Spark {name} exited: {file_tail(self.root / f'{name}.log', 30)}"
                    )
            state = self.state()
            alive = [w for w in state.get("workers", []) if w.get("state") == "ALIVE"]
            if len(alive) >= self.workers:
                self.started_seconds = time.monotonic() - began
                return self
            time.sleep(0.5)
        log = file_tail(self.root / "master.log", 30)
        self.stop()
        raise SparkClusterError(
            f"{self.workers} Spark workers did not register in {timeout}s: {log}"
        )

    def state(self) -> dict[str, Any]:
        """The master's view (workers, applications), or {} while it does not answer yet."""
        try:
            url = f"http://127.0.0.1:{self.ui_port}/json/"
            with urllib.request.urlopen(url, timeout=2) as answer:
                return json.loads(answer.read())  # type: ignore[no-any-return]
        except (OSError, ValueError):
            return {}

    def executors(self) -> list[int]:
        """Process ids of the live executor JVMs the workers started (any application's)."""
        found = []
        for pid in descendants([p.pid for p in self.procs[1:]]):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if EXECUTOR_CLASS.encode() in cmdline and pid_alive(pid):
                found.append(pid)
        return sorted(found)

    def log(self, name: str, lines: int = 40) -> str:
        return file_tail(self.root / f"{name}.log", lines)

    def stop(self) -> None:
        # Workers first (they end their executors), then the master.
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        self.procs = []
