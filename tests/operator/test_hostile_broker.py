"""A tenant's broker is the attacker: it answers the operator's first request with a frame
announcing 900 MB (the tenant's config allowing 1 GB). The operator's clients (their
receive.message.max.bytes capped by the operator) drop the connection instead of reading it,
the lag read ends within its timeout with an error, and the operator's memory stays bounded.
Without the cap this process is aborted (measured: "Fatal Python error: Aborted").

The server below is not a stand-in for Kafka: it speaks just enough of the protocol (read a
length-prefixed request, answer with its correlation id) to be a hostile broker."""

from __future__ import annotations

import dataclasses
import resource
import socket
import struct
import threading
from collections.abc import Iterator

import pytest
from support.manifest_corpus import minimal

from offtake.config import parse_pipeline
from offtake_operator.lag import KafkaAccessError, measure_lags

#: Below the tenant's receive.message.max.bytes (so only the operator's cap stands in the way)
#: and far above that cap.
HUGE = 900_000_000
TENANTS_LIMIT = "1000000000"


def _serve(server: socket.socket, stop: threading.Event, answered: list[int]) -> None:
    server.settimeout(0.2)
    while not stop.is_set():
        try:
            conn, _ = server.accept()
        except TimeoutError:
            continue
        with conn:
            conn.settimeout(5)
            try:
                size = struct.unpack(">i", conn.recv(4, socket.MSG_WAITALL))[0]
                request = conn.recv(size, socket.MSG_WAITALL)
                correlation = request[4:8]  # api_key(2) api_version(2) correlation_id(4)
                # The length prefix promises HUGE bytes; send a little of them and keep going
                # while the client reads (it should hang up first).
                conn.sendall(struct.pack(">i", HUGE) + correlation + b"\0" * 65536)
                answered.append(size)
                while not stop.is_set():
                    conn.sendall(b"\0" * 65536)
            except OSError:
                continue


@pytest.fixture
def hostile_broker() -> Iterator[tuple[str, list[int]]]:
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()
    answered: list[int] = []
    thread = threading.Thread(target=_serve, args=(server, stop, answered), daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}", answered
    finally:
        stop.set()
        thread.join(10)
        server.close()


def _max_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def test_a_broker_announcing_a_huge_frame_neither_exhausts_nor_stalls_the_operator(
    hostile_broker: tuple[str, list[int]],
) -> None:
    address, answered = hostile_broker
    spec = parse_pipeline(minimal())
    spec = dataclasses.replace(
        spec,
        kafka=dataclasses.replace(
            spec.kafka,
            bootstrap_servers=address,
            config={**spec.kafka.config, "receive.message.max.bytes": TENANTS_LIMIT},
        ),
    )
    before = _max_rss_mib()
    (report,) = measure_lags([(spec, {})], timeout=3)
    grown = _max_rss_mib() - before
    assert answered, "the operator's client never reached the hostile broker"
    assert isinstance(report, KafkaAccessError), report
    assert str(report), "the error says nothing"
    # A client that believed the prefix would fill a 900 MB buffer as the bytes stream in;
    # the cap keeps it to the operator's 4 MiB responses (and librdkafka's own buffers).
    assert grown < 256, f"max RSS grew by {grown:.0f} MiB"
