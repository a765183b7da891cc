"""Running the swap transaction of the JDBC sink against the database.

Spark writes a batch into a staging table; the swap (delete the batch's earlier copy, insert
the staged rows, commit) needs one plain database connection from the worker. With an
in-process session that is the JVM's ``java.sql.DriverManager`` and the driver Spark loaded
from Maven, so any JDBC database works; with Spark Connect (no JVM here) PostgreSQL URLs go
through psycopg.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qsl, urlsplit

from offtake import environment
from offtake.config.secret_env import JDBC_PASSWORD_ENV, read_secret_env
from offtake.config.spec import JdbcSpec
from offtake.errors import OfftakeError
from offtake.redact import redact
from offtake.sinks.spark.errors import describe

# libpq understands these URI parameters; JDBC-only ones (currentSchema, ssl=true...) it rejects.
_LIBPQ_PARAMS = {"sslmode", "connect_timeout", "application_name", "options", "sslrootcert"}

Param = str | int

# Driver classes by URL prefix. Naming the class lets Spark and the worker load it from the
# session's classloader (where spark.jars.packages puts it); java.sql.DriverManager alone does
# not see drivers there and answers "No suitable driver".
DRIVERS = {
    "jdbc:postgresql:": "org.postgresql.Driver",
    "jdbc:mysql:": "com.mysql.cj.jdbc.Driver",
    "jdbc:mariadb:": "org.mariadb.jdbc.Driver",
    "jdbc:sqlserver:": "com.microsoft.sqlserver.jdbc.SQLServerDriver",
    "jdbc:oracle:": "oracle.jdbc.OracleDriver",
    "jdbc:db2:": "com.ibm.db2.jcc.DB2Driver",
    "jdbc:h2:": "org.h2.Driver",
    "jdbc:sqlite:": "org.sqlite.JDBC",
}


def driver_class(url: str) -> str | None:
    for prefix, cls in DRIVERS.items():
        if url.startswith(prefix):
            return cls
    return None


class JdbcError(OfftakeError):
    """The JDBC sink's settings or the swap failed; the message names the field or batch."""


class Statements(Protocol):
    """Runs statements in one transaction: all are committed, or none is."""

    def transaction(self, statements: Sequence[tuple[str, Sequence[Param]]]) -> list[int]:
        """Execute each (sql, params) in order inside one transaction; rows affected each."""

    def execute(self, sql: str) -> None:
        """One statement outside any transaction (auto-commit)."""

    def tables(self, schema: str | None, prefix: str) -> list[str]:
        """Names of the tables in ``schema`` (the connection's own when None) whose name
        starts with ``prefix``, compared case-insensitively (databases fold unquoted names)."""


#: Where the operator mounts ``jdbc.secretRef`` (OFFTAKE_JDBC_SECRET_DIR overrides it).
SECRET_DIR = "/etc/offtake/jdbc-secret"
#: The Secret's key for the user name: ``user``, or ``username`` as database operators
#: (CloudNativePG, Zalando, Crunchy) write it.
_USER_KEYS = ("user", "username")


def _read_key(path: Path) -> str | None:
    try:
        # strip: a Secret made with `echo` ends in a newline the database would refuse.
        return path.read_text().strip()
    except (FileNotFoundError, NotADirectoryError):
        return None


def secret_credentials(directory: str | None = None) -> dict[str, str]:
    """``user`` and ``password`` from the mounted ``jdbc.secretRef`` (one file per key)."""
    path = environment.directory(environment.JDBC_SECRET_DIR_ENV, SECRET_DIR, directory)
    out: dict[str, str] = {}
    user = next((v for k in _USER_KEYS if (v := _read_key(path / k)) is not None), None)
    if user is not None:
        out["user"] = user
    password = _read_key(path / "password")
    if password is not None:
        out["password"] = password
    return out


def credentials(spec: JdbcSpec, secret_dir: str | None = None) -> dict[str, str]:
    """Connection properties: the user from the spec, else from the Secret the operator
    mounts for ``jdbc.secretRef``; the password from that Secret or from
    ``$OFFTAKE_JDBC_PASSWORD`` (``jdbc.passwordSecretRef``, never inline); and the driver
    class when the URL names a known database."""
    out: dict[str, str] = {}
    driver = driver_class(spec.url)
    if driver:
        out["driver"] = driver
    mounted = secret_credentials(secret_dir) if spec.secret_ref is not None else {}
    user = spec.user or mounted.get("user")
    password = mounted.get("password")
    if spec.password_secret_ref is not None:
        password = read_secret_env(JDBC_PASSWORD_ENV, "sink.spark.jdbc.passwordSecretRef")
    if user:
        out["user"] = user
    if password:
        out["password"] = password
    return out


