"""Value formats: how a consumed value's bytes become a Python value (a :class:`Decoder`) and
how a processed value becomes bytes on the wire (an :class:`Encoder`), one of each per
pipeline, chosen once from ``spec.source.format`` / ``spec.sink.kafka.format``
(:mod:`offtake.formats.resolve`), each with a batch path.

- ``errors``: what can go wrong, and the dead-letter headers that say so (the leaf);
- ``base``: the two contracts and the batch decode loop every format shares;
- ``plain``: json, string, bytes;
- ``wire``: the schema registry wire format (magic byte, schema id, protobuf message index)
  and the per-schema-id cache of readers the schema'd formats share;
- ``avro``, ``protobuf``, ``jsonschema``: the schema'd formats' fast paths;
- ``sink_schema``: which schema (and id) the Kafka sink encodes with, resolved at start.
"""
