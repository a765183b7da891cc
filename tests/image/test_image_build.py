"""Build the Dockerfile's targets as OCI images without a Docker engine and look inside.

scripts/build-image.sh builds them with buildah (vfs storage, chroot isolation) over a Debian
bookworm base it makes with mmdebstrap, pinned by that base's digest. Each image is then run
two ways: with `buildah run` (the image's own user, environment and PATH), and as a pod with
the chart's and the operator's security settings would run it: read-only root filesystem, a
fresh writable /tmp, uid 10001, HOME=/tmp (unshare + chroot).

Opt-in (minutes): OFFTAKE_IMAGE_TESTS=1 pytest -p no:cacheprovider -q tests/image
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.image

ROOT = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
TARGETS = os.environ.get("OFFTAKE_IMAGE_TARGETS", "operator worker").split()
CACHE = Path(os.environ.get("OFFTAKE_CACHE", Path.home() / ".cache" / "offtake"))
BUILDAH = [
    "buildah",
    "--root",
    str(CACHE / "containers" / "storage"),
    "--runroot",
    str(CACHE / "containers" / "run"),
    "--storage-driver",
    "vfs",
]


def image_name(target: str) -> str:
    return f"localhost/offtake-{target}:{VERSION}"


@pytest.fixture(scope="module")
def oci_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Builds every target once (the script's own cache keeps the base between runs)."""
    if os.geteuid() != 0:
        pytest.fail("the image tests build with buildah as root (chroot isolation)")
    out = tmp_path_factory.mktemp("oci")
    if os.environ.get("OFFTAKE_IMAGE_REUSE") == "1":
        # Inspect what the last build left in buildah's storage (re-running the checks only).
        for target in TARGETS:
            subprocess.run(
                [
                    *BUILDAH,
                    "push",
                    "--quiet",
                    image_name(target),
                    f"oci:{out}/offtake-{target}:{VERSION}",
                ],
                check=True,
            )
        return out
    argv = ["bash", str(ROOT / "scripts" / "build-image.sh"), "--oci-dir", str(out)]
    for target in TARGETS:
        argv += ["--target", target]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=3000, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    print(done.stdout[-2000:])
    return out


@pytest.fixture(params=TARGETS)
def target(request: pytest.FixtureRequest, oci_dir: Path) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def containers() -> Iterator[dict[str, str]]:
    """One working container per image, shared by the module's tests (under vfs each is a
    full copy of the image) and removed at the end."""
    made: dict[str, str] = {}
    yield made
    for name in made.values():
        subprocess.run([*BUILDAH, "rm", name], capture_output=True, check=False)


