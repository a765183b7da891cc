"""The engine: poll loop, offset tracking, backpressure, rebalance and shutdown."""
