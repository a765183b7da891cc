"""OperatorContext.serves: an optional API's "yes" is trusted for a minute, its "no" for
seconds, so a CRD installed after the operator (the Spark operator's SparkConnect, KEDA) is
used at once, even when the first look came in the moment between the CRD being Established
and its API group being served (an e2e run under load waited a minute on that "no")."""

from __future__ import annotations

import asyncio
import time

import pytest

from offtake_operator.context import (
    ABSENT_CAPABILITY_TTL_SECONDS,
    CAPABILITY_TTL_SECONDS,
    OperatorContext,
)
from offtake_operator.kubeapi import SPARKCONNECTS, Resource
from offtake_operator.settings import OperatorConfig


class Discovery:
    """The API server's answer to "is this resource served", and how often it was asked."""

    def __init__(self) -> None:
        self.served = False
        self.asked = 0

    async def serves(self, res: Resource) -> bool:
        self.asked += 1
        return self.served


def test_an_absent_api_is_looked_for_again_within_seconds_and_a_present_one_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    ctx = OperatorContext(OperatorConfig())
    discovery = Discovery()
    ctx.api = discovery  # type: ignore[assignment]

    def serves() -> bool:
        return asyncio.run(ctx.serves(SPARKCONNECTS))

    assert not serves()
    assert not serves() and discovery.asked == 1  # the "no" is cached a moment
    discovery.served = True  # the CRD's group is served now
    now[0] += ABSENT_CAPABILITY_TTL_SECONDS + 0.1
    assert serves() and discovery.asked == 2
    discovery.served = False
    now[0] += CAPABILITY_TTL_SECONDS - 1
    assert serves() and discovery.asked == 2  # the "yes" holds for its minute
    now[0] += 2
    assert not serves() and discovery.asked == 3
    assert ABSENT_CAPABILITY_TTL_SECONDS <= 5 < CAPABILITY_TTL_SECONDS
