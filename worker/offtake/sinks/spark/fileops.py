"""Directory listing, delete and rename on the sink's path, from the worker.

File sinks swap a finished batch into place with a rename, which Spark's DataFrame API cannot
do. With an in-process session the worker uses Hadoop's FileSystem through the JVM, so every
scheme and credential configured for Spark (s3a, abfs, gs, hdfs) works; with Spark Connect there
is no JVM in the worker and pyarrow's filesystems do the same for local, s3, gs and hdfs paths.
"""

from __future__ import annotations

from typing import Any, Protocol


class FileOps(Protocol):
    def list_names(self, path: str) -> list[str]:
        """Names of the entries directly under ``path`` (empty if it does not exist)."""

    def exists(self, path: str) -> bool: ...

    def delete(self, path: str) -> None:
        """Delete a file or a directory tree; a missing path is not an error."""

    def rename(self, src: str, dst: str) -> None: ...


def join(base: str, name: str) -> str:
    return f"{base.rstrip('/')}/{name}"


class HadoopFileOps:
    """Hadoop FileSystem through py4j: the same filesystems and credentials Spark uses."""

    def __init__(self, session: Any) -> None:
        self._jvm = session._jvm
        self._conf = session._jsc.hadoopConfiguration()

    def _fs(self, path: str) -> tuple[Any, Any]:
        p = self._jvm.org.apache.hadoop.fs.Path(path)
        return p.getFileSystem(self._conf), p

    def list_names(self, path: str) -> list[str]:
        fs, p = self._fs(path)
        if not fs.exists(p):
            return []
        return [str(status.getPath().getName()) for status in fs.listStatus(p)]

    def exists(self, path: str) -> bool:
        fs, p = self._fs(path)
        return bool(fs.exists(p))

    def delete(self, path: str) -> None:
        fs, p = self._fs(path)
        if fs.exists(p) and not fs.delete(p, True):
            raise OSError(f"could not delete {path}")

    def rename(self, src: str, dst: str) -> None:
        fs, s = self._fs(src)
        _, d = self._fs(dst)
        if not fs.rename(s, d):
            raise OSError(f"could not rename {src} to {dst}")


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

    def rename(self, src: str, dst: str) -> None:
        fs, s = self._fs(src)
        _, d = self._fs(dst)
        fs.move(s, d)
