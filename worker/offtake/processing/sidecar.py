"""Sidecar mode: records are processed by the user's own container, over HTTP on localhost.

This is the worker's side of the protocol in docs/sidecar-protocol.md (version 1): the HTTP
exchange (the JSON of a record and of its result: :mod:`offtake.processing.sidecar_wire`). It
uses the standard library's ``http.client`` with one persistent keep-alive connection: the
container is on the same host and the worker sends one batch at a time, so a connection pool
(urllib3, requests) would add a dependency and buy nothing.

How answers map onto the processor contract (offtake.processing.base):

- ``200`` with results: one :class:`Outcome` per record, values or a :class:`SidecarRecordError`.
  A malformed answer is an error of each record it fails to answer for, naming the record's id,
  so the engine's bounded retries and error policy apply: a processor that answers nonsense
  stalls nothing forever and loses nothing.
- ``429``/``503``, other ``5xx``, refused connections and timeouts: :class:`SidecarUnavailable`
  (a :class:`ProcessorUnavailable`): the engine retries the whole batch and charges no record.
- other ``4xx``: :class:`SidecarProtocolError`, also "unavailable": a wrong path or an unknown
  version is a deployment mistake, and must not send every record to the dead-letter topic.
- ``413``: the batch is split in halves; one record still refused is an error of that record.

Batches larger than ``max_batch_records`` go out as several requests; when one of them fails
the batch, the answers already received are kept for the engine's retry (one call only).
"""

from __future__ import annotations

import email.utils
import http.client
import json
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from offtake.config.spec import ContainerSpec
from offtake.processing.base import Outcome, Processor, ProcessorUnavailable
from offtake.processing.sidecar_wire import (
    FORMATS,
    SidecarRecordError,
    outcome_of,
    record_id,
    record_to_wire,
)
from offtake.records import Record

log = logging.getLogger("offtake.sidecar")

PROTOCOL_VERSION = 1
PROTOCOL_HEADER = "Offtake-Protocol"
HEALTH_PATH = "/healthz"
# A container's Retry-After is honoured up to this many seconds: a misconfigured "come back
# tomorrow" must not park a pipeline for a day without anyone noticing.
MAX_RETRY_AFTER = 60.0
# How much of an unexpected response body goes into error messages and logs.
BODY_EXCERPT = 300


