"""Credentials out of text: one function for every URL and connection-string style.

Error messages and log lines quote URLs (a JDBC URL, an Iceberg ``catalogUri``, a Spark
Connect ``connectUrl``, a schema registry URL) and a database driver's own message may quote
its connection string. Whatever the style, the secret part is replaced by ``***`` and the rest
(scheme, host, port, database, user) kept, because that is what tells a reader which
connection failed:

- userinfo: ``scheme://user:pass@host`` (PostgreSQL, MySQL ``jdbc:mysql://user:pass@h/db``,
  Iceberg REST and SQL catalogs, HTTP), including ``scheme://:pass@host``;
- Oracle's ``jdbc:oracle:thin:user/pass@host:1521/svc`` (also ``oci``, ``@//host``);
- ``key=value`` properties after ``?``, ``&``, ``;`` or a space, whose key names a secret
  (see :func:`is_secret_key`): JDBC query parameters, SQL Server's
  ``jdbc:sqlserver://h;user=x;password=y;`` (a value in braces too), Spark Connect's
  ``sc://h:15002/;token=abc``, librdkafka's ``sasl.password=``.

It works on any text, not only on a bare URL, so a whole exception message can go through it.
This module imports nothing of Offtake's: every layer may use it (pyproject.toml's
import-linter layers put it at the bottom).
"""

from __future__ import annotations

import re

__all__ = ["MASK", "is_secret_key", "redact"]

MASK = "***"

# Key names (lowercased, separators removed) that are secrets wherever they appear.
_SECRET_EXACT = frozenset({"pwd", "pass", "sig", "jwt"})
# ... and parts that make any key a secret: trustStorePassword, ssl.keystore.password,
# client_secret, access_key, secret_key, X-Amz-Security-Token, sasl.password, apiKey.
_SECRET_PARTS = (
    "password",
    "passwd",
    "secret",
    "token",
    "credential",
    "apikey",
    "accesskey",
    "accountkey",
    "privatekey",
    "signature",
)

# scheme://[user]:password@ ; the password runs to the last '@' before the path, so a
# password holding an unencoded '@' is masked whole.
_USERINFO = re.compile(
    r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*://(?:[^\s:/@;?#]*)):(?P<secret>[^\s/?#]*)@"
)
# jdbc:oracle:thin:user/password@host (also oci and kprb drivers)
_ORACLE = re.compile(r"(?P<head>\bjdbc:oracle:[A-Za-z0-9]+:[^\s/@:;]*)/(?P<secret>[^\s@]*)@")
# key=value after a separator; a value in braces (SQL Server) may hold ';'.
_PROPERTY = re.compile(
    r"(?P<head>(?:^|[\s;?&,(])(?P<key>[A-Za-z0-9_.\-]+)\s*=\s*)"
    r"(?P<secret>\{[^}]*\}?|\"[^\"]*\"?|'[^']*'?|[^\s;&,)]*)"
)


def is_secret_key(key: str) -> bool:
    """True if a property or parameter named ``key`` holds a credential."""
    norm = re.sub(r"[^a-z0-9]", "", key.lower())
    return norm in _SECRET_EXACT or any(part in norm for part in _SECRET_PARTS)


def _mask_property(m: re.Match[str]) -> str:
    if not is_secret_key(m.group("key")) or not m.group("secret"):
        return m.group(0)
    return m.group("head") + MASK


def redact(text: str) -> str:
    """``text`` with every credential in it replaced by ``***``; see the module docstring."""
    if not text:
        return text
    text = _USERINFO.sub(lambda m: f"{m.group('head')}:{MASK}@", text)
    text = _ORACLE.sub(lambda m: f"{m.group('head')}/{MASK}@", text)
    return _PROPERTY.sub(_mask_property, text)
