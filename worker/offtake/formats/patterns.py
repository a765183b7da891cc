"""JSON Schema's regular expressions (``pattern``, ``patternProperties``) in RE2, an engine
whose matching time is linear in the text, whatever the pattern.

jsonschema matches them with Python's ``re``, a backtracking engine: a pattern from the
registry such as ``^(a+)+$`` takes seconds on a 24-character string and twice as long with each
character more, holding the GIL (docs/security.md, "Second round"). The validators here are
jsonschema's own with the three keywords that match patterns replaced by RE2's
(``pattern``, ``patternProperties``, and ``additionalProperties``, which skips what
``patternProperties`` matched); a schema is refused when it is loaded, with an error that
names the pattern, if a pattern is not one RE2 accepts (backreferences, lookaround: the
features that need backtracking), or if it pairs ``unevaluatedProperties`` with
``patternProperties`` (jsonschema's walk for that keyword matches with ``re`` inside and has
no hook).

RE2's syntax is closer to JSON Schema's (ECMA-262) than ``re``'s: ``$`` matches at the end
only, not before a final newline, and ``\\d``, ``\\w`` are ASCII, as in ECMA-262.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import re2
from jsonschema import ValidationError
from jsonschema.protocols import Validator
from jsonschema.validators import extend

from offtake.errors import OfftakeError

# The keywords whose values are maps from names to schemas (the names are no patterns) and
# those whose values are data, not schemas.
_BY_NAME = ("properties", "$defs", "definitions", "dependentSchemas", "dependencies")
_DATA = ("enum", "const", "default", "examples")

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # the refusal says why; RE2's own log line would go to stderr


class UnsafePattern(OfftakeError, ValueError):
    """A schema's pattern that cannot be matched in linear time; names the pattern."""


@functools.lru_cache(maxsize=4096)
def compiled(pattern: str) -> Any:
    """The pattern in RE2; UnsafePattern if RE2 does not accept it."""
    try:
        return re2.compile(pattern, _OPTIONS)
    except Exception as exc:
        reason = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else exc
        raise UnsafePattern(
            f"JSON Schema pattern {pattern!r} is refused: patterns are matched with RE2, in "
            f"time linear in the text, which does not accept it ({reason}; backreferences "
            "and lookaround need a backtracking engine)"
        ) from None


def _patterns(schema: Any) -> Iterator[tuple[str, str]]:
    """(keyword, pattern) for every pattern in a schema document."""
    if isinstance(schema, list):
        for item in schema:
            yield from _patterns(item)
        return
    if not isinstance(schema, dict):
        return
    for key, value in schema.items():
        if key == "pattern" and isinstance(value, str):
            yield key, value
        elif key == "patternProperties" and isinstance(value, dict):
            for pattern, sub in value.items():
                yield key, pattern
                yield from _patterns(sub)
        elif key == "unevaluatedProperties":
            yield key, ""
            yield from _patterns(value)
        elif key in _BY_NAME and isinstance(value, dict):
            for sub in value.values():
                yield from _patterns(sub)
        elif key not in _DATA:
            yield from _patterns(value)


def check(schema: Any) -> None:
    """Refuse a schema document whose patterns could not all be matched in RE2."""
    keywords: set[str] = set()
    for keyword, pattern in _patterns(schema):
        keywords.add(keyword)
        if keyword != "unevaluatedProperties":
            compiled(pattern)
    if {"unevaluatedProperties", "patternProperties"} <= keywords:
        raise UnsafePattern(
            "a JSON Schema with both unevaluatedProperties and patternProperties is refused: "
            "jsonschema matches patternProperties with Python's re (a backtracking engine) "
            "while it looks for unevaluated properties"
        )


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[Any]:
    if validator.is_type(instance, "string") and not compiled(pattern).search(instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(validator: Any, patterns: Any, instance: Any, schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        match = compiled(pattern).search
        for key, value in instance.items():
            if match(key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(validator: Any, extra: Any, instance: Any, schema: Any) -> Iterator[Any]:
    # jsonschema's additionalProperties, with the properties patternProperties matches found
    # by RE2; the same errors, word for word.
    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    patterns = [compiled(p) for p in schema.get("patternProperties", {})]
    extras = {
        key
        for key in instance
        if key not in properties and not any(p.search(key) for p in patterns)
    }
    if validator.is_type(extra, "object"):
        for key in extras:
            yield from validator.descend(instance[key], extra, path=key)
    elif not extra and extras:
        if "patternProperties" in schema:
            verb = "does" if len(extras) == 1 else "do"
            joined = ", ".join(repr(each) for each in sorted(extras))
            listed = ", ".join(repr(each) for each in sorted(schema["patternProperties"]))
            yield ValidationError(f"{joined} {verb} not match any of the regexes: {listed}")
        else:
            names = sorted(extras, key=str)
            verb = "was" if len(names) == 1 else "were"
            joined = ", ".join(repr(each) for each in names)
            yield ValidationError(
                f"Additional properties are not allowed ({joined} {verb} unexpected)"
            )


_KEYWORDS = {
    "pattern": _pattern,
    "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties,
}


@functools.cache
def linear(cls: type[Validator]) -> type[Validator]:
    """``cls`` (a jsonschema validator class) with its patterns matched by RE2."""
    return extend(cls, {k: v for k, v in _KEYWORDS.items() if k in cls.VALIDATORS})  # type: ignore[no-any-return]
