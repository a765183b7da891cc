"""offtake/errors.py's rule: every exception class the ``offtake`` package defines derives from
:class:`offtake.OfftakeError`, keeping the builtin base it had (so no ``except ValueError``
changed meaning), and the ones a user acts on are importable from ``offtake`` itself."""

from __future__ import annotations

from support.exception_classes import exception_classes as find_exception_classes

import offtake
from offtake import OfftakeError

# The classes outside the root, each with the reason. A new class must derive from
# OfftakeError or be added here with its reason.
OUTSIDE = {
    # Derives from BaseException on purpose, like SystemExit: the engine's `except Exception`
    # must not turn a simulated SIGKILL into error handling that talks to the broker.
    "offtake.kafka.memory.errors.ClientKilled": "a simulated SIGKILL, not an error",
}


def exception_classes() -> dict[str, type[BaseException]]:
    return find_exception_classes(offtake)


def test_every_exception_class_derives_from_offtake_error() -> None:
    classes = exception_classes()
    # The walk finds the package's classes (a broken walk would pass vacuously).
    assert len(classes) >= 40, sorted(classes)
    outside = sorted(
        name
        for name, cls in classes.items()
        if not issubclass(cls, OfftakeError) and name not in OUTSIDE
    )
    assert outside == [], f"derive these from offtake.OfftakeError or list them: {outside}"
    stale = sorted(name for name in OUTSIDE if name not in classes)
    assert stale == [], f"listed as outside the root but gone: {stale}"
    rooted_now = sorted(name for name in OUTSIDE if issubclass(classes[name], OfftakeError))
    assert rooted_now == [], f"now under the root, delete them from OUTSIDE: {rooted_now}"


def test_the_builtin_bases_callers_catch_are_kept() -> None:
    """``except ValueError`` (bad manifest, bad header, bad value) still catches what it did."""
    classes = exception_classes()
    for name, base in [
        ("offtake.config._fields.ConfigError", ValueError),
        ("offtake.engine.header_values.HeaderError", ValueError),
        ("offtake.formats.errors.DecodeError", ValueError),
        ("offtake.formats.errors.OutOfBounds", ValueError),
        ("offtake.formats.errors.UnsendableValueError", TypeError),
        ("offtake.formats.jsonschema.SchemaMismatch", ValueError),
        ("offtake.formats.patterns.UnsafePattern", ValueError),
        ("offtake.formats.sink_schema.SinkSchemaError", ValueError),
        ("offtake.processing.function.FunctionLoadError", ValueError),
        ("offtake.harness.PipelineTimeout", AssertionError),
    ]:
        assert issubclass(classes[name], base), name
        assert issubclass(classes[name], OfftakeError), name


def test_the_errors_users_act_on_are_exported_from_offtake() -> None:
    from offtake.config._fields import ConfigError
    from offtake.formats.errors import DecodeError
    from offtake.processing.base import Backpressure
    from offtake.sinks.base import SinkError

    assert offtake.ConfigError is ConfigError
    assert offtake.DecodeError is DecodeError
    assert offtake.SinkError is SinkError
    assert offtake.Backpressure is Backpressure
    for name in ("OfftakeError", "ConfigError", "DecodeError", "SinkError", "Backpressure"):
        assert name in offtake.__all__
        assert issubclass(getattr(offtake, name), OfftakeError)
