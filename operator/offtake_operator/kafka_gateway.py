"""The operator's access to Kafka, behind a protocol so tests can stand in for the broker."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Protocol

from offtake.contract import PipelineSpec, RedriveResult

from . import group_offsets, lag
from .lag import TP, LagReport
from .operator_spec import Rewind


class KafkaGateway(Protocol):
    async def lag(self, pipeline: PipelineSpec, secret: Mapping[str, str]) -> LagReport: ...

    async def group_members(self, pipeline: PipelineSpec, secret: Mapping[str, str]) -> int: ...

    async def reset_offsets(
        self, pipeline: PipelineSpec, secret: Mapping[str, str], request: Rewind
    ) -> dict[TP, int]: ...

    async def redrive_progress(
        self,
        pipeline: PipelineSpec,
        secret: Mapping[str, str],
        group: str,
        topic: str,
        request_id: str,
    ) -> RedriveResult | None:
        """A redrive group's totals on ``topic``; None if the topic does not exist."""
        ...


class AdminKafkaGateway:
    """The real thing: confluent-kafka's AdminClient, run in threads (it blocks)."""

    def __init__(self, timeout: float = 10.0) -> None:
        self.timeout = timeout

    async def lag(self, pipeline: PipelineSpec, secret: Mapping[str, str]) -> LagReport:
        return await asyncio.to_thread(lag.measure_lag, pipeline, secret, self.timeout)

    async def group_members(self, pipeline: PipelineSpec, secret: Mapping[str, str]) -> int:
        return await asyncio.to_thread(group_offsets.group_members, pipeline, secret, self.timeout)

    async def reset_offsets(
        self, pipeline: PipelineSpec, secret: Mapping[str, str], request: Rewind
    ) -> dict[TP, int]:
        return await asyncio.to_thread(
            group_offsets.reset_offsets, pipeline, secret, request, self.timeout
        )

    async def redrive_progress(
        self,
        pipeline: PipelineSpec,
        secret: Mapping[str, str],
        group: str,
        topic: str,
        request_id: str,
    ) -> RedriveResult | None:
        return await asyncio.to_thread(
            group_offsets.redrive_progress, pipeline, secret, group, topic, request_id, self.timeout
        )
