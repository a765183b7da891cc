"""Column names that come from records: checked before they reach Spark or SQL.

A JSON record's field names become the table's column names, so anyone who can produce to
the source topic chooses them. They reach text that something interprets:

- the JDBC sink's own swap ``INSERT INTO t (cols) SELECT cols FROM stage`` (writers.py), which
  pasted them between double quotes unescaped: a record with the field
  ``z") SELECT NULL,... WHERE false;DROP TABLE victims;--`` (and a field ``z``) dropped a table
  through the PostgreSQL driver, which runs several statements sent as one (reproduced before
  this check, tests/spark/test_jdbc_attacks_on_kafka.py);
- Spark's JDBC writer's ``CREATE TABLE`` and ``INSERT`` of the staging table, quoted by
  Spark's dialect for the database (how well depends on the dialect and Spark's version);
  a NUL byte there is a protocol error that stalled the sink as if the database were down;
- Spark column expressions (a backtick ends a quoted name, a dot reaches into a struct) and
  Delta, which refuses `` ,;{}()\\n\\t=`` in names, nested ones too (one such field would
  fail its whole batch).

So a name is written only if it passes an allowlist, the same for every format: letters and
digits of any script (with their combining marks), ``_`` and ``-``; not empty; within the
target's length limit (PostgreSQL silently truncates past 63 bytes, which could merge two
fields into one column). Within one record, names that differ only in case (or meet after
the sink's ``value_`` renaming of metadata names) are refused too: Spark treats them as one
column and would fail the batch. For PostgreSQL, a string value holding U+0000 is refused
the same way (its text type cannot store it; the driver would fail the whole batch). A
record with a name that fails is refused by the sink before it joins a batch
(:class:`UnsafeName`, a :class:`SinkError` naming the field), so ``errors.policy`` handles
that record alone and the rest of the batch lands.

On top of the allowlist, SQL the sink writes itself quotes every name by the dialect's rules
(:func:`quote`: the quote character doubled); the allowlist alone already keeps quotes out.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Any

from offtake.sinks.base import SinkError

# A field name is quoted into an error message and a dead letter's header: at most this much.
SHOWN_CHARS = 80


class UnsafeName(SinkError):
    """A record's field cannot be written as a column name; the message names the field."""


@dataclass(frozen=True)
class Dialect:
    """How a target quotes names and how long they may be."""

    name: str
    quote: str
    max_bytes: int  # of the name's UTF-8 encoding
    # Names inside nested objects are checked too: where the target refuses struct field
    # names that Spark writes elsewhere (Delta). Elsewhere they are data or plain struct
    # fields nothing interprets (jdbc: JSON text), and walking every nested value of every
    # record would cost more than it guards.
    nested: bool
    nul_in_text: bool = True  # a string value may hold U+0000


# PostgreSQL: NAMEDATALEN - 1 = 63 bytes; longer names are truncated, not refused.
# Its text type cannot hold U+0000: the driver refuses such a value, failing the whole batch.
POSTGRES = Dialect("postgresql", '"', 63, nested=False, nul_in_text=False)
# MySQL and MariaDB: 64 characters; counted in bytes here, the stricter reading.
MYSQL = Dialect("mysql", "`", 64, nested=False)
# Any other JDBC database: ANSI double quotes; 128, SQL Server's limit and the SQL standard's
# usual one (Oracle 12.2+ allows 128 bytes too).
ANSI = Dialect("ansi", '"', 128, nested=False)
# Spark's own formats (parquet, json, iceberg): backticks for Spark expressions; 255: what
# the Hive metastore and Glue take for a column.
SPARK = Dialect("spark", "`", 255, nested=False)
# Delta (without column mapping) refuses " ,;{}()\n\t=" in any field name, nested ones too.
DELTA = Dialect("delta", "`", 255, nested=True)


def dialect_of(fmt: str, jdbc_url: str | None) -> Dialect:
    """The dialect of a sink's target: its JDBC URL's database, or Spark's own formats."""
    if fmt == "delta":
        return DELTA
    if fmt != "jdbc" or jdbc_url is None:
        return SPARK
    if jdbc_url.startswith("jdbc:postgresql:"):
        return POSTGRES
    if jdbc_url.startswith(("jdbc:mysql:", "jdbc:mariadb:")):
        return MYSQL
    return ANSI


def _allowed(ch: str) -> bool:
    if ch in "_-" or ch.isalnum():
        return True
    # Combining marks: part of letters in many scripts (Devanagari vowel signs).
    return unicodedata.category(ch) in ("Mn", "Mc")


def shown(name: str) -> str:
    """``name`` as an error message shows it: repr (control characters escaped), clipped."""
    text = repr(name)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 4] + "...'"


def problem(name: str, dialect: Dialect) -> str | None:
    """Why ``name`` cannot be a column name of ``dialect``'s target; None if it can."""
    if not name:
        return "is empty"
    size = len(name.encode("utf-8", "surrogatepass"))
    if size > dialect.max_bytes:
        return f"is {size} bytes long; {dialect.name} names take at most {dialect.max_bytes}"
    bad = next((ch for ch in name if not _allowed(ch)), None)
    if bad is not None:
        return (
            f"contains {bad!r}; column names may hold only letters, digits, '_' and '-' "
            "(docs/spark-sink.md, identifiers)"
        )
    return None


