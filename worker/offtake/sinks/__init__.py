"""Sinks: where processed records go (kafka, log, spark). See base.py for the contract."""
