"""What can go wrong turning bytes into values and back, told apart because the error policy
treats each differently (the leaf every format module imports; it imports none of them):

- :class:`DecodeError`: the record's value is not valid for its format: the record's fault,
  so it goes to the error policy; :class:`SchemaDecodeError` adds the schema id and the reason
  in one word, written as dead-letter headers (docs/worker.md, "Formats");
- :class:`RegistryUnavailable`: the schema registry did not answer: not the record's fault,
  the caller waits and retries (never a dead letter);
- :class:`UnsendableValueError`: a processed value has no faithful wire form;
- :class:`OutOfBounds`: a value claims more than its bytes can hold: the record's fault,
  refused before any library spends time or memory on the claim;
- :class:`NotFast`: not an error of the value's: a fast path's closures hand the value (or the
  schema) to the format's library, whose answer is the answer.
"""

from __future__ import annotations

from offtake.errors import OfftakeError

# Dead-letter headers: which schema id, and why in one word (names: offtake.headers).
from offtake.headers import H_REASON, H_SCHEMA_ID

NOT_WIRE_FORMAT = "not-wire-format"
UNKNOWN_SCHEMA = "unknown-schema-id"
SCHEMA_MISMATCH = "schema-mismatch"
OUT_OF_BOUNDS = "out-of-bounds"
#: The registry answered 401/403 for this schema id while it answers the subject listing:
#: the id is not readable with the pipeline's credentials (another team's, say).
SCHEMA_REFUSED = "schema-id-refused"


class DecodeError(OfftakeError, ValueError):
    """A record's value is not valid for ``source.format``; names the record."""


class SchemaDecodeError(DecodeError):
    """The record's value cannot be decoded with a registered schema; names id and reason."""

    def __init__(self, message: str, schema_id: int | None, reason: str) -> None:
        super().__init__(message)
        self.schema_id = schema_id
        self.reason = reason

    @property
    def headers(self) -> dict[str, str]:
        """Extra dead-letter headers."""
        return {
            H_SCHEMA_ID: "" if self.schema_id is None else str(self.schema_id),
            H_REASON: self.reason,
        }


class RegistryUnavailable(OfftakeError):
    """The schema registry did not answer (or answered 5xx/429): retry later, not the record's
    fault."""


class UnsendableValueError(OfftakeError, TypeError):
    """A processor returned a value that has no faithful wire form (the error names its type)."""


class NotFast(OfftakeError):
    """Not for the closures built per schema (avro_fast, protobuf_fast): the format's library
    (fastavro, json_format) reads or writes this value, or every value of this schema."""


class OutOfBounds(OfftakeError, ValueError):
    """A value claims more than the decoders' bounds let one value hold (an array of
    zero-width items past its budget, a message index past its bytes or its schema): the
    record's decode error (reason :data:`OUT_OF_BOUNDS`), never handed to the format's library,
    which would spend memory or time in proportion to the claim."""
