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


#: How long a lag request waits for others to share its round (each pipeline's tick asks on
#: its own; a thousand pipelines ask dozens of times a second).
LAG_BATCH_SECONDS = 0.5


class AdminKafkaGateway:
    """The real thing: confluent-kafka's AdminClient, run in threads (it blocks)."""

    def __init__(self, timeout: float = 10.0) -> None:
        self.timeout = timeout
        self._lag_requests: list[tuple[lag.Request, asyncio.Future[LagReport]]] = []
        self._lag_rounds: asyncio.Task[None] | None = None

    async def lag(self, pipeline: PipelineSpec, secret: Mapping[str, str]) -> LagReport:
        """Measured in rounds (:func:`.lag.measure_lags`): the requests that arrive within
        LAG_BATCH_SECONDS, or while a round runs, share the next one."""
        future: asyncio.Future[LagReport] = asyncio.get_running_loop().create_future()
        self._lag_requests.append(((pipeline, secret), future))
        if self._lag_rounds is None or self._lag_rounds.done():
            self._lag_rounds = asyncio.create_task(self._run_lag_rounds())
        return await future

    async def _run_lag_rounds(self) -> None:
        while self._lag_requests:
            await asyncio.sleep(LAG_BATCH_SECONDS)
            batch, self._lag_requests = self._lag_requests, []
            try:
                reports = await asyncio.to_thread(
                    lag.measure_lags, [request for request, _ in batch], self.timeout
                )
            except Exception as exc:  # a bug in a round must not leave its callers waiting
                reports = [lag.KafkaAccessError(f"lag not measured: {exc!r}")] * len(batch)
            for (_, future), report in zip(batch, reports, strict=True):
                if future.done():  # its caller was cancelled
                    continue
                if isinstance(report, Exception):
                    future.set_exception(report)
                else:
                    future.set_result(report)

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
