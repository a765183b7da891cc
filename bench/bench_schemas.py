"""The schemas of bench/passthrough.py's schema'd workloads (avro, protobuf, jsonschema),
written once and imported by every contender (Offtake's worker, the loop, Quix Streams).

Input records are the bench's JSON records (id, customer, amount, pad) in the format; the
output is what ``bench_workloads.enrich`` makes of them (two fields more). The protobuf classes
are built from their descriptors at import time (no protoc), with the protobuf runtime of
whichever environment imports this file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

# The record schemas' one definition is the test suite's (tests/support/record_schemas.py, the
# standard library only): found from here in every environment that imports this file.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.record_schemas import FlatRecord, flat_messages

BENCH_ORDER = FlatRecord(
    "BenchOrder",
    "offtake.bench",
    (("id", "long"), ("customer", "string"), ("amount", "double"), ("pad", "string")),
)
BENCH_ORDER_OUT = BENCH_ORDER.extended(
    "BenchOrderOut", ("amount_cents", "long"), ("large", "boolean")
)
SCHEMAS = {
    "avro": (json.dumps(BENCH_ORDER.avro()), json.dumps(BENCH_ORDER_OUT.avro())),
    "jsonschema": (
        json.dumps(BENCH_ORDER.json_schema()),
        json.dumps(BENCH_ORDER_OUT.json_schema()),
    ),
}
PROTOBUF_IN = "bench_schemas:BenchOrder"
PROTOBUF_OUT = "bench_schemas:BenchOrderOut"


def __getattr__(name: str) -> Any:
    # The classes are made on first use: environments without protobuf import this module too.
    if name in ("BenchOrder", "BenchOrderOut"):
        order, out = flat_messages("offtake_bench.proto", BENCH_ORDER, BENCH_ORDER_OUT)
        globals().update(BenchOrder=order, BenchOrderOut=out)
        return globals()[name]
    raise AttributeError(name)
