"""processor.lifespan: what a function's calls share, opened once per worker, closed at
shutdown; the manifest's refusals name the fields."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from offtake.config import ConfigError, parse_pipeline
from offtake.processing.function import FunctionLoadError, function_processor
from offtake.records import Record

DOC: dict[str, Any] = {
    "apiVersion": "offtake.dev/v1alpha1",
    "kind": "ConsumerPipeline",
    "metadata": {"name": "orders", "namespace": "shop"},
    "spec": {
        "kafka": {"bootstrapServers": "kafka:9092"},
        "source": {"topics": ["orders"]},
        "sink": {"kafka": {"topic": "out"}},
    },
}


def manifest(processor: dict[str, Any]) -> dict[str, Any]:
    return {**DOC, "spec": {**DOC["spec"], "processor": processor}}


def record(value: Any = 1) -> Record:
    return Record("t", 0, 0, None, value, (), None, None)


def test_the_manifest_carries_it_with_a_function() -> None:
    spec = parse_pipeline(manifest({"function": "m:f", "lifespan": "m:session"}))
    assert spec.processor.lifespan == "m:session"
    assert parse_pipeline(manifest({"function": "m:f"})).processor.lifespan is None


@pytest.mark.parametrize(
    ("processor", "message"),
    [
        ({"function": "m:f", "lifespan": "session"}, "spec.processor.lifespan: expected module"),
        (
            {"container": {"image": "x"}, "lifespan": "m:s"},
            "spec.processor.lifespan: applies to processor.function",
        ),
        (
            {"function": "m:f", "lifespan": "m:s", "parallelism": 4},
            "spec.processor.lifespan: and spec.processor.parallelism",
        ),
        (
            {"function": "m:f", "lifespan": "m:s", "timeoutSeconds": 5},
            "spec.processor.lifespan: and spec.processor.timeoutSeconds",
        ),
    ],
)
def test_refusals_name_the_fields(processor: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_pipeline(manifest(processor))
    assert message in str(info.value)


def test_a_plain_context_manager_is_entered_once_and_exited_at_close() -> None:
    events: list[tuple[str, str]] = []

    @contextlib.contextmanager
    def session() -> Iterator[None]:
        events.append(("enter", threading.current_thread().name))
        yield
        events.append(("exit", threading.current_thread().name))

    p = function_processor(lambda r: r.value, batch=False, lifespan=session)
    p.open()
    p.open()  # once
    assert [o.values for o in p.process([record(7)])] == [[7]]
    p.close()
    p.close()  # once
    here = threading.current_thread().name
    assert events == [("enter", here), ("exit", here)]


def test_an_async_one_is_entered_on_the_loop_the_async_calls_run_on() -> None:
    seen: dict[str, Any] = {}

    @contextlib.asynccontextmanager
    async def session() -> AsyncIterator[None]:
        seen["loop"] = asyncio.get_running_loop()
        yield
        seen["closed"] = True

    async def handle(r: Record) -> Any:
        assert asyncio.get_running_loop() is seen["loop"]
        return r.value

    p = function_processor(handle, batch=False, lifespan=session)
    p.open()
    assert [o.values for o in p.process([record(3)])] == [[3]]
    p.close()
    assert seen["closed"] is True


def test_a_lifespan_that_fails_or_is_no_context_manager_is_named() -> None:
    @contextlib.contextmanager
    def broken() -> Iterator[None]:
        raise ConnectionError("database refused")
        yield

    p = function_processor(lambda r: r, batch=False, lifespan=broken)
    with pytest.raises(
        FunctionLoadError, match=r"spec\.processor\.lifespan: entering it failed: database refused"
    ):
        p.open()
    p = function_processor(lambda r: r, batch=False, lifespan=lambda: 42)
    with pytest.raises(FunctionLoadError, match="returned int, not a context manager"):
        p.open()
    p.close()  # nothing entered: nothing to exit
