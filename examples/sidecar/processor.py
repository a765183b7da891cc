#!/usr/bin/env python3
"""A reference Offtake sidecar processor: the protocol of docs/sidecar-protocol.md, stdlib only.

Run it with ``python processor.py --port 8080``; it needs nothing from Offtake. What it does
with each record depends on the pipeline's source.format (the request's "format"):

- json: enriches objects. ``name`` is upper-cased and ``"processedBy": "example-sidecar"`` is
  added; ``"drop": true`` drops the record; ``"split": [...]`` sends one value per item;
  ``"poison": true`` fails the record with a non-retriable ``PoisonRecord`` error (its
  neighbours in the batch are processed as usual). Other JSON values pass through unchanged.
- string: upper-cases the text; the text ``poison`` fails.
- bytes: sends the exact bytes back (``valuesBase64``); a value starting with ``poison`` fails.

``--mode echo`` answers every record with the record itself as the worker sent it: handy to
see exactly what your own processor will receive. ``--delay`` adds a pause to every batch, to
watch the worker's backpressure at work.
"""

from __future__ import annotations

import argparse
import base64
import json
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PROTOCOL_VERSION = 1


class PoisonRecord(Exception):
    """The record says it must fail; the worker's error policy takes it from here."""


def enrich(record: dict[str, Any], fmt: str) -> dict[str, Any]:
    """The result for one record: values to send on, or an error."""
    if fmt == "bytes":
        raw = base64.b64decode(record["valueBase64"]) if record["valueBase64"] is not None else b""
        if raw.startswith(b"poison"):
            raise PoisonRecord("value starts with 'poison'")
        return {"valuesBase64": [record["valueBase64"]]}
    value = record.get("value")
    if fmt == "string":
        if value == "poison":
            raise PoisonRecord("value is 'poison'")
        return {"values": [value.upper() if isinstance(value, str) else value]}
    if not isinstance(value, dict):
        return {"values": [value]}
    if value.get("poison") is True:
        raise PoisonRecord('the record has "poison": true')
    if value.get("drop") is True:
        return {"values": []}
    out = dict(value)
    if isinstance(out.get("name"), str):
        out["name"] = out["name"].upper()
    out["processedBy"] = "example-sidecar"
    split = out.pop("split", None)
    if isinstance(split, list):
        return {"values": [{**out, "part": part} for part in split]}
    return {"values": [out]}


def echo(record: dict[str, Any], fmt: str) -> dict[str, Any]:
    return {"values": [record]}


class Handler(BaseHTTPRequestHandler):
    # HTTP/1.1 keeps the worker's connection open between batches.
    protocol_version = "HTTP/1.1"
    # Headers and body go out in one segment (the buffer is flushed after each request), and
    # no Nagle delay: otherwise every batch can wait ~40 ms for a delayed ACK.
    wbufsize = 1 << 16
    disable_nagle_algorithm = True
    server: Server

    def do_GET(self) -> None:
        if self.path == "/healthz":
            self.reply(200, {"status": "ok", "protocols": [PROTOCOL_VERSION]})
        else:
            self.reply(404, {"error": {"type": "NotFound", "message": self.path}})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        if self.path != self.server.process_path:
            wanted = f"POST {self.server.process_path}"
            self.reply(404, {"error": {"type": "NotFound", "message": wanted}})
            return
        try:
            batch = json.loads(body)
            version = batch.get("version")
            records = batch["records"]
            fmt = batch.get("format", "json")
        except (ValueError, KeyError, AttributeError, TypeError) as exc:
            self.reply(400, {"error": {"type": "BadRequest", "message": str(exc)}})
            return
        if version != PROTOCOL_VERSION:
            self.reply(
                400,
                {
                    "error": {
                        "type": "UnsupportedVersion",
                        "message": f"this processor speaks version {PROTOCOL_VERSION}, "
                        f"got {version!r}",
                        "supported": [PROTOCOL_VERSION],
                    }
                },
            )
            return
        with self.server.idle:
            self.server.busy += 1
        try:
            self.reply(200, {"results": self.process_batch(records, fmt)})
        finally:
            with self.server.idle:
                self.server.busy -= 1
                self.server.idle.notify_all()

    def process_batch(self, records: list[dict[str, Any]], fmt: str) -> list[dict[str, Any]]:
        if self.server.delay:
            time.sleep(self.server.delay)
        results = []
        for record in records:
            try:
                result = self.server.process_record(record, fmt)
            except PoisonRecord as exc:
                result = {
                    "error": {"type": "PoisonRecord", "message": str(exc)},
                    "retriable": False,
                }
            except Exception as exc:  # a bug here fails this record only, and may pass on retry
                result = {
                    "error": {"type": type(exc).__name__, "message": str(exc)},
                    "retriable": True,
                }
            results.append({"id": record["id"], **result})
        return results

    def reply(self, status: int, payload: Any) -> None:
        data = json.dumps(payload, separators=(",", ":")).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Offtake-Protocol", str(PROTOCOL_VERSION))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.verbose:
            super().log_message(format, *args)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self, address: tuple[str, int], path: str, mode: str, delay: float, verbose: bool
    ) -> None:
        super().__init__(address, Handler)
        self.process_path = path
        self.process_record = echo if mode == "echo" else enrich
        self.delay = delay
        self.verbose = verbose
        self.busy = 0  # batches being processed, so that a stop can let them finish
        self.idle = threading.Condition()

    def wait_idle(self, timeout: float) -> None:
        with self.idle:
            self.idle.wait_for(lambda: self.busy == 0, timeout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8080, help="0 picks a free port")
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="0.0.0.0 in a pod, so that the kubelet's probes reach /healthz",
    )
    parser.add_argument("--path", default="/v1/process")
    parser.add_argument("--mode", choices=("enrich", "echo"), default="enrich")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds to sleep per batch")
    parser.add_argument("--verbose", action="store_true", help="log every request")
    args = parser.parse_args(argv)

    server = Server((args.host, args.port), args.path, args.mode, args.delay, args.verbose)
    # SIGTERM: finish the request in hand, then exit (the worker has drained by the time a
    # native sidecar gets it).
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(
        f"offtake example sidecar listening on {args.host}:{server.server_port} "
        f"(POST {args.path}, mode {args.mode})",
        flush=True,
    )
    try:
        server.serve_forever(poll_interval=0.1)
    except KeyboardInterrupt:
        pass
    finally:
        server.wait_idle(timeout=30.0)
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
