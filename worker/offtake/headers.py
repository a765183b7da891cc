"""The names of the Kafka headers Offtake writes: one place for each.

They are part of the contract with users' DLQ tooling (docs/worker.md, dead letters) and with
the operator's `kubectl offtake dlq` (through offtake.contract). A leaf: the engine writes them,
the decoders, the redrive and the operator read them.
"""

from __future__ import annotations

#: Offtake's own headers all start with this.
OFFTAKE_PREFIX = "offtake."

# A dead letter's (and a retry record's) origin and what went wrong.
H_TOPIC = "offtake.original.topic"
H_PARTITION = "offtake.original.partition"
H_OFFSET = "offtake.original.offset"
H_TIMESTAMP = "offtake.original.timestamp"
H_ERROR_CLASS = "offtake.error.class"
H_ERROR_MESSAGE = "offtake.error.message"
H_ATTEMPTS = "offtake.attempts"
H_STAGE = "offtake.error.stage"
# A schema decode error's (offtake.formats.errors.SchemaDecodeError): the schema id and the reason.
H_SCHEMA_ID = "offtake.schema.id"
H_REASON = "offtake.error.reason"

H_RETRY_DUE = "offtake.retry.due"  # on retry topics: when to process it, ms since the epoch
H_RETRY_TOPIC = "offtake.retry.topic"  # on retry topics: the retry topic it was sent to

#: Set by ``offtake redrive`` on the records it replays into a source topic; a replayed record
#: that fails again keeps them (the redrive recognises its own records by them).
REDRIVE_PREFIX = "offtake.redrive."
H_REDRIVE_ID = "offtake.redrive.id"
H_REDRIVE_SOURCE = "offtake.redrive.source"

#: A producer's own ``offtake.*`` headers, moved aside on a dead letter or retry record:
#: ``offtake.original.topic`` becomes ``producer.offtake.original.topic``. Kept, never read.
PRODUCER_PREFIX = "producer."
