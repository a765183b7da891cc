"""Quick static checks of the Dockerfile and its build context (always run; the images
themselves are built and inspected by the opt-in test_image_build.py)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def stages() -> dict[str, tuple[str, list[str]]]:
    """Stage name -> (what it is FROM, its instruction lines, continuations joined)."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE)
    found: dict[str, tuple[str, list[str]]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.match(r"FROM\s+(\S+)\s+AS\s+(\S+)$", line, re.I)
        if m:
            current = []
            found[m.group(2)] = (m.group(1), current)
        elif current is not None:
            current.append(line)
    return found


def chain(name: str) -> list[str]:
    """The stage and the stages it is built FROM, nearest first."""
    all_stages = stages()
    names = [name]
    while all_stages[names[-1]][0] in all_stages:
        names.append(all_stages[names[-1]][0])
    return names


def lines_of(name: str) -> list[str]:
    """Every instruction that ends up in the stage: its own and those of the stages below it,
    plus what it copies from other stages (and what those are built from)."""
    all_stages = stages()
    out: list[str] = []
    for stage in chain(name):
        for line in all_stages[stage][1]:
            out.append(line)
            m = re.match(r"COPY\s+--from=(\S+)", line)
            if m and m.group(1) in all_stages:
                out += lines_of(m.group(1))
    return out


def test_the_three_targets_exist_and_the_plain_worker_is_the_default() -> None:
    names = list(stages())
    assert {"operator", "worker", "worker-spark"} <= set(names)
    assert names[-1] == "worker"


def test_the_base_is_pinned_by_a_digest_that_has_no_default() -> None:
    first_from = re.search(r"^FROM\s+(\S+)", DOCKERFILE, re.M)
    assert first_from is not None and first_from.group(1) == "${BASE_IMAGE}@${BASE_DIGEST}"
    assert re.search(r"^ARG BASE_DIGEST$", DOCKERFILE, re.M)
    assert not re.search(r"^ARG BASE_DIGEST=", DOCKERFILE, re.M)
    # Every other FROM is a stage of this file: nothing else is pulled by tag.
    names = set(stages())
    for source, _ in stages().values():
        assert source in names or source == "${BASE_IMAGE}@${BASE_DIGEST}"


def test_every_target_runs_as_uid_10001() -> None:
    for target in ("operator", "worker", "worker-spark"):
        users = [line for line in stages()[target][1] if line.startswith("USER")]
        assert users[-1:] == ["USER 10001:10001"], target


def test_the_jre_and_pyspark_are_only_in_worker_spark() -> None:
    for target in ("operator", "worker"):
        text = "\n".join(lines_of(target))
        assert "openjdk" not in text and "[spark]" not in text, target
    spark = "\n".join(lines_of("worker-spark"))
    assert "openjdk-17-jre-headless" in spark and "[spark]" in spark
    assert "[operator]" not in spark
    assert "[operator]" in "\n".join(lines_of("operator"))


def test_the_test_bed_never_enters_the_build() -> None:
    ignore = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    # An allowlist: everything is excluded, then a few paths are let back in.
    assert ignore[0] == "*"
    allowed = [line[1:].rstrip("/") for line in ignore if line.startswith("!")]
    assert not any(p.startswith(("testbed", "tests", "bench")) for p in allowed)
    sources = [
        src
        for line in lines_of("build")
        if line.startswith("COPY") and "--from" not in line
        for src in line.split()[1:-1]
    ]
    assert sources and not any("testbed" in s or "tests" in s for s in sources)
    # pyproject's package find looks in testbed/ too: the wheel has no test bed only because
    # the folder is absent from the context.
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    where = setuptools["packages"]["find"]["where"]
    copied = {s.rstrip("/") for s in sources}
    assert {w for w in where if w in copied} == {"worker", "operator"}


def test_nothing_points_the_cache_at_the_read_only_image() -> None:
    """Pods run with a read-only root and HOME=/tmp: an OFFTAKE_CACHE baked into the image
    would send Spark's ivy cache to a read-only path."""
    assert "OFFTAKE_CACHE" not in "\n".join(
        line for line in DOCKERFILE.splitlines() if not line.startswith("#")
    )
    assert "HOME=/home/offtake" in DOCKERFILE


def test_worker_spark_ships_the_class_data_archive_of_its_own_jvm() -> None:
    """Made after the JRE and the venv are in place (an archive is valid only for the JVM and
    jars it was made with), as root before the switch to the worker's user, and found through
    OFFTAKE_SPARK_ARCHIVES (the worker's home cache is not in the image)."""
    spark = lines_of("worker-spark")
    text = "\n".join(spark)
    assert "ENV OFFTAKE_SPARK_ARCHIVES=/opt/offtake/spark-archives" in text

    def at(fragment: str) -> int:
        return next(i for i, line in enumerate(spark) if fragment in line)

    made = at("offtake spark-archive")
    assert at("openjdk-17-jre-headless") < made
    assert at("COPY --from=worker-spark-venv") < made < at("USER 10001:10001")
    assert at("ENV OFFTAKE_SPARK_ARCHIVES") < made
