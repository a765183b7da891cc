"""The krew package of ``kubectl offtake``: the manifest krew reads, the archive
scripts/krew-package.sh builds, and the shim in it running the plugin."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_the_package_holds_the_shim_and_the_manifest_its_checksum(tmp_path: Path) -> None:
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "krew-package.sh"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    archive = tmp_path / "kubectl-offtake.tar.gz"
    manifest = yaml.safe_load((tmp_path / "offtake.yaml").read_text())
    assert manifest["kind"] == "Plugin" and manifest["metadata"]["name"] == "offtake"
    (platform,) = manifest["spec"]["platforms"]
    assert platform["sha256"] == hashlib.sha256(archive.read_bytes()).hexdigest()
    assert platform["bin"] == "kubectl-offtake"
    with tarfile.open(archive) as tar:
        assert [m.name for m in tar.getmembers()] == ["kubectl-offtake"]
        assert tar.getmember("kubectl-offtake").mode & 0o111, "executable"
        tar.extractall(tmp_path / "unpacked", filter="data")
    # The same shim, the same archive: a release can be checked against the manifest.
    again = subprocess.run(
        ["bash", str(ROOT / "scripts" / "krew-package.sh"), str(tmp_path / "again")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert again.returncode == 0
    assert (tmp_path / "again" / "kubectl-offtake.tar.gz").read_bytes() == archive.read_bytes()

    # The shim runs the plugin with the interpreter that has it, and says what to install
    # when none has.
    shim = str(tmp_path / "unpacked" / "kubectl-offtake")
    env = {**os.environ, "OFFTAKE_PYTHON": sys.executable}
    done = subprocess.run([shim, "status", "--help"], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: kubectl offtake status")
    bare = {"PATH": "/nonexistent", "OFFTAKE_PYTHON": "/nonexistent/python"}
    done = subprocess.run(["/bin/sh", shim, "status"], capture_output=True, text=True, env=bare)
    assert done.returncode == 1
    assert "pip install 'offtake[kubectl]'" in done.stderr
