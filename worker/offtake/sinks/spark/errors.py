"""What failed inside Spark: short, readable descriptions, and whether the sink was down.

A Py4J error's text is the whole Java stack trace, which makes logs and the DLQ's error
header unreadable, and its first line only says which call failed ("An error occurred while
calling o213.executeUpdate."); the Java exception chain's messages say what went wrong (the
database's own message, from its JDBC driver). Descriptions go through ``offtake.redact``: a
driver's message may quote its connection string.

``unavailable`` tells a sink that could not be reached (the database stopped, the Spark
Connect server gone) from a batch that failed for what it holds: the first is an outage the
sink waits out, never a reason to dead-letter records (chaos scenario 3).
"""

from __future__ import annotations

import re
from typing import Any

from offtake.formats.errors import RegistryUnavailable
from offtake.redact import redact

MAX_CHARS = 600


def describe(exc: BaseException) -> str:
    """``Type: message`` of the error and of up to two Java causes, on one line, without
    credentials."""
    return _clip(redact(_describe(exc)))


def _describe(exc: BaseException) -> str:
    java = getattr(exc, "java_exception", None)
    if java is not None:
        try:
            return _java_chain(java)
        except Exception:  # the JVM may be gone; fall back to the Python text
            pass
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    name = type(exc).__name__
    return f"{name}: {first}" if first else name


def _java_chain(java: Any) -> str:
    parts: list[str] = []
    seen = 0
    while java is not None and seen < 3:
        text = str(java.toString()).strip().splitlines()[0]
        if not parts or text not in parts[-1]:
            parts.append(text)
        java = java.getCause()
        seen += 1
    return " <- caused by ".join(parts)


def _clip(text: str) -> str:
    return text if len(text) <= MAX_CHARS else text[: MAX_CHARS - 3] + "..."


# Java exceptions that mean "could not reach the other side", wherever they sit in the chain.
_JAVA_UNREACHABLE = {
    "java.net.ConnectException",
    "java.net.SocketException",
    "java.net.SocketTimeoutException",
    "java.net.NoRouteToHostException",
    "java.io.EOFException",
}
# SQLSTATE classes of a database that is down rather than a statement that is wrong:
# 08 connection exceptions, 57P01-57P03 server shutting down / starting up (PostgreSQL);
# not 08P01, a protocol violation: what a statement the server cannot parse (a NUL byte in a
# name) answers, which waiting out would retry forever.
_SQLSTATE_DOWN = re.compile(r"^(08(?!P01)|57P0[123])")
# The same in the text of errors that arrive as strings (a Spark task's failure, a Connect
# server's gRPC status): the JDBC driver's and gRPC's own words for an unreachable peer.
_TEXT_DOWN = re.compile(
    r"java\.net\.(Connect|Socket|NoRouteToHost)Exception|Connection refused"
    r"|An I/O error occurred while sending to the backend"
    r"|terminating connection due to administrator command"
    r"|the database system is (shutting down|starting up|in recovery mode)"
    r"|StatusCode\.UNAVAILABLE|status = StatusCode\.UNAVAILABLE|failed to connect to all addresses"
)
_PYTHON_DOWN_NAMES = {"OperationalError"}  # psycopg's "connection failed" (Connect mode swap)
# Spark Connect error classes of a session the server no longer has (it restarted): the sink
# opens a new session and tries again.
_SESSION_GONE = {
    "NO_ACTIVE_SESSION",
    "INVALID_HANDLE.SESSION_CHANGED",
    "INVALID_HANDLE.SESSION_NOT_FOUND",
    "INVALID_HANDLE.SESSION_CLOSED",
}


def unavailable(exc: BaseException) -> str | None:
    """Why ``exc`` means the sink's far side is unreachable, or None if it does not."""
    seen = 0
    current: BaseException | None = exc
    while current is not None and seen < 8:
        # RegistryUnavailable: the schema registry the typed columns read (schema_columns).
        if isinstance(current, (ConnectionError, RegistryUnavailable)):
            return describe(current)
        if type(current).__name__ in _PYTHON_DOWN_NAMES and type(current).__module__.startswith(
            "psycopg"
        ):
            return describe(current)
        if _pyspark_down(current):
            return describe(current)
        java = getattr(current, "java_exception", None)
        if java is not None and _java_down(java):
            return describe(current)
        if _TEXT_DOWN.search(str(current)):
            return describe(current)
        current = current.__cause__ or current.__context__
        seen += 1
    return None


def refused_credentials(exc: BaseException) -> bool:
    """Whether ``exc`` is a Spark Connect server refusing the client's token (gRPC status
    UNAUTHENTICATED): neither an outage to wait out nor a fault of the batch. The Connect
    client does not retry it (its policy retries UNAVAILABLE), so it arrives at once."""
    seen = 0
    current: BaseException | None = exc
    while current is not None and seen < 8:
        for getter in ("getGrpcStatusCode", "code"):
            method = getattr(current, getter, None)
            if callable(method):
                try:
                    if getattr(method(), "name", None) == "UNAUTHENTICATED":
                        return True
                except Exception:
                    pass
        current = current.__cause__ or current.__context__
        seen += 1
    return False


def _pyspark_down(exc: BaseException) -> bool:
    """A grpc status UNAVAILABLE (grpc.RpcError, or pyspark's SparkConnectGrpcException that
    carries it), or a Spark Connect session the server forgot."""
    for getter in ("getGrpcStatusCode", "code"):
        method = getattr(exc, getter, None)
        if callable(method):
            try:
                if getattr(method(), "name", None) == "UNAVAILABLE":
                    return True
            except Exception:
                pass
    # getCondition since Spark 4.0 (getErrorClass is deprecated and warns).
    condition = getattr(exc, "getCondition", None) or getattr(exc, "getErrorClass", None)
    if callable(condition):
        try:
            return condition() in _SESSION_GONE
        except Exception:
            return False
    return False


def _java_down(java: Any) -> bool:
    try:
        seen = 0
        while java is not None and seen < 8:
            if str(java.getClass().getName()) in _JAVA_UNREACHABLE:
                return True
            state = _sql_state(java)
            if state and _SQLSTATE_DOWN.match(state):
                return True
            if _TEXT_DOWN.search(str(java.toString())):
                return True
            java = java.getCause()
            seen += 1
    except Exception:  # the JVM itself is gone: not this question's to answer
        return False
    return False


def _sql_state(java: Any) -> str | None:
    try:
        state = java.getSQLState()
    except Exception:  # not a java.sql.SQLException
        return None
    return str(state) if state is not None else None
