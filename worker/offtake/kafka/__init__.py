"""Kafka client seams: the protocols the engine needs, and the real and in-memory clients."""
