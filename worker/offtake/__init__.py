"""Offtake: Kafka consumer pipelines done right."""