class JvmStatements:
    """java.sql through py4j, using the JDBC driver on the session's classpath."""

    def __init__(self, session: Any, spec: JdbcSpec) -> None:
        self._jvm = session._jvm
        self._url = spec.url
        self._props = credentials(spec)

    def _connect(self) -> Any:
        props = self._jvm.java.util.Properties()
        for k, v in self._props.items():
            if k != "driver":
                props.setProperty(k, v)
        try:
            cls = self._props.get("driver")
            if cls is None:
                return self._jvm.java.sql.DriverManager.getConnection(self._url, props)
            target: Any = self._jvm
            for part in cls.split("."):
                target = getattr(target, part)
            conn = target().connect(self._url, props)
            if conn is None:
                raise JdbcError(f"driver {cls} does not accept this URL")
            return conn
        except Exception as exc:
            raise JdbcError(
                f"sink.spark.jdbc.url: cannot connect to {redact(self._url)}: {describe(exc)}"
            ) from exc

    def transaction(self, statements: Sequence[tuple[str, Sequence[Param]]]) -> list[int]:
        conn = self._connect()
        try:
            conn.setAutoCommit(False)
            counts: list[int] = []
            for sql, params in statements:
                ps = conn.prepareStatement(sql)
                try:
                    for i, p in enumerate(params, start=1):
                        if isinstance(p, int):
                            ps.setLong(i, p)
                        else:
                            ps.setString(i, p)
                    counts.append(int(ps.executeUpdate()))
                finally:
                    ps.close()
            conn.commit()
            return counts
        except BaseException:
            conn.rollback()
            raise
        finally:
            conn.close()

    def execute(self, sql: str) -> None:
        conn = self._connect()
        try:
            st = conn.createStatement()
            st.execute(sql)
            st.close()
        finally:
            conn.close()

    def tables(self, schema: str | None, prefix: str) -> list[str]:
        conn = self._connect()
        try:
            # Any JDBC database answers DatabaseMetaData; filtering here, not with a LIKE
            # pattern, because '_' is a wildcard there and name case differs by database.
            found = conn.getMetaData().getTables(None, schema or conn.getSchema(), "%", None)
            names: list[str] = []
            while found.next():
                name = str(found.getString("TABLE_NAME"))
                if name.lower().startswith(prefix.lower()):
                    names.append(name)
            found.close()
            return names
        finally:
            conn.close()


class PsycopgStatements:
    """psycopg for jdbc:postgresql URLs, where the worker has no JVM (Spark Connect)."""

    def __init__(self, spec: JdbcSpec) -> None:
        if not spec.url.startswith("jdbc:postgresql://"):
            raise JdbcError(
                f"sink.spark.jdbc.url: {redact(spec.url)}: with Spark Connect only "
                "jdbc:postgresql:// URLs are supported (the swap needs a connection from the "
                "worker)"
            )
        parts = urlsplit(spec.url[len("jdbc:") :])
        query = dict(parse_qsl(parts.query))
        self._kwargs: dict[str, Any] = {
            "host": parts.hostname or "localhost",
            "port": parts.port or 5432,
            "dbname": parts.path.lstrip("/") or "postgres",
        }
        self._kwargs.update({k: v for k, v in query.items() if k in _LIBPQ_PARAMS})
        if "user" in query:
            self._kwargs["user"] = query["user"]
        if "password" in query:
            self._kwargs["password"] = query["password"]
        self._kwargs.update({k: v for k, v in credentials(spec).items() if k != "driver"})

    def _connect(self) -> Any:
        import psycopg

        return psycopg.connect(**self._kwargs)

    def transaction(self, statements: Sequence[tuple[str, Sequence[Param]]]) -> list[int]:
        counts: list[int] = []
        with self._connect() as conn, conn.transaction(), conn.cursor() as cur:
            for sql, params in statements:
                cur.execute(sql.replace("?", "%s"), tuple(params))
                counts.append(cur.rowcount)
        return counts

    def execute(self, sql: str) -> None:
        with self._connect() as conn:
            conn.autocommit = True
            conn.execute(sql)

    def tables(self, schema: str | None, prefix: str) -> list[str]:
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = COALESCE(%s, current_schema())",
                (schema,),
            ).fetchall()
        return [str(r[0]) for r in rows if str(r[0]).lower().startswith(prefix.lower())]