class SidecarUnavailable(ProcessorUnavailable):
    """The sidecar did not take the batch; retry all of it, after ``retry_after`` if given."""

    def __init__(
        self, message: str, *, status: int | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        # Seconds the container asked the worker to wait (Retry-After), capped; None if unsaid.
        self.retry_after = retry_after


class SidecarBusy(SidecarUnavailable):
    """The sidecar answered 429 or 503: it is busy or not ready yet."""


class SidecarProtocolError(SidecarUnavailable):
    """The sidecar and the worker disagree on the protocol (4xx, version mismatch)."""


@dataclass(slots=True)
class SidecarStats:
    """Counters for logs and metrics, updated by the calling threads without a lock: with
    processor.concurrency above 1 two increments at once may count as one (logs and metrics
    only; no decision reads them)."""

    requests: int = 0
    records: int = 0
    record_errors: int = 0
    malformed_responses: int = 0
    unavailable: int = 0
    busy: int = 0  # 429 or 503 answers
    protocol_errors: int = 0
    reconnects: int = 0
    reused_results: int = 0  # answers kept from a batch that failed part-way, not sent again


def parse_retry_after(header: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date), capped."""
    if header is None or not header.strip():
        return None
    text = header.strip()
    try:
        seconds = float(text)  # RFC 9110 says an integer; a fraction is harmless to accept
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if seconds != seconds:  # NaN
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER)


def _excerpt(body: bytes) -> str:
    text = body[:BODY_EXCERPT].decode("utf-8", "replace").strip()
    return text + ("..." if len(body) > BODY_EXCERPT else "") if text else "(empty body)"


class SidecarProcessor(Processor):
    """Sends batches to the user's container and turns its answers into outcomes.

    Thread-safe: each calling thread has its own keep-alive connection (processor.concurrency
    sends up to that many batches at once from as many threads); the answers carried over from
    a call that failed part-way and the counters are shared under a lock.
    """

    def __init__(self, spec: ContainerSpec, format: str, host: str = "127.0.0.1") -> None:
        if format not in FORMATS:
            raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
        if spec.max_batch_records < 1:
            raise ValueError("max_batch_records must be at least 1")
        self.spec = spec
        self.format = format
        self.host = host
        self.port = spec.port
        self.path = spec.path if spec.path.startswith("/") else "/" + spec.path
        self.timeout = spec.timeout_seconds
        self.max_batch = spec.max_batch_records
        self.stats = SidecarStats()
        self._lock = threading.Lock()
        self._local = threading.local()  # .conn: this thread's connection
        self._conns: list[http.client.HTTPConnection] = []  # every thread's, to close (_lock)
        self._carried: dict[str, Outcome] = {}
        # Why the last wait_ready returned False, for the caller's error message.
        self.not_ready_reason: str | None = None
        self._headers = {
            "Content-Type": "application/json",
            "Accept": "application/json",
            PROTOCOL_HEADER: str(PROTOCOL_VERSION),
        }

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def __repr__(self) -> str:
        return f"SidecarProcessor(http://{self.address}{self.path}, format={self.format})"

    # -- processing --------------------------------------------------------------------------

    def process(self, records: Sequence[Record]) -> list[Outcome]:
        outcomes: list[Outcome | None] = [None] * len(records)
        with self._lock:
            # Answers kept from the previous call, which failed part-way (see below). With
            # processor.concurrency another thread's call may take them first: its records are
            # then sent again, which costs a request, never a wrong answer (keyed by record).
            carried, self._carried = self._carried, {}
        # Encode each record on its own: one that cannot become JSON fails alone, and the
        # encoded text is reused if the batch has to be split.
        encoded: list[tuple[int, str, bytes]] = []
        for i, record in enumerate(records):
            rid = record_id(record)
            if rid in carried:
                outcomes[i] = carried[rid]
                self.stats.reused_results += 1
                continue
            try:
                text = json.dumps(
                    record_to_wire(record, self.format),
                    ensure_ascii=False,
                    allow_nan=False,
                    separators=(",", ":"),
                )
            except (TypeError, ValueError) as exc:
                err = SidecarRecordError(
                    rid, "EncodeError", f"cannot send the record to the sidecar as JSON: {exc}"
                )
                outcomes[i] = Outcome([], err, retriable=False)
                continue
            encoded.append((i, rid, text.encode("utf-8")))
        try:
            for start in range(0, len(encoded), self.max_batch):
                for i, outcome in self._send(encoded[start : start + self.max_batch]):
                    outcomes[i] = outcome
        except ProcessorUnavailable:
            # The engine retries the whole batch. Keep what the sidecar already answered
            # for that retry: sending those chunks again would make a sidecar that takes
            # part of each batch and then pushes back (429) redo the same first chunks
            # forever. Kept for one call only, so memory stays bounded by one batch.
            kept = {record_id(records[i]): o for i, o in enumerate(outcomes) if o is not None}
            with self._lock:
                self._carried = kept
            raise
        done = [o for o in outcomes if o is not None]
        assert len(done) == len(records)
        return done

    def _send(self, chunk: list[tuple[int, str, bytes]]) -> Iterator[tuple[int, Outcome]]:
        """Outcomes of one request's records (index, outcome); splits on 413."""
        body = b"".join(
            [
                b'{"version":',
                str(PROTOCOL_VERSION).encode(),
                b',"format":"',
                self.format.encode(),
                b'","records":[',
                b",".join(e for _, _, e in chunk),
                b"]}",
            ]
        )
        status, headers, data = self._post(body, len(chunk))
        if status == 413:
            if len(chunk) > 1:
                half = len(chunk) // 2
                log.info(
                    "sidecar at %s refused %d records as too large; splitting",
                    self.address,
                    len(chunk),
                )
                yield from self._send(chunk[:half])
                yield from self._send(chunk[half:])
                return
            i, rid, _ = chunk[0]
            self.stats.record_errors += 1
            err = SidecarRecordError(
                rid,
                "PayloadTooLarge",
                f"the sidecar refused the record as too large (413): {_excerpt(data)}",
            )
            yield i, Outcome([], err, retriable=False)
            return
        self._check_status(status, headers, data, len(chunk))
        yield from self._results(chunk, data)

    def _check_status(
        self, status: int, headers: http.client.HTTPMessage, data: bytes, n: int
    ) -> None:
        version = headers.get(PROTOCOL_HEADER)
        if version is not None and version.strip() != str(PROTOCOL_VERSION):
            self.stats.protocol_errors += 1
            raise SidecarProtocolError(
                f"sidecar at {self.address} answered with {PROTOCOL_HEADER}: {version.strip()}; "
                f"this worker speaks version {PROTOCOL_VERSION}",
                status=status,
            )
        if status == 200:
            return
        retry_after = parse_retry_after(headers.get("Retry-After"))
        if status in (429, 503):
            self.stats.busy += 1
            wait = f"; retry after {retry_after:g}s" if retry_after is not None else ""
            raise SidecarBusy(
                f"sidecar at {self.address} is busy ({status}){wait}; {n} record(s) will be "
                f"sent again",
                status=status,
                retry_after=retry_after,
            )
        if status >= 500:
            self.stats.unavailable += 1
            raise SidecarUnavailable(
                f"sidecar at {self.address} failed the request ({status}): {_excerpt(data)}",
                status=status,
                retry_after=retry_after,
            )
        self.stats.protocol_errors += 1
        hint = " (is spec.processor.container.path right?)" if status in (404, 405) else ""
        raise SidecarProtocolError(
            f"sidecar at {self.address} rejected the request to {self.path} ({status}){hint}: "
            f"{_excerpt(data)}",
            status=status,
            retry_after=retry_after,
        )

    def _results(
        self, chunk: list[tuple[int, str, bytes]], data: bytes
    ) -> Iterator[tuple[int, Outcome]]:
        """Match a 200 answer's results to the chunk's records by id."""
        problem = None
        results: Any = None
        try:
            answer = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            problem = f"the body is not JSON ({exc}): {_excerpt(data)}"
        else:
            results = answer.get("results") if isinstance(answer, dict) else None
            if not isinstance(results, list):
                problem = f'the body has no "results" list: {_excerpt(data)}'
        if problem is not None or not isinstance(results, list):
            self.stats.malformed_responses += 1
            self.stats.record_errors += len(chunk)
            log.warning(
                "sidecar at %s answered %d record(s) with a malformed response: %s",
                self.address,
                len(chunk),
                problem,
            )
            for i, rid, _ in chunk:
                err = SidecarRecordError(
                    rid,
                    "MalformedResponse",
                    f"sidecar at {self.address} answered with a malformed response: {problem}",
                )
                yield i, Outcome([], err)
            return

        wanted: dict[str, list[int]] = {}
        for i, rid, _ in chunk:
            wanted.setdefault(rid, []).append(i)  # an id twice in a batch gets one result
        by_id: dict[str, list[Any]] = {}
        strays: list[str] = []
        for item in results:
            item_id = item.get("id") if isinstance(item, dict) else None
            if isinstance(item_id, str) and item_id in wanted:
                by_id.setdefault(item_id, []).append(item)
            else:
                strays.append(repr(item_id) if isinstance(item, dict) else repr(item)[:60])
        if strays:
            log.warning(
                "sidecar at %s returned %d result(s) for no record of the batch: %s",
                self.address,
                len(strays),
                ", ".join(strays[:5]),
            )
        for rid, indices in wanted.items():
            outcome = outcome_of(rid, by_id.get(rid, []), self.address)
            if outcome.error is not None:
                self.stats.record_errors += len(indices)
            for i in indices:
                yield i, outcome

    # -- transport ---------------------------------------------------------------------------

    def _connection(self) -> tuple[http.client.HTTPConnection, bool]:
        """This thread's keep-alive connection, and whether it was used before (may have gone
        stale)."""
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is not None:
            return conn, True
        conn = self._local.conn = http.client.HTTPConnection(
            self.host, self.port, timeout=self.timeout
        )
        with self._lock:
            self._conns.append(conn)
        return conn, False

    def _drop_connection(self) -> None:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
            with self._lock:
                self._conns.remove(conn)

    def _post(self, body: bytes, n: int) -> tuple[int, http.client.HTTPMessage, bytes]:
        self.stats.requests += 1
        self.stats.records += n
        while True:
            conn, reused = self._connection()
            try:
                conn.request("POST", self.path, body=body, headers=self._headers)
                response = conn.getresponse()
                data = response.read()
            except (
                http.client.RemoteDisconnected,
                BrokenPipeError,
                ConnectionResetError,
                ConnectionAbortedError,
            ) as exc:
                self._drop_connection()
                if reused:
                    # The container closed the idle keep-alive connection before it saw this
                    # request (an idle timeout, a restart): send it once more on a new one.
                    self.stats.reconnects += 1
                    continue
                raise self._unavailable(
                    f"closed the connection before answering ({exc})", n
                ) from None
            except TimeoutError:
                # Close, so that a late answer to this batch cannot be read as the next one's.
                self._drop_connection()
                raise self._unavailable(
                    f"did not answer within {self.timeout:g}s (timeoutSeconds)", n
                ) from None
            except ConnectionRefusedError:
                self._drop_connection()
                raise self._unavailable(
                    f"refused the connection (is the container running and listening on port "
                    f"{self.port}?)",
                    n,
                ) from None
            except (OSError, http.client.HTTPException) as exc:
                self._drop_connection()
                raise self._unavailable(f"failed: {type(exc).__name__}: {exc}", n) from None
            if response.will_close:
                self._drop_connection()
            return response.status, response.headers, data

    def _unavailable(self, what: str, n: int) -> SidecarUnavailable:
        self.stats.unavailable += 1
        return SidecarUnavailable(
            f"sidecar at {self.address} {what}; {n} record(s) will be sent again"
        )

    # -- health ------------------------------------------------------------------------------

    def probe(self) -> str | None:
        """One health check: None when ``GET /healthz`` answers 200, else why not."""
        return self._probe()[0]

    def _probe(self) -> tuple[str | None, bool]:
        """(why the sidecar is not ready, or None; whether waiting longer can help)."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=min(self.timeout, 5.0))
        try:
            conn.request("GET", HEALTH_PATH, headers={PROTOCOL_HEADER: str(PROTOCOL_VERSION)})
            response = conn.getresponse()
            data = response.read()
        except ConnectionRefusedError:
            return "connection refused", True
        except TimeoutError:
            return f"{HEALTH_PATH} did not answer in time", True
        except (OSError, http.client.HTTPException) as exc:
            return f"{type(exc).__name__}: {exc}", True
        finally:
            conn.close()
        if response.status != 200:
            return f"{HEALTH_PATH} answered {response.status}: {_excerpt(data)}", True
        try:
            health = json.loads(data) if data.strip() else None
        except (UnicodeDecodeError, json.JSONDecodeError):
            health = None  # any body is fine; only a "protocols" list means something
        protocols = health.get("protocols") if isinstance(health, dict) else None
        if isinstance(protocols, list) and PROTOCOL_VERSION not in protocols:
            # A container of another protocol version: waiting would not help.
            spoken = ", ".join(map(str, protocols)) or "none"
            return (
                f"it speaks protocol version(s) {spoken}; this worker speaks version "
                f"{PROTOCOL_VERSION} (see docs/sidecar-protocol.md)",
                False,
            )
        return None, True

    def wait_ready(self, timeout: float, abort: threading.Event | None = None) -> bool:
        """Poll ``/healthz`` until it answers 200; True once it does.

        False when ``abort`` is set, when ``timeout`` seconds pass, or at once when the
        container advertises protocol versions without this one. The reason is logged and
        kept in :attr:`not_ready_reason`, so the caller can exit with a clear message rather
        than handle exceptions of start-up.
        """
        abort = abort or threading.Event()
        deadline = time.monotonic() + timeout
        delay = 0.05
        self.not_ready_reason = None
        while True:
            why, worth_waiting = self._probe()
            if why is None:
                log.info("sidecar at %s is ready", self.address)
                return True
            remaining = deadline - time.monotonic()
            if not worth_waiting or remaining <= 0:
                after = "" if not worth_waiting else f" after {timeout:g}s"
                self.not_ready_reason = f"sidecar at {self.address} not ready{after}: {why}"
                log.error("%s", self.not_ready_reason)
                return False
            if abort.wait(min(delay, remaining)):
                self.not_ready_reason = f"sidecar at {self.address}: stopped waiting ({why})"
                return False
            delay = min(delay * 2, 1.0)  # quick while it starts, gentle if it takes long

    def close(self) -> None:
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            conn.close()
