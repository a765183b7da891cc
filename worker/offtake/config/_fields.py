"""Typed reads from an untrusted mapping, each error naming the field's full path.

Each mapping is read with its node of the CRD's schema (crds/consumerpipeline.yaml): the
defaults, bounds and choices written there are the only ones; the loader restates none.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any, TypeVar

from offtake.errors import OfftakeError

T = TypeVar("T")
Node = Mapping[str, Any]

# A manifest key printed as it is; any other (spaces, control characters, quotes) is quoted,
# so an error line names the field unambiguously and a stray "\r" cannot garble the output.
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_.$/@+-]+")


def field_name(key: object) -> str:
    """How a key appears in a field path: as it is when plain, else quoted (``repr``)."""
    text = str(key)
    return text if _PLAIN_KEY.fullmatch(text) else repr(text)


class ConfigError(OfftakeError, ValueError):
    """A manifest field is missing, unknown or of the wrong type or value."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return f"the number {value!r}"
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, Mapping):
        return "a mapping"
    return type(value).__name__


def with_defaults(value: Any, node: Node) -> Any:
    """``value`` with the schema's defaults filled in, the way the API server defaults."""
    if isinstance(value, Mapping):
        out = dict(value)
        properties = node.get("properties", {})
        for key, sub in properties.items():
            if key not in out and "default" in sub:
                out[key] = copy.deepcopy(sub["default"])
            if key in out:
                out[key] = with_defaults(out[key], sub)
        extra = node.get("additionalProperties")
        if isinstance(extra, Mapping):
            for key in out.keys() - properties.keys():
                out[key] = with_defaults(out[key], extra)
        return out
    if isinstance(value, list) and "items" in node:
        return [with_defaults(item, node["items"]) for item in value]
    return value


class Fields:
    """One mapping of the manifest being read, with its schema node; remembers which keys were
    used.

    The node's defaults are filled in as the API server fills them, and its bounds and enums
    checked on each read: a field that has no value here after that has no default. Call
    :meth:`done` after the last read so that misspelt keys are reported instead of silently
    ignored (a typo in ``maxInFlightMesages`` must not fall back to a default).
    """

    def __init__(self, raw: object, path: str, node: Node) -> None:
        if not isinstance(raw, Mapping):
            raise ConfigError(path, f"expected a mapping, got {_kind(raw)}")
        self.raw: Mapping[str, Any] = with_defaults(raw, node)
        self.path = path
        self.node = node
        self._seen: set[str] = set()

    def at(self, key: str) -> str:
        name = field_name(key)
        return f"{self.path}.{name}" if self.path else name

    def _schema(self, key: str) -> Node:
        node: Node = self.node.get("properties", {}).get(key, {})
        return node

    def _get(self, key: str, required: bool) -> Any:
        self._seen.add(key)
        if key not in self.raw or self.raw[key] is None:
            if required:
                raise ConfigError(self.at(key), "is required")
            return None
        return self.raw[key]

    def has(self, key: str) -> bool:
        return self.raw.get(key) is not None

    def _required(self, key: str, value: T | None) -> T:
        """``value``, read after the CRD's defaults: None means the field has no default."""
        if value is None:
            raise ConfigError(self.at(key), "is required")
        return value

    def text(self, key: str, default: str | None = None) -> str:
        """A string, required unless the CRD or ``default`` (a value the CRD cannot hold, such
        as one made of other fields) gives one."""
        value = self.opt_str(key)
        return self._required(key, default if value is None else value)

    def opt_str(self, key: str) -> str | None:
        value = self._get(key, False)
        if value is None:
            return None
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(self.at(key), f"expected a non-empty string, got {_kind(value)}")
        return value

    def choice(self, key: str) -> str:
        """One of the CRD's enum for the field."""
        choices = tuple(self._schema(key)["enum"])
        value = self.text(key)
        if value not in choices:
            raise ConfigError(self.at(key), f"expected one of {', '.join(choices)}, got {value!r}")
        return value

    def integer(self, key: str) -> int:
        return self._required(key, self.opt_integer(key))

    def opt_integer(self, key: str) -> int | None:
        value = self._get(key, False)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(self.at(key), f"expected an integer, got {_kind(value)}")
        self._bounds(key, value)
        return value

    def number(self, key: str) -> float:
        return self._required(key, self.opt_number(key))

    def opt_number(self, key: str) -> float | None:
        value = self._get(key, False)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(self.at(key), f"expected a number, got {_kind(value)}")
        self._bounds(key, value)
        return float(value)

    def flag(self, key: str) -> bool:
        value = self._get(key, True)
        if not isinstance(value, bool):
            raise ConfigError(self.at(key), f"expected true or false, got {_kind(value)}")
        return value

    def str_list(self, key: str, *, required: bool = False) -> tuple[str, ...]:
        value = self._get(key, required)
        if value is None:
            return ()
        if not isinstance(value, list):
            raise ConfigError(self.at(key), f"expected a list of strings, got {_kind(value)}")
        for i, item in enumerate(value):
            if not isinstance(item, str) or not item.strip():
                raise ConfigError(
                    f"{self.at(key)}[{i}]", f"expected a non-empty string, got {_kind(item)}"
                )
        if required and not value:
            raise ConfigError(self.at(key), "expected at least one entry, got an empty list")
        return tuple(value)

    def str_map(self, key: str) -> dict[str, str]:
        """A free-form string map such as librdkafka properties; scalars are stringified."""
        value = self._get(key, False)
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise ConfigError(self.at(key), f"expected a mapping of strings, got {_kind(value)}")
        out: dict[str, str] = {}
        for k, v in value.items():
            if isinstance(v, Mapping | list) or v is None:
                raise ConfigError(
                    f"{self.at(key)}.{field_name(k)}",
                    f"expected a string or number, got {_kind(v)}",
                )
            out[str(k)] = str(v).lower() if isinstance(v, bool) else str(v)
        return out

    def sub_list(self, key: str) -> list[Fields]:
        """A list of mappings, each read with its own Fields (path ``key[i]``)."""
        value = self._get(key, False)
        if value is None:
            return []
        if not isinstance(value, list):
            raise ConfigError(self.at(key), f"expected a list of mappings, got {_kind(value)}")
        items = self._schema(key).get("items", {})
        return [Fields(item, f"{self.at(key)}[{i}]", items) for i, item in enumerate(value)]

    def sub(self, key: str, *, required: bool = False) -> Fields | None:
        value = self._get(key, required)
        if value is None:
            return None
        return Fields(value, self.at(key), self._schema(key))

    def section(self, key: str) -> Fields:
        """The mapping at ``key``, or an empty one (with the CRD's defaults) when absent."""
        return self.sub(key) or Fields({}, self.at(key), self._schema(key))

    def finish(self, value: T) -> T:
        """``value`` (read from these fields) once :meth:`done` found no unknown field."""
        self.done()
        return value

    def done(self) -> None:
        unknown = sorted(set(self.raw) - self._seen)
        if unknown:
            known = ", ".join(sorted(self._seen)) or "none"
            raise ConfigError(self.at(unknown[0]), f"unknown field (known fields here: {known})")

    def _bounds(self, key: str, value: float) -> None:
        node = self._schema(key)
        minimum, maximum = node.get("minimum"), node.get("maximum")
        if minimum is not None and value < minimum:
            raise ConfigError(self.at(key), f"expected at least {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise ConfigError(self.at(key), f"expected at most {maximum}, got {value}")
