"""offtake_operator/errors.py's rule: every exception class the ``offtake_operator`` package
defines (the kubectl plugin's included) derives from :class:`OperatorError`, keeping the
builtin base it had, so that no ``except ValueError`` or ``except RuntimeError`` changed
meaning. The operator's counterpart of tests/unit/test_errors.py."""

from __future__ import annotations

from support.exception_classes import exception_classes as find_exception_classes

import offtake_operator
from offtake_operator.errors import OperatorError


def exception_classes() -> dict[str, type[BaseException]]:
    return find_exception_classes(offtake_operator)


def test_every_exception_class_derives_from_operator_error() -> None:
    classes = exception_classes()
    # The walk finds the package's classes, the plugin's among them (a broken walk would pass
    # vacuously).
    assert len(classes) >= 16, sorted(classes)
    assert "offtake_operator.kubectl.errors.PluginError" in classes
    outside = sorted(name for name, cls in classes.items() if not issubclass(cls, OperatorError))
    assert outside == [], f"derive these from offtake_operator.errors.OperatorError: {outside}"


def test_the_builtin_bases_callers_catch_are_kept() -> None:
    classes = exception_classes()
    for name, base in [
        ("offtake_operator.settings.SettingsError", ValueError),
        ("offtake_operator.lag.KafkaAccessError", RuntimeError),
        ("offtake_operator.group_offsets.GroupNotEmptyError", RuntimeError),
        ("offtake_operator.kafka_secret.KafkaSecretError", RuntimeError),
        ("offtake_operator.embedded.OperatorThreadError", RuntimeError),
    ]:
        assert issubclass(classes[name], base), name
        assert issubclass(classes[name], OperatorError), name
