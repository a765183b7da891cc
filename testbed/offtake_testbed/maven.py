"""Java and Maven for the test bed's JVM services (Kafka, Apicurio Registry): finding ``java``,
and running Maven with its downloads reported as they go."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import ClassVar

from ._cache import Progress, megabytes
from .process import tail

__all__ = ["find_java", "maven_errors", "run_maven"]

# Maven 3.8 still emits colour resets in batch mode; they would garble our error messages.
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
_MAVEN_ADVICE = re.compile(
    r"^\[ERROR\]\s*$|re-run Maven|-e switch|-X switch|please read|\[Help 1\] http"
)


def find_java(error: type[Exception]) -> str:
    """The ``java`` of ``$JAVA_HOME``, else the one on PATH; raises ``error`` without one."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").is_file():
        return str(Path(java_home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise error("java not found on PATH (Kafka 4 needs Java 17+; or set JAVA_HOME)")
    return java


def run_maven(
    command: list[str], work: Path, say: Progress, timeout: float
) -> tuple[int | None, str]:
    """Run Maven in ``work``, reporting its downloads as they go; (exit code, output), the
    exit code None when it ran past ``timeout`` seconds and was killed."""
    process = subprocess.Popen(
        command,
        cwd=work,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    # A timer rather than a deadline check per line: a stalled download prints nothing.
    expired = threading.Event()

    def give_up() -> None:
        expired.set()
        process.kill()

    watchdog = threading.Timer(timeout, give_up)
    watchdog.start()
    counter = _DownloadCounter(say)
    lines: list[str] = []
    try:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            counter.feed(line)
        code = process.wait()
    finally:
        watchdog.cancel()
    counter.report(final=True)
    return (None if expired.is_set() else code), "".join(lines)


class _DownloadCounter:
    """Counts Maven's "Downloaded from" lines; reports every few seconds while it downloads."""

    _EVERY_S = 5.0
    _DOWNLOADED = re.compile(r"Downloaded from \S+: \S+ \(([\d.]+) (B|kB|MB|GB)")
    _UNITS: ClassVar[dict[str, int]] = {"B": 1, "kB": 1_000, "MB": 1_000_000, "GB": 1_000_000_000}

    def __init__(self, say: Progress) -> None:
        self.say = say
        self.files = 0
        self.bytes = 0.0
        self.started = time.monotonic()
        self.last_report = self.started

    def feed(self, line: str) -> None:
        found = self._DOWNLOADED.search(_ANSI_ESCAPE.sub("", line))
        if found is None:
            return
        self.files += 1
        self.bytes += float(found.group(1)) * self._UNITS[found.group(2)]
        if time.monotonic() - self.last_report >= self._EVERY_S:
            self.report(final=False)

    def report(self, *, final: bool) -> None:
        self.last_report = time.monotonic()
        if not self.files and final:
            self.say.say("Maven found every file in its local repository (cache), nothing fetched")
            return
        self.say.say(
            f"Maven {'downloaded' if final else 'has downloaded'} {self.files} files "
            f"({megabytes(int(self.bytes))}) in {self.last_report - self.started:.0f} s"
        )


def maven_errors(output: str) -> str:
    """Maven's own error lines without colour codes and the generic "re-run with -X" advice."""
    lines = _ANSI_ESCAPE.sub("", output).splitlines()
    errors = [
        line for line in lines if line.startswith("[ERROR]") and not _MAVEN_ADVICE.search(line)
    ]
    return "\n".join(errors).strip() or tail("\n".join(lines), 40)
