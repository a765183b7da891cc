"""How a librdkafka error reads in a log line or a reason."""

from __future__ import annotations

from typing import Any


def describe(error: Any) -> str:
    """The text of a ``KafkaError``, or of the ``KafkaError`` a ``KafkaException`` carries
    (its ``str()`` is a repr-like ``KafkaError{code=...,val=...,str="..."}``); anything else's
    own ``str()``."""
    err = error.args[0] if isinstance(error, BaseException) and error.args else error
    text = getattr(err, "str", None)
    return str(text()) if callable(text) else str(error)


def retriable(error: Any) -> bool:
    """Whether librdkafka says the call that raised ``error`` (a ``KafkaException``) may be
    made again as it is, e.g. a transaction coordinator still loading its state."""
    err = error.args[0] if isinstance(error, BaseException) and error.args else error
    check = getattr(err, "retriable", None)
    return bool(check()) if callable(check) else False