@pytest.fixture
def container(target: str, containers: dict[str, str]) -> str:
    """The target's working container (tests only write to /tmp and the probe in $HOME)."""
    if target not in containers:
        containers[target] = subprocess.run(
            [*BUILDAH, "from", "--quiet", "--pull-never", image_name(target)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    return containers[target]


def run_in(container: str, script: str) -> subprocess.CompletedProcess[str]:
    """`buildah run`: the image's configured user, environment and working directory."""
    return subprocess.run(
        [*BUILDAH, "run", "--isolation", "chroot", container, "--", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


POD_HOSTS = "127.0.0.1\tlocalhost\n::1\tlocalhost\n127.0.0.1\tofftake-pod\n"


def run_as_pod(container: str, script: str, files: dict[str, Path] | None = None) -> str:
    """Run `script` the way the rendered pods run the image: the root filesystem read-only,
    an empty writable /tmp (the pods' emptyDir), uid/gid 10001, HOME=/tmp (the operator sets
    it), a hostname of its own that /etc/hosts resolves (the kubelet writes that file).
    `files` are copied into /tmp first. Returns stdout; fails the test on a non-zero exit."""
    rootfs = subprocess.run(
        [*BUILDAH, "mount", container], capture_output=True, text=True, check=True
    ).stdout.strip()
    copies = "".join(
        f'cp {shlex.quote(str(src))} "$r/tmp/{name}" && chown 10001:10001 "$r/tmp/{name}" && '
        for name, src in (files or {}).items()
    )
    inner = (
        "env -i PATH=/opt/offtake/bin:/usr/local/bin:/usr/bin:/bin HOME=/tmp LANG=C.UTF-8 "
        f"sh -c {shlex.quote(script)}"
    )
    setup = (
        "set -e; r=$(mktemp -d); h=$(mktemp); "
        f'printf {shlex.quote(POD_HOSTS)} >"$h"; chmod 644 "$h"; hostname offtake-pod; '
        f'mount --bind {shlex.quote(rootfs)} "$r"; '
        # The mount point for the kubelet's /etc/hosts, made in this throwaway container.
        'test -e "$r/etc/hosts" || touch "$r/etc/hosts"; '
        'mount -o remount,bind,ro "$r"; '
        'mount --bind "$h" "$r/etc/hosts"; '
        'mount -t tmpfs -o mode=1777 tmpfs "$r/tmp"; '
        'mount -t proc proc "$r/proc"; '
        'mount --rbind /dev "$r/dev"; '
        f"{copies}"
        f'exec chroot --userspec=10001:10001 "$r" {inner}'
    )
    try:
        done = subprocess.run(
            ["unshare", "--mount", "--uts", "--fork", "sh", "-c", setup],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    finally:
        subprocess.run([*BUILDAH, "umount", container], capture_output=True, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def test_the_image_runs_as_uid_10001_with_a_writable_cache_in_its_home(container: str) -> None:
    done = run_in(
        container,
        'id -u; id -g; echo "$HOME"; touch "$HOME/.cache/offtake/probe" && echo writable',
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["10001", "10001", "/home/offtake", "writable"], done.stderr


def test_the_image_config_names_the_user_and_a_command(target: str) -> None:
    out = subprocess.run(
        [*BUILDAH, "inspect", "--type", "image", image_name(target)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    config = json.loads(out)["OCIv1"]["config"]
    assert config["User"] == "10001:10001"
    expected = ["offtake-operator"] if target == "operator" else ["offtake", "worker"]
    assert config["Cmd"][: len(expected)] == expected


def test_offtake_runs_inside(container: str, target: str) -> None:
    done = run_in(container, "offtake --version && offtake-operator --help >/dev/null; echo $?")
    assert done.stdout.splitlines()[0] == f"offtake {VERSION}", done.stderr
    # The operator's entry point is in every wheel, but only the operator image has kopf.
    assert done.stdout.splitlines()[1] == ("0" if target == "operator" else "1")


def test_nothing_of_the_test_bed_is_inside(container: str) -> None:
    rootfs = subprocess.run(
        [*BUILDAH, "mount", container], capture_output=True, text=True, check=True
    ).stdout.strip()
    try:
        found = [
            str(Path(folder, name).relative_to(rootfs))
            for folder, dirs, files in os.walk(rootfs)
            for name in dirs + files
            if "testbed" in name.lower()
        ]
        site = next(Path(rootfs, "opt", "offtake", "lib").glob("python3*/site-packages"))
        ours = sorted(p.name for p in site.iterdir() if p.name.startswith("offtake"))
        record = next(site.glob("offtake-*.dist-info/RECORD")).read_text()
    finally:
        subprocess.run([*BUILDAH, "umount", container], capture_output=True, check=False)
    assert found == []
    # Offtake's own distributions only: no tests, no pytest plugin of ours, no source tree.
    assert set(ours) <= {
        "offtake",
        "offtake_operator",
        "offtake_examples",
        f"offtake-{VERSION}.dist-info",
        f"offtake_examples-{VERSION}.dist-info",
    }
    assert "testbed" not in record and "pytest_plugin" not in record
    done = run_in(container, "python3 -c 'import offtake_testbed'")
    assert "No module named 'offtake_testbed'" in done.stderr


def test_java_and_spark_only_in_worker_spark(container: str, target: str) -> None:
    probe = (
        "command -v java >/dev/null && echo java || echo no-java; "
        "test -d /usr/lib/jvm && echo jvm-dir || echo no-jvm-dir; "
        "for m in pyspark kopf offtake_examples; do "
        'python3 -c "import $m" 2>/dev/null && echo $m || echo no-$m; done'
    )
    done = run_in(container, probe)
    assert done.returncode == 0, done.stderr
    expected = {
        "operator": ["no-java", "no-jvm-dir", "no-pyspark", "kopf", "no-offtake_examples"],
        "worker": ["no-java", "no-jvm-dir", "no-pyspark", "no-kopf", "offtake_examples"],
        "worker-spark": ["java", "jvm-dir", "pyspark", "no-kopf", "offtake_examples"],
    }[target]
    assert done.stdout.split() == expected


def test_it_runs_with_a_read_only_root_and_only_tmp_writable(container: str, target: str) -> None:
    if target == "operator":
        # The operator's whole import graph (kopf included) loads without writing anywhere.
        out = run_as_pod(
            container,
            "touch /opt/x 2>/dev/null && echo root-writable; "
            "python3 -c 'import offtake_operator.handlers, offtake_operator.main' && echo imported",
        )
        assert out.split() == ["imported"]
        return
    out = run_as_pod(
        container,
        "touch /home/offtake/x 2>/dev/null && echo root-writable; "
        "offtake validate /tmp/pipeline.yaml",
        files={"pipeline.yaml": ROOT / "examples" / "kafka-to-kafka.yaml"},
    )
    assert "root-writable" not in out
    assert "/tmp/pipeline.yaml: ok" in out


@pytest.mark.parametrize("target", ["worker-spark"], indirect=True)
def test_spark_runs_as_a_pod_would_run_it(container: str, target: str) -> None:
    """A local SparkSession starts and counts with the root read-only: Ivy's cache (the
    session's spark.jars.ivy) and Spark's scratch go to /tmp, the pods' emptyDir."""
    if target not in TARGETS:
        pytest.skip("worker-spark is not in OFFTAKE_IMAGE_TARGETS")
    script = """
import os
from offtake.sinks.spark.cache import ivy_dir
from pyspark.sql import SparkSession
s = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
     .config("spark.jars.ivy", str(ivy_dir())).getOrCreate())
print(s.range(5).count(), ivy_dir())
s.stop()
"""
    out = run_as_pod(container, f"python3 -c {shlex.quote(script)}")
    assert out.split()[-2:] == ["5", "/tmp/.cache/offtake/ivy"]


def test_the_images_are_written_as_oci_layouts(oci_dir: Path, target: str) -> None:
    layout = oci_dir / f"offtake-{target}"
    assert json.loads((layout / "oci-layout").read_text())["imageLayoutVersion"] == "1.0.0"
    index = json.loads((layout / "index.json").read_text())
    [manifest_ref] = index["manifests"]
    assert manifest_ref["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    assert manifest_ref["annotations"]["org.opencontainers.image.ref.name"] == VERSION
    algo, digest = manifest_ref["digest"].split(":")
    manifest = json.loads((layout / "blobs" / algo / digest).read_text())
    algo, digest = manifest["config"]["digest"].split(":")
    config = json.loads((layout / "blobs" / algo / digest).read_text())
    assert config["config"]["User"] == "10001:10001"
