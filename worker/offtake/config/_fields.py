"""Typed reads from an untrusted mapping, each error naming the field's full path."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")

# A manifest key printed as it is; any other (spaces, control characters, quotes) is quoted,
# so an error line names the field unambiguously and a stray "\r" cannot garble the output.
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_.$/@+-]+")


def field_name(key: object) -> str:
    """How a key appears in a field path: as it is when plain, else quoted (``repr``)."""
    text = str(key)
    return text if _PLAIN_KEY.fullmatch(text) else repr(text)


class ConfigError(ValueError):
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


class Fields:
    """One mapping of the manifest being read; remembers which keys were used.

    Call :meth:`done` after the last read so that misspelt keys are reported instead of
    silently ignored (a typo in ``maxInFlightMesages`` must not fall back to a default).
    """

    def __init__(self, raw: object, path: str) -> None:
        if not isinstance(raw, Mapping):
            raise ConfigError(path, f"expected a mapping, got {_kind(raw)}")
        self.raw: Mapping[str, Any] = raw
        self.path = path
        self._seen: set[str] = set()

    def at(self, key: str) -> str:
        name = field_name(key)
        return f"{self.path}.{name}" if self.path else name

    def _get(self, key: str, required: bool) -> Any:
        self._seen.add(key)
        if key not in self.raw or self.raw[key] is None:
            if required:
                raise ConfigError(self.at(key), "is required")
            return None
        return self.raw[key]

    def has(self, key: str) -> bool:
        return self.raw.get(key) is not None

    def text(self, key: str, default: str | None = None, *, required: bool = False) -> str:
        value = self._get(key, required and default is None)
        if value is None:
            return default  # type: ignore[return-value]
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(self.at(key), f"expected a non-empty string, got {_kind(value)}")
        return value

    def opt_str(self, key: str) -> str | None:
        value = self._get(key, False)
        if value is None:
            return None
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(self.at(key), f"expected a non-empty string, got {_kind(value)}")
        return value

    def choice(self, key: str, choices: tuple[str, ...], default: str | None = None) -> str:
        value = self.text(key, default, required=default is None)
        if value not in choices:
            raise ConfigError(self.at(key), f"expected one of {', '.join(choices)}, got {value!r}")
        return value

    def integer(
        self, key: str, default: int, *, minimum: int = 0, maximum: int | None = None
    ) -> int:
        value = self._get(key, False)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(self.at(key), f"expected an integer, got {_kind(value)}")
        self._bounds(key, value, minimum, maximum)
        return value

    def number(
        self, key: str, default: float, *, minimum: float = 0.0, maximum: float | None = None
    ) -> float:
        value = self._get(key, False)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(self.at(key), f"expected a number, got {_kind(value)}")
        self._bounds(key, value, minimum, maximum)
        return float(value)

    def flag(self, key: str, default: bool) -> bool:
        value = self._get(key, False)
        if value is None:
            return default
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
        return [Fields(item, f"{self.at(key)}[{i}]") for i, item in enumerate(value)]

    def sub(self, key: str, *, required: bool = False) -> Fields | None:
        value = self._get(key, required)
        if value is None:
            return None
        return Fields(value, self.at(key))

    def finish(self, value: T) -> T:
        """``value`` (read from these fields) once :meth:`done` found no unknown field."""
        self.done()
        return value

    def done(self) -> None:
        unknown = sorted(set(self.raw) - self._seen)
        if unknown:
            known = ", ".join(sorted(self._seen)) or "none"
            raise ConfigError(self.at(unknown[0]), f"unknown field (known fields here: {known})")

    def _bounds(self, key: str, value: float, minimum: float, maximum: float | None) -> None:
        if value < minimum:
            raise ConfigError(self.at(key), f"expected at least {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise ConfigError(self.at(key), f"expected at most {maximum}, got {value}")
