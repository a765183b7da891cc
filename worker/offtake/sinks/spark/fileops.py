"""Directory listing, delete and rename on the sink's path, from the worker.

File sinks move a finished batch's files into place with renames, which Spark's DataFrame API
cannot do. With an in-process session the worker uses Hadoop's FileSystem through the JVM, so
every scheme and credential configured for Spark (s3a, abfs, gs, hdfs) works; with Spark
Connect there is no JVM in the worker and pyarrow's filesystems do the same for local, s3, gs
and hdfs paths.

Hadoop's local filesystem writes a hidden ``.<name>.crc`` beside every file and renames it
along with the file. Those must not reach the table: Polars refuses a directory whose files
have different extensions, and DuckDB's ``**`` glob reads every file it finds. So files are
moved through the raw filesystem under the checksummed one; the checksums stay behind in the
staging folder and are deleted with it.
"""

from __future__ import annotations

import os
from typing import Any, Protocol


class FileOps(Protocol):
    def list_names(self, path: str) -> list[str]:
        """Names of the entries directly under ``path`` (empty if it does not exist)."""

    def walk(self, path: str) -> list[str]:
        """Files under ``path``, as paths relative to it, recursively; names that start with
        '_' or '.' (files and folders) are skipped, as Spark and pyarrow skip them."""

    def exists(self, path: str) -> bool: ...

    def delete(self, path: str) -> None:
        """Delete a file or a directory tree; a missing path is not an error."""

    def move_file(self, src: str, dst: str) -> None:
        """Move one file to ``dst`` (its folder is created); fails if ``dst`` exists."""


def join(base: str, name: str) -> str:
    return f"{base.rstrip('/')}/{name}"


def hidden(name: str) -> bool:
    """Names Spark, pyarrow and pandas skip when they read a folder."""
    return name.startswith(("_", "."))


def split_parent(path: str) -> tuple[str, str] | None:
    """``(parent, name)`` of a table path, or None when the path has no parent the sink may
    write beside it: a bucket or filesystem root, or a local mount point (a folder on
    another filesystem, where a rename would be a copy)."""
    base = path.rstrip("/") or path  # "/" stays itself, never "" (the working directory)
    scheme, sep, after = base.partition("://")
    if sep:
        authority, _, key = after.partition("/")
        if "/" not in key.strip("/"):
            if not key:
                return None  # s3a://bucket: the bucket itself
            return f"{scheme}://{authority}" + ("/" if not authority else ""), key
        parent, _, name = base.rpartition("/")
        return parent, name
    local = os.path.abspath(base)
    parent, name = os.path.split(local)
    if not name or (os.path.exists(local) and os.path.ismount(local)):
        return None
    return parent, name


class HadoopFileOps:
    """Hadoop FileSystem through py4j: the same filesystems and credentials Spark uses."""

    def __init__(self, session: Any) -> None:
        self._jvm = session._jvm
        self._conf = session._jsc.hadoopConfiguration()
        self._checksummed = self._jvm.java.lang.Class.forName(
            "org.apache.hadoop.fs.ChecksumFileSystem"
        )

    def _fs(self, path: str) -> tuple[Any, Any]:
        p = self._jvm.org.apache.hadoop.fs.Path(path)
        return p.getFileSystem(self._conf), p

    def list_names(self, path: str) -> list[str]:
        fs, p = self._fs(path)
        if not fs.exists(p):
            return []
        return [str(status.getPath().getName()) for status in fs.listStatus(p)]

    def walk(self, path: str) -> list[str]:
        fs, root = self._fs(path)
        if not fs.exists(root):
            return []
        out: list[str] = []
        todo: list[tuple[Any, str]] = [(root, "")]
        while todo:
            folder, rel = todo.pop()
            for status in fs.listStatus(folder):
                name = str(status.getPath().getName())
                if hidden(name):
                    continue
                if status.isDirectory():
                    todo.append((status.getPath(), f"{rel}{name}/"))
                else:
                    out.append(f"{rel}{name}")
        return sorted(out)

    def exists(self, path: str) -> bool:
        fs, p = self._fs(path)
        return bool(fs.exists(p))

    def delete(self, path: str) -> None:
        fs, p = self._fs(path)
        if fs.exists(p) and not fs.delete(p, True):
            raise OSError(f"could not delete {path}")

    def move_file(self, src: str, dst: str) -> None:
        fs, s = self._fs(src)
        _, d = self._fs(dst)
        if self._checksummed.isInstance(fs):
            fs = fs.getRawFileSystem()  # leave the .crc behind (see the module docstring)
        parent = d.getParent()
        if parent is not None and not fs.exists(parent):
            fs.mkdirs(parent)
        if fs.exists(d):
            raise OSError(f"could not move {src} to {dst}: the target exists")
        if not fs.rename(s, d):
            raise OSError(f"could not move {src} to {dst}")


class ArrowFileOps:
    """pyarrow filesystems, for Spark Connect where the worker has no JVM."""

    def __init__(self) -> None:
        import pyarrow.fs as pafs

        self._pafs = pafs

    def _fs(self, path: str) -> tuple[Any, str]:
        uri = path
        for hadoop, arrow in (("s3a://", "s3://"), ("s3n://", "s3://"), ("gcs://", "gs://")):
            if uri.startswith(hadoop):
                uri = arrow + uri[len(hadoop) :]
        if "://" not in uri:
            return self._pafs.LocalFileSystem(), uri
        fs, inner = self._pafs.FileSystem.from_uri(uri)
        return fs, inner

    def list_names(self, path: str) -> list[str]:
        fs, p = self._fs(path)
        infos = fs.get_file_info(self._pafs.FileSelector(p, allow_not_found=True))
        return [str(info.base_name) for info in infos]

    def walk(self, path: str) -> list[str]:
        fs, root = self._fs(path)
        out: list[str] = []
        todo = [(root, "")]
        while todo:
            folder, rel = todo.pop()
            selector = self._pafs.FileSelector(folder, allow_not_found=True)
            for info in fs.get_file_info(selector):
                name = str(info.base_name)
                if hidden(name):
                    continue
                if info.type == self._pafs.FileType.Directory:
                    todo.append((info.path, f"{rel}{name}/"))
                else:
                    out.append(f"{rel}{name}")
        return sorted(out)

    def exists(self, path: str) -> bool:
        fs, p = self._fs(path)
        return bool(fs.get_file_info(p).type != self._pafs.FileType.NotFound)

    def delete(self, path: str) -> None:
        fs, p = self._fs(path)
        info = fs.get_file_info(p)
        if info.type == self._pafs.FileType.Directory:
            fs.delete_dir(p)
        elif info.type != self._pafs.FileType.NotFound:
            fs.delete_file(p)
            # A file moved in by Hadoop's local filesystem in local mode may have a checksum
            # beside it; a stale one would fail Hadoop's read of a later file of that name.
            if isinstance(fs, self._pafs.LocalFileSystem):
                folder, name = os.path.split(p)
                crc = os.path.join(folder, f".{name}.crc")
                if os.path.exists(crc):
                    fs.delete_file(crc)

    def move_file(self, src: str, dst: str) -> None:
        fs, s = self._fs(src)
        _, d = self._fs(dst)
        if fs.get_file_info(d).type != self._pafs.FileType.NotFound:
            raise OSError(f"could not move {src} to {dst}: the target exists")
        fs.create_dir(d.rpartition("/")[0], recursive=True)
        fs.move(s, d)