def quote(name: str, dialect: Dialect) -> str:
    """``name`` quoted for ``dialect``'s SQL (the quote character doubled inside); refuses a
    name :func:`problem` refuses, so nothing unchecked reaches a statement."""
    why = problem(name, dialect)
    if why is not None:
        raise UnsafeName(f"column {shown(name)} {why}")
    q = dialect.quote
    return q + name.replace(q, q + q) + q


# sink.spark.jdbc.table as Spark's JDBC writer uses it: pasted unquoted into its statements, so
# only plain identifiers, [catalog.][schema.]table.
_TABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*(?:\.[A-Za-z_][A-Za-z0-9_$]*){0,2}")


def table_problem(table: str, dialect: Dialect, suffix_chars: int = 0) -> str | None:
    """Why ``table`` (the spec's ``sink.spark.jdbc.table``) cannot be used; None if it can.

    ``suffix_chars``: what the sink appends for its staging tables; a name the database
    would truncate could make two partitions' staging tables one.
    """
    if not _TABLE.fullmatch(table):
        return (
            f"{table!r} is not [schema.]table of plain names (letters, digits, '_', '$'; "
            "not starting with a digit): Spark pastes it into its statements unquoted"
        )
    name = table.rpartition(".")[2]
    if len(name) + suffix_chars > dialect.max_bytes:
        return (
            f"{table!r}: its staging tables' names ({len(name)} + {suffix_chars} characters) "
            f"would exceed {dialect.name}'s {dialect.max_bytes}; use a name of at most "
            f"{dialect.max_bytes - suffix_chars} characters"
        )
    return None


class NameCheck:
    """Checks the field names of a sink's values; one per sink (the engine's processing
    thread is its only caller).

    It runs for every record, so what it found good is remembered: a record whose top-level
    fields are those of one seen before (the usual case: a topic's records share a shape)
    costs one tuple lookup, plus a walk of its nested values where those are columns too.
    """

    MAX_REMEMBERED = 10_000  # a stream of ever new names must not grow memory without bound

    def __init__(self, dialect: Dialect, column_name: Any = None) -> None:
        """``column_name``: the sink's renaming of a top-level field (rows.column_name)."""
        self.dialect = dialect
        self._rename = column_name or (lambda name: name)
        self._good: set[str] = set()  # names (nested) found good
        self._shapes: set[tuple[Any, ...]] = set()  # top-level field tuples found good

    def check(self, value: Any, where: str) -> None:
        """Raise :class:`UnsafeName` naming the field (and ``where``: the record) if a field
        name of ``value`` cannot be written; values that are not records have no names."""
        # dict, not Mapping: only dicts become columns (rows.py), and this runs per record.
        if not isinstance(value, dict):
            return
        shape = tuple(value)
        if shape not in self._shapes:
            self._check_top(value, where)
            if len(self._shapes) < self.MAX_REMEMBERED:
                self._shapes.add(shape)
        if self.dialect.nested:
            for key, child in value.items():
                if isinstance(child, dict | list):
                    self._check_nested(child, str(key), where)
        if not self.dialect.nul_in_text:
            for key, cell in value.items():
                if isinstance(cell, str) and "\x00" in cell:
                    raise UnsafeName(
                        f"record {where}: field {shown(str(key))}: the value holds a NUL "
                        f"character, which {self.dialect.name} text cannot store"
                    )

    def _check_nested(self, top: dict[Any, Any] | list[Any], path: str, where: str) -> None:
        """The names inside a struct or list column, at any depth; a path is only made for
        what is walked into, or checked for the first time."""
        stack: list[tuple[Any, str]] = [(top, path)]
        while stack:
            node, at = stack.pop()
            if isinstance(node, dict):
                for key, child in node.items():
                    if key not in self._good:
                        self._check_name(str(key), f"{at}.{key}", where)
                    if isinstance(child, dict | list):
                        stack.append((child, f"{at}.{key}"))
            else:
                for element in node:
                    if isinstance(element, dict | list):
                        stack.append((element, f"{at}[]"))

    def _check_name(self, column: str, path: str, where: str) -> None:
        if column in self._good:
            return
        why = problem(column, self.dialect)
        if why is not None:
            raise UnsafeName(f"record {where}: field {shown(path)}: column name {why}")
        if len(self._good) < self.MAX_REMEMBERED:
            self._good.add(column)

    def _check_top(self, value: dict[Any, Any], where: str) -> None:
        """The top-level names (as the sink renames them), and no two of them one column."""
        seen: dict[str, str] = {}
        for key in value:
            name = str(key)
            column = self._rename(name)
            self._check_name(column, name, where)
            folded = column.casefold()
            other = seen.get(folded)
            if other is not None:
                raise UnsafeName(
                    f"record {where}: fields {shown(other)} and {shown(name)} would be the "
                    f"same column ({shown(column)}): Spark compares column names ignoring case"
                )
            seen[folded] = name
