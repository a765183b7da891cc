"""Errors of the memory broker: how its clients fail, in confluent-kafka's types.

Owns :class:`ClientKilled` (the simulated SIGKILL) and the helpers that build
``KafkaError``/``KafkaException`` the way librdkafka reports them. Pure functions, no state,
no locking.
"""

from __future__ import annotations

from typing import NoReturn

from confluent_kafka import KafkaError, KafkaException


class ClientKilled(BaseException):
    """Raised by every call on a client whose worker the test harness killed.

    It derives from BaseException, like SystemExit, so that the engine's ``except Exception``
    handlers do not turn a simulated SIGKILL into error handling that talks to the broker.
    """


def kafka_error(
    code: int, reason: str, *, retriable: bool = False, fatal: bool = False
) -> KafkaError:
    return KafkaError(code, reason, fatal=fatal, retriable=retriable)


def raise_kafka(code: int, reason: str) -> NoReturn:
    raise KafkaException(kafka_error(code, reason))
